"""Batched sampling: left-padded prompts, temperature T, top_k 0, top_p 1, stop at EOS.

The decoding loop is our own (`decode`), on a key-value cache allocated once and written in place for long replies
(`kv_cache`):
a forward pass over the distinct prompts (logits of the last position only; rows that share a prompt, as RLOO's and
GRPO's groups do, share its prefill), then one token at a time on the cache, softmax and `torch.multinomial` as
`generate` does them, so it draws the same tokens from the same seed (tests check on GPT-2, Llama, GPT-NeoX and
Qwen2: bit for bit where no prompt is shared; a shared prefill, run on fewer rows, may round a logit differently in
the last bit), without `generate`'s per-step logits processors, stopping criteria and bookkeeping. A model whose
forward does not take `position_ids`, `logits_to_keep` and a cache falls back to `generate` (`lean_decoding`).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
from torch import Tensor

from rlhf_toy.errors import note_once

from .causal_lm import distinct_prompts, token_logprobs
from .chat import encode_prompts, pad_sequences, widen
from .constrain import ReplyConstraint, mask_logits
from .devices import model_device
from .kv_cache import decoding_cache


@dataclass
class Samples:
    """Prompts and sampled responses, as tensors and as text.

    `prompt_ids/prompt_mask [B, P]` (left-padded), `response_ids [B, R]` (PAD after EOS),
    `response_mask [B, R]` (1 up to and including EOS), `eos [B]` (True where the response ended with EOS).
    Tensors live on the model's device.
    """

    prompts: list[str]
    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor
    eos: Tensor
    texts: list[str]
    logprobs: Tensor | None = None  # [B, R] the sampled tokens' log-probs at the temperature (`with_logprobs`)
    entropy: Tensor | None = None  # [B, R] the entropy of each step's distribution at the temperature
    hidden: Tensor | None = None  # [B, R, H] the last hidden state that predicted each token (`with_hidden`)


def response_mask_after_eos(response_ids: Tensor, eos_id: int) -> tuple[Tensor, Tensor]:
    """`[B, R]` -> mask that keeps tokens up to and including the first EOS, and whether EOS was reached."""
    is_eos = response_ids == eos_id
    seen_before = (is_eos.long().cumsum(1) - is_eos.long()) > 0  # an EOS strictly earlier
    return (~seen_before).long(), is_eos.any(1)


@functools.cache
def _cache_argument(forward_owner: type) -> str | None:
    """The name under which this model class's forward takes a key-value cache (`cache` from transformers 5.25,
    `past_key_values` before), or None when it does not take `position_ids` and `logits_to_keep` as well."""
    params = inspect.signature(forward_owner.forward).parameters
    if not {"position_ids", "logits_to_keep"} <= set(params):
        return None
    return "cache" if "cache" in params else "past_key_values" if "past_key_values" in params else None


def lean_decoding(model) -> str | None:
    """The cache argument of the model (a peft model: of its base) when `decode` can drive it, else None."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "is_encoder_decoder", False):
        return None
    return _cache_argument(type(base))


@torch.no_grad()
def decode(
    model,
    ids: Tensor,
    mask: Tensor,
    max_new_tokens: int,
    temperature: float,
    greedy: bool,
    eos_id: int | None,
    pad_id: int,
    with_hidden: bool = False,
    constraint: ReplyConstraint | None = None,
) -> tuple[Tensor, list[Tensor], Tensor | None]:
    """`generate`'s sampling loop without `generate`: `ids, mask [B, P]` (left-padded) -> the drawn tokens `[B, R]`
    (PAD after a row's EOS; R <= max_new_tokens, fewer when every row ended), each step's raw logits (`[B, V]`),
    and with `with_hidden` the last hidden state that gave each step's logits (`[B, R, H]`: a value head reads it).

    Positions are `cumsum(mask) - 1` (1 on padding), as `generate` makes them; temperature divides the logits
    unless it is 1; `eos_id=None` never stops a row. A `constraint` draws from the tokens it allows (the raw
    logits are returned as they were: `step_logprobs` applies it again)."""
    cache_arg = lean_decoding(model)
    assert cache_arg is not None, "decode() needs a model that lean_decoding() accepts"
    cache = decoding_cache(model.config, ids.shape[1], max_new_tokens)  # long replies: written in place
    B = ids.shape[0]
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
    extra = {cache_arg: cache, "use_cache": True, "output_hidden_states": with_hidden}
    # Rows that share a prompt (RLOO's and GRPO's groups) share its prefill: each distinct prompt runs once and
    # its keys and values are repeated for its rows (an index_select), as `run_on_shared_prompts` does.
    first, index = distinct_prompts(ids, mask)
    shared = len(first) < B
    rows = first if shared else slice(None)
    out = model(input_ids=ids[rows], attention_mask=mask[rows], position_ids=positions[rows], logits_to_keep=1, **extra)
    step_logits, step_hidden = _last_position(out, with_hidden)
    if shared:
        cache.reorder_cache(index)
        step_logits, step_hidden = step_logits[index], step_hidden[index] if with_hidden else None
    unfinished = torch.ones(B, dtype=torch.long, device=ids.device)
    tokens: list[Tensor] = []
    logits: list[Tensor] = []
    hidden: list[Tensor] = []
    position = positions[:, -1:]
    for t in range(max_new_tokens):
        step = step_logits.float()
        logits.append(step)
        if with_hidden:
            hidden.append(step_hidden)
        if constraint is not None:
            done = torch.stack(tokens, 1) if tokens else ids.new_zeros(B, 0)
            step = mask_logits(step, constraint.allowed(done, step.shape[-1]))
        if greedy:
            nxt = step.argmax(-1)
        else:
            probs = torch.softmax(step / temperature if temperature != 1.0 else step, -1)
            nxt = torch.multinomial(probs, 1).squeeze(1)
        nxt = nxt * unfinished + pad_id * (1 - unfinished)
        tokens.append(nxt)
        if eos_id is not None:
            unfinished = unfinished & (nxt != eos_id).long()
        if t == max_new_tokens - 1 or not bool(unfinished.any()):
            break
        mask = torch.cat([mask, mask.new_ones(B, 1)], 1)
        position = position + 1
        out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=position, **extra)
        step_logits, step_hidden = _last_position(out, with_hidden)
    return torch.stack(tokens, 1), logits, torch.stack(hidden, 1) if with_hidden else None


def _last_position(out, with_hidden: bool) -> tuple[Tensor, Tensor | None]:
    """A forward pass's logits `[B, V]` at the last position (and the last layer's hidden state there, `[B, H]`)."""
    return out.logits[:, -1], out.hidden_states[-1][:, -1] if with_hidden else None


def widen_steps(x: Tensor, steps: int) -> Tensor:
    """`[B, R, H] -> [B, steps, H]`, zeros after the last step."""
    return torch.nn.functional.pad(x, (0, 0, 0, steps - x.shape[1]))


def step_logprobs(
    logits: tuple[Tensor, ...], tokens: Tensor, temperature: float, constraint: ReplyConstraint | None = None
) -> tuple[Tensor, Tensor]:
    """`generate`'s raw logits (one `[B, V]` a step) and the tokens it drew `[B, R]` -> their log-probs and each
    step's entropy at `temperature`, `[B, R]` each: what `causal_lm.response_logprobs` computes in a forward pass
    over the whole sequence (a step at a time here, so that no `[B, R, V]` tensor is held); with a `constraint`,
    the constrained policy's."""

    def allowed(t: int, step: Tensor) -> Tensor | None:
        return None if constraint is None else constraint.allowed(tokens[:, :t], step.shape[-1])

    logprobs, entropy = zip(
        *(token_logprobs(step, tokens[:, t], temperature, allowed(t, step)) for t, step in enumerate(logits))
    )
    return torch.stack(logprobs, 1), torch.stack(entropy, 1)


@torch.no_grad()
def sample(
    model,
    tok,
    prompts: list[str],
    max_new_tokens: int,
    temperature: float = 1.0,
    batch_size: int = 256,
    stop_at_eos: bool = True,
    with_logprobs: bool = False,
    greedy: bool = False,
    lean: bool = True,
    with_hidden: bool = False,
    prompt_ids: list[list[int]] | None = None,
    constraint: ReplyConstraint | None = None,
) -> Samples:
    """One response per prompt (repeat prompts for several). Uses torch's global RNG: seed it for repeats.

    `prompt_ids`: the prompts' token ids as given (an agent's rendered multi-turn context), instead of encoding
    `prompts` (then kept only as their labels).

    `greedy`: the most likely token at every step (no sampling; `temperature` then only scales the log-probs).

    `stop_at_eos=False` generates exactly `max_new_tokens` tokens and counts them all as real (throughput
    benchmarks), without changing the sampling distribution. `with_logprobs` also returns the sampled tokens'
    log-probs and the entropies at `temperature`, from the logits `generate` computed anyway (the raw logits:
    the model's distribution, as a forward pass gives it), which saves a forward pass where nothing else needs
    one (the critic-free RLHF methods). They agree with a forward pass to float rounding (a test checks).

    `lean`: decode with our own loop (`decode`, the same tokens as `generate`) where the model allows it; False
    always calls `generate`. `with_hidden` (lean loop only; otherwise `hidden` stays None) keeps the last hidden
    state behind each token, for a value head: PPO then needs no forward pass of its own either.

    `constraint` (`constrain.ReplyConstraint`): only its replies are drawn, and the log-probs and entropies are
    those of the distribution renormalized over what it allows (on `generate` too, through its
    `prefix_allowed_tokens_fn`).
    """
    chunks = []
    device = model_device(model)
    drives = lean and lean_decoding(model) is not None  # decided once for the model, not per chunk
    if lean and not drives:  # said, not done silently: generate is slower
        note_once(
            f"{type(model).__name__} is not a model the lean decoding loop can drive; sampling with "
            "transformers' generate instead (the same tokens, slower)"
        )
    saved_eos = model.generation_config.eos_token_id
    if not stop_at_eos:
        model.generation_config.eos_token_id = None  # generate() would otherwise fall back to it and stop
    encoded = encode_prompts(tok, prompts) if prompt_ids is None else prompt_ids
    try:
        for start in range(0, len(prompts), batch_size):
            ids, mask = pad_sequences(encoded[start : start + batch_size], tok.pad_token_id, "left")
            ids, mask = ids.to(device), mask.to(device)
            eos = tok.eos_token_id if stop_at_eos else None
            hidden = None
            if drives:
                response, raw, hidden = decode(
                    model,
                    ids,
                    mask,
                    max_new_tokens,
                    temperature,
                    greedy,
                    eos,
                    tok.pad_token_id,
                    with_hidden,
                    constraint,
                )
            else:
                how = {"do_sample": False} if greedy else {"do_sample": True, "temperature": temperature, "top_k": 0}
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    top_p=1.0,
                    **how,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=tok.pad_token_id,
                    eos_token_id=eos,
                    return_dict_in_generate=True,
                    output_logits=with_logprobs,
                    prefix_allowed_tokens_fn=None
                    if constraint is None
                    else allowed_after(constraint, ids.shape[1], model.config.vocab_size),
                )
                response, raw = out.sequences[:, ids.shape[1] :], out.logits
            steps = step_logprobs(raw, response, temperature, constraint) if with_logprobs else (None, None)
            chunks.append((ids, mask, response, *steps, hidden))
    finally:
        model.generation_config.eos_token_id = saved_eos
    P = max(c[0].shape[1] for c in chunks)
    R = max(c[2].shape[1] for c in chunks)
    pad = tok.pad_token_id
    prompt_ids = torch.cat([widen(c[0], P, pad, "left") for c in chunks])
    prompt_mask = torch.cat([widen(c[1], P, 0, "left") for c in chunks])
    response_ids = torch.cat([widen(c[2], R, pad, "right") for c in chunks])
    if stop_at_eos:
        response_mask, eos = response_mask_after_eos(response_ids, tok.eos_token_id)
    else:
        response_mask, eos = torch.ones_like(response_ids), (response_ids == tok.eos_token_id).any(1)
    response_ids = torch.where(response_mask.bool(), response_ids, torch.full_like(response_ids, pad))
    texts = decode_responses(tok, response_ids, response_mask)
    logprobs = entropy = hidden = None
    if with_logprobs:
        logprobs = torch.cat([widen(c[3], R, 0, "right") for c in chunks]) * response_mask
        entropy = torch.cat([widen(c[4], R, 0, "right") for c in chunks]) * response_mask
    if all(c[5] is not None for c in chunks):  # asked for, and the lean loop ran
        hidden = torch.cat([widen_steps(c[5], R) for c in chunks])
    return Samples(
        list(prompts), prompt_ids, prompt_mask, response_ids, response_mask, eos, texts, logprobs, entropy, hidden
    )


def allowed_after(constraint: ReplyConstraint, prompt_length: int, vocab_size: int):
    """`generate`'s `prefix_allowed_tokens_fn` for `constraint`: the token ids it allows after the reply so far
    (the ids past `prompt_length`); every id where it allows all (`ReplyConstraint.allowed`'s padding)."""
    every = list(range(vocab_size))

    def allowed(_: int, ids: Tensor) -> list[int]:
        options = constraint.next.get(tuple(ids[prompt_length:].tolist()))
        return every if options is None else options

    return allowed


def select_samples(s: Samples, idx: list[int]) -> Samples:
    """The rows `idx` of `s` (kept in that order)."""
    i = torch.tensor(idx, dtype=torch.long, device=s.response_ids.device)
    pick = lambda x: None if x is None else x[i]  # noqa: E731
    return Samples(
        [s.prompts[j] for j in idx],
        s.prompt_ids[i],
        s.prompt_mask[i],
        s.response_ids[i],
        s.response_mask[i],
        s.eos[i],
        [s.texts[j] for j in idx],
        pick(s.logprobs),
        pick(s.entropy),
        pick(s.hidden),
    )


def concat_samples(parts: list[Samples], pad_id: int) -> Samples:
    """Several `Samples` as one: prompts left-padded and replies right-padded to the widest (positions come from
    the masks, so the extra padding changes no log-prob)."""
    if len(parts) == 1:
        return parts[0]
    P = max(p.prompt_ids.shape[1] for p in parts)
    R = max(p.response_ids.shape[1] for p in parts)
    cat = lambda xs, width, value, side: torch.cat([widen(x, width, value, side) for x in xs])  # noqa: E731
    with_logprobs = all(p.logprobs is not None for p in parts)
    return Samples(
        [x for p in parts for x in p.prompts],
        cat([p.prompt_ids for p in parts], P, pad_id, "left"),
        cat([p.prompt_mask for p in parts], P, 0, "left"),
        cat([p.response_ids for p in parts], R, pad_id, "right"),
        cat([p.response_mask for p in parts], R, 0, "right"),
        torch.cat([p.eos for p in parts]),
        [x for p in parts for x in p.texts],
        cat([p.logprobs for p in parts], R, 0, "right") if with_logprobs else None,
        cat([p.entropy for p in parts], R, 0, "right") if with_logprobs else None,
        torch.cat([widen_steps(p.hidden, R) for p in parts]) if all(p.hidden is not None for p in parts) else None,
    )


def decode_responses(tok, response_ids: Tensor, response_mask: Tensor) -> list[str]:
    out = []
    for ids, m in zip(response_ids.tolist(), response_mask.tolist()):
        real = [i for i, keep in zip(ids, m) if keep and i != tok.eos_token_id]
        out.append(tok.decode(real, skip_special_tokens=True).strip())
    return out
