"""The lean decoding loop (issue 27): the same tokens as `generate` for the same seed and settings, on every
architecture, and log-probs equal to a forward pass."""

import pytest
import torch

from rlhf_toy.lm.models.base import load_base
from rlhf_toy.lm.models.causal_lm import response_logprobs
from rlhf_toy.lm.models.chat import encode_prompts, pad_sequences
from rlhf_toy.lm.models.lora import LoraConfig, add_lora
from rlhf_toy.lm.models.sampling import lean_decoding, sample
from tests.hf_models import ARCHS, tiny_model_dir

PROMPTS = ["My printer won't start.", "Hi, my old lamp at home runs hot.", "Why?", "The router at home is slow."] * 3
# Twelve different prompts: no row shares its prefill, so the loop's arithmetic is generate's, bit for bit.
UNIQUE = [f"{p} ({i})" for i, p in enumerate(PROMPTS)]


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("bases")
    return {arch: tiny_model_dir(arch, root / arch) for arch in ARCHS}


def both(model, tok, temperature=0.7, **kw):
    """The same draw through our loop and through `generate`."""
    out = []
    for lean in (True, False):
        torch.manual_seed(11)
        out.append(sample(model, tok, UNIQUE, 12, temperature, lean=lean, with_logprobs=True, **kw))
    return out


@pytest.mark.integration
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("settings", [{}, {"stop_at_eos": False}, {"greedy": True}, {"temperature": 1.0}])
def test_lean_decoding_draws_what_generate_draws(bases, arch, settings):
    model, tok = load_base(bases[arch])
    assert lean_decoding(model) is not None  # every supported architecture takes the lean path
    lean, gen = both(model, tok, **settings)
    assert torch.equal(lean.response_ids, gen.response_ids) and lean.texts == gen.texts
    assert torch.equal(lean.eos, gen.eos)
    torch.testing.assert_close(lean.logprobs, gen.logprobs, rtol=0, atol=0)
    with torch.no_grad():
        again, _ = response_logprobs(model, lean.prompt_ids, lean.prompt_mask, lean.response_ids, 0.7)
    real = lean.response_mask.bool()
    if not settings.get("greedy") and "temperature" not in settings:
        torch.testing.assert_close(again[real], lean.logprobs[real], atol=1e-4, rtol=1e-4)


@pytest.mark.integration
def test_lean_decoding_drives_a_lora_model(bases):
    model, tok = load_base(bases["llama"])
    lora = add_lora(model, LoraConfig(lora_r=4), "CAUSAL_LM")
    assert lean_decoding(lora) is not None
    lean, gen = both(lora, tok)
    assert torch.equal(lean.response_ids, gen.response_ids)


@pytest.mark.integration
@pytest.mark.parametrize("arch", ARCHS)
def test_values_from_the_sampled_hidden_states_equal_a_forward_pass(bases, arch):
    """PPO's critic reads the hidden states the lean loop kept: the same values as the forward pass it replaces."""
    from rlhf_toy.lm.models.policy import PolicyWithValueHead

    model, tok = load_base(bases[arch])
    policy = PolicyWithValueHead(model, 0.7)
    torch.manual_seed(0)
    torch.nn.init.normal_(policy.value_head[2].weight)  # the head starts at zero: give it something to say
    s = sample(model, tok, PROMPTS, 12, 0.7, with_logprobs=True, with_hidden=True)
    with torch.no_grad():
        logprobs, _, values = policy.evaluate((s.prompt_ids, s.prompt_mask), s.response_ids)
        mine = policy.value_head(s.hidden).squeeze(-1)
    real = s.response_mask.bool()
    torch.testing.assert_close(mine[real], values[real], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s.logprobs[real], logprobs[real], atol=1e-4, rtol=1e-4)


@pytest.mark.integration
@pytest.mark.parametrize("arch", ARCHS)
def test_a_group_shares_its_prompts_prefill(bases, arch):
    """RLOO's and GRPO's k replies share a prompt: its prefill runs once (the model sees 3 rows, not 12), and the
    draws are still `generate`'s. The prefill of 3 rows may round a logit differently in the last bit than one of
    12 (seen: 4.8e-7 in a first step's log-prob), so the log-probs match to 1e-6, the tokens exactly."""
    model, tok = load_base(bases[arch])
    grouped = [p for p in PROMPTS[:3] for _ in range(4)]
    rows: list[int] = []
    hook = model.register_forward_pre_hook(lambda _m, _a, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True)
    try:
        torch.manual_seed(3)
        lean = sample(model, tok, grouped, 12, 0.7, lean=True, with_logprobs=True, with_hidden=True)
    finally:
        hook.remove()
    assert rows[0] == 3 and set(rows[1:]) == {12}
    torch.manual_seed(3)
    gen = sample(model, tok, grouped, 12, 0.7, lean=False, with_logprobs=True)
    assert torch.equal(lean.response_ids, gen.response_ids)
    torch.testing.assert_close(lean.logprobs, gen.logprobs, rtol=0, atol=1e-6)
    assert lean.hidden is not None and lean.hidden.shape[:2] == lean.response_ids.shape


@pytest.mark.integration
@pytest.mark.parametrize("arch", ARCHS)
def test_the_preallocated_cache_gives_the_growing_caches_numbers(bases, arch, monkeypatch):
    """The cache written in place (`kv_cache`) against transformers' `DynamicCache`, which re-copies itself every
    token: the same tokens, logits and hidden states, bit for bit, with grouped prompts (the shared prefill
    reorders the cache's rows) and with a capacity too small (the layer grows)."""
    from transformers import DynamicCache

    from rlhf_toy.lm.models import kv_cache, sampling

    model, tok = load_base(bases[arch])
    grouped = [p for p in PROMPTS[:3] for _ in range(4)]
    ids, mask = pad_sequences(encode_prompts(tok, grouped), tok.pad_token_id, "left")
    if kv_cache.DynamicLayer is not None:
        layers = kv_cache.decoding_cache(model.config, 8, kv_cache.PREALLOCATE_FROM).layers
        assert all(isinstance(layer, kv_cache.PreallocatedLayer) for layer in layers)
        short = kv_cache.decoding_cache(model.config, 8, kv_cache.PREALLOCATE_FROM - 1).layers
        assert not any(isinstance(layer, kv_cache.PreallocatedLayer) for layer in short)

    def draw(make_cache):
        monkeypatch.setattr(sampling, "decoding_cache", make_cache)
        torch.manual_seed(5)
        return sampling.decode(model, ids, mask, 12, 0.7, False, None, tok.pad_token_id, with_hidden=True)

    grown = draw(lambda config, prompt, new: DynamicCache(config=config))
    for capacity in (None, 3):  # None: prompt + reply, as decode asks; 3: fewer positions than the prompt
        mine = draw(lambda config, prompt, new, cap=capacity: kv_cache.preallocated_cache(config, cap or prompt + new))
        assert torch.equal(mine[0], grown[0])
        assert all(torch.equal(a, b) for a, b in zip(mine[1], grown[1]))
        assert torch.equal(mine[2], grown[2])
