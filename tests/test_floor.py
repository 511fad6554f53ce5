"""The compute floor of an RLHF step (issue 27): FLOPs counted from a model's weights, checked against torch's own
FLOP counter and a hand computation, and the floor table the benchmark prints."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from scripts.benchlib.floor import Weights, floors, pass_flops, phase_flops, weights


def gpt2():
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=64, attn_implementation="eager")
    return GPT2LMHeadModel(cfg).eval()


def llama():
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=100, attn_implementation="eager")  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def test_weights_are_counted_by_hand_for_gpt2():
    w = weights(gpt2())
    assert w.trunk == 2 * (64 * 192 + 64 * 64 + 64 * 256 + 256 * 64) and w.head == 64 * 100
    assert (w.n_layer, w.width) == (2, 64)


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_a_forward_pass_costs_what_torchs_flop_counter_counts(make):
    model = make()
    ids = torch.randint(0, 100, (3, 20))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(ids)  # logits at all 20 positions; eager attention computes all 20 x 20 scores
    w = weights(model)
    heads_dim = 4 * w.n_layer * w.width * 20 * 20  # QK^T and AV over every key, as the eager kernel does
    expected = 3 * (2 * w.trunk * 20 + 2 * w.head * 20 + heads_dim)
    assert counter.get_total_flops() == pytest.approx(expected, rel=1e-6)
    assert 3 * pass_flops(w, 20, 20, 20) == pytest.approx(expected, rel=1e-6)


def test_phase_flops_by_hand():
    w = Weights(trunk=100, head=10, n_layer=1, width=2, shapes=(((2, 50), 1),))
    # B=2, P=3, R=2: sampling = prefill (3 tokens, mean keys 2, 1 logit) + one decode step (keys 4, 1 logit)
    prefill = 2 * 100 * 3 + 2 * 10 * 1 + 4 * 1 * 2 * 3 * 2
    decode = 2 * 100 * 1 + 2 * 10 * 1 + 4 * 1 * 2 * 1 * 4
    # a forward pass: 5 tokens, mean keys 3, logits at the last R + 1 = 3 positions (a suffix)
    forward = 2 * 100 * 5 + 2 * 10 * 3 + 4 * 1 * 2 * 5 * 3
    f = phase_flops(w, w, batch=2, prompt=3, reply=2, epochs=4, critic=True)
    assert f["sample"] == 2 * (prefill + decode)
    assert f["reference_forward"] == f["policy_forward"] == 2 * forward
    assert f["update"] == 3 * 4 * 2 * forward
    # the reward model: its trunk on prompt + reply + EOS (6 tokens, mean keys 3.5), its head once a sequence
    assert f["reward"] == 2 * (2 * 100 * 6 + 4 * 1 * 2 * 6 * 3.5) + 2 * 2 * 10
    assert "policy_forward" not in phase_flops(w, None, 2, 3, 2, 4, critic=False)
    # a critic's value head (6 and 3 weights) on each of the 2 x 2 reply tokens, 4 epochs: 4 W1 + 6 W2 a token
    with_head = phase_flops(w, None, 2, 3, 2, 4, critic=True, value_head=(6, 3))
    assert with_head["update"] == f["update"] + 4 * 2 * 2 * (4 * 6 + 6 * 3)
    # a group of 2 replies shares its prompt's pass: the prompt part (its last logit) once, each reply's part (keys
    # 3 + 1, 3 + 2; its 2 logits) twice
    shared = phase_flops(w, None, batch=2, prompt=3, reply=2, epochs=1, critic=True, group=2)
    prompt_part = 2 * 100 * 3 + 2 * 10 * 1 + 4 * 1 * 2 * 3 * 2
    reply_part = 2 * 100 * 2 + 2 * 10 * 2 + 4 * 1 * 2 * 2 * 4.5
    assert shared["policy_forward"] == prompt_part + 2 * reply_part
    assert prompt_part + reply_part == forward  # one row: the same as the unshared pass
    # sampling prefills the shared prompt once too, then decodes every reply; so does the reward model (reply + EOS:
    # 3 tokens, keys 3 + 2 on average)
    with_rm = phase_flops(w, Weights(100, 0, 1, 2, ()), batch=2, prompt=3, reply=2, epochs=1, critic=False, group=2)
    assert with_rm["sample"] == prefill + 2 * decode
    assert with_rm["reward"] == 2 * 100 * 3 + 4 * 1 * 2 * 3 * 2 + 2 * (2 * 100 * 3 + 4 * 1 * 2 * 3 * 5)


def test_floors_measure_the_rate_and_the_distance():
    w = weights(gpt2())
    out = floors({"sample": 0.5, "update": 2.0}, w, None, 8, 12, 8, 2, 4, critic=False)
    assert set(out) == {"sample", "update"}
    for f in out.values():
        assert f["gflop_per_s_at_shapes"] > 0 and f["floor_s"] > 0
        assert f["distance"] == pytest.approx(f["seconds"] / f["floor_s"])


@pytest.mark.integration
def test_the_benchmark_reports_every_phase_against_its_floor():
    from scripts.benchlib.rlhf import ours

    r = ours(episodes=16, batch_size=8, response_length=8, n_layer=1, n_embd=32, threads=1)
    # PPO's values and log-probs come from sampling (the lean loop): no forward pass of the policy to time
    assert set(r["phases"]) == {"sample", "reward", "reference_forward", "update"}
    for f in r["phases"].values():
        assert f["seconds"] > 0 and f["gflops"] > 0 and f["distance"] > 0
    grpo = ours(episodes=32, batch_size=16, response_length=8, n_layer=1, n_embd=32, threads=1, algorithm="grpo")
    assert set(grpo["phases"]) == set(r["phases"])


def test_work_comparison_by_hand():
    from scripts.benchlib.rlhf import work_comparison

    # ours: 10 GFLOPs a step at 64 / 32 = 2 s; TRL: 20 GFLOPs at 64 / 8 = 8 s; the machine: 20 GFLOP/s
    w = work_comparison({"rlhf-toy": 10.0, "trl": 20.0}, {"rlhf-toy": 32.0, "trl": 8.0}, 64, 20.0)
    assert w["rlhf-toy"] == {"gflops_per_step": 10.0, "step_s": 2.0, "floor_s": 0.5, "distance": 4.0}
    assert w["trl"] == {"gflops_per_step": 20.0, "step_s": 8.0, "floor_s": 1.0, "distance": 8.0}
    # 4x as fast on half the work: our FLOPs run 2x as fast as TRL's; 3x would take 1.5x
    assert (w["work_ratio"], w["speed_ratio"], w["efficiency_ratio"]) == (2.0, 4.0, 2.0)
    assert w["efficiency_for_target"] == 1.5


def test_the_trl_runners_get_the_same_token_ids():
    """`same_job` hands the TRL runners this project's prompts and tokenizer: the runners' encoding of the prompts
    file (`tokenizer.encode`, no chat template) gives exactly the ids `ours` samples from."""
    import json

    from rlhf_toy.lm.models.chat import encode_prompts
    from scripts.benchlib.rlhf import bench_task, bench_tokenizer, same_job

    args = dict(zip(*[iter(same_job(None))] * 2))
    loaded = AutoTokenizer.from_pretrained(args["--tokenizer-dir"], padding_side="left")
    texts = json.loads(open(args["--prompts-file"]).read())
    prompts = bench_task().train_prompts
    assert len(texts) == len(prompts) and not getattr(loaded, "chat_template", None)
    ours = encode_prompts(bench_tokenizer(), prompts[:200])
    assert [loaded.encode(t) for t in texts[:200]] == ours
    assert loaded.pad_token_id != loaded.eos_token_id  # TRL's PPO needs them distinct
    # a pretrained model's runner keeps its own tokenizer and chat template: plain prompts, no tokenizer
    pretrained = same_job("some/model")
    assert "--tokenizer-dir" not in pretrained and json.loads(open(pretrained[1]).read()) == prompts


@pytest.mark.integration
@pytest.mark.parametrize("algorithm", ["ppo", "rloo", "grpo"])
def test_each_phase_of_a_real_step_costs_what_the_formula_counts(algorithm, monkeypatch):
    """Every phase of the benchmark's step, run under torch's FlopCounterMode, against `phase_flops` at the step's
    own shapes, to the FLOP (attention aside: the counter has no formula for the CPU's fused attention kernel)."""
    import contextlib
    from dataclasses import replace

    import scripts.benchlib.rlhf as bench
    from rlhf_toy.runtime import PhaseClock

    counted: dict[str, int] = {}
    timed = PhaseClock.__call__

    @contextlib.contextmanager
    def counting(self, phase):
        with timed(self, phase), FlopCounterMode(display=False) as counter:
            yield
        counted[phase] = counted.get(phase, 0) + counter.get_total_flops()

    shapes = {}

    def floors(times, policy, reward, *args):
        shapes["args"] = (policy, reward, *args)
        return {}

    monkeypatch.setattr(PhaseClock, "__call__", counting)
    monkeypatch.setattr(bench, "floors", floors)
    batch = 8 if algorithm == "ppo" else 16
    r = bench.ours(episodes=batch, batch_size=batch, response_length=8, n_layer=1, n_embd=32, threads=1,
                   algorithm=algorithm)  # fmt: skip
    policy, reward, batch_size, prompt, reply, epochs, _, critic, group, value_head = shapes["args"]
    no_attention = [replace(w, n_layer=0) for w in (policy, reward)]
    expected = phase_flops(*no_attention, batch_size, prompt, reply, epochs, critic, group, value_head)
    assert set(counted) == {"sample", "reward", "reference_forward", "update"}
    assert {p: expected[p] for p in counted} == counted
    assert (value_head != (0, 0)) == (algorithm == "ppo")  # only PPO's critic runs (and trains) its value head
    assert r["gflops_per_step"] is None
