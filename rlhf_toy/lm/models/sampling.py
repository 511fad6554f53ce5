"""Batched sampling with `generate`: left-padded prompts, temperature T, top_k 0, top_p 1, stop at EOS."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .causal_lm import token_logprobs
from .chat import encode_prompts, pad_sequences, widen
from .devices import model_device


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


def response_mask_after_eos(response_ids: Tensor, eos_id: int) -> tuple[Tensor, Tensor]:
    """`[B, R]` -> mask that keeps tokens up to and including the first EOS, and whether EOS was reached."""
    is_eos = response_ids == eos_id
    seen_before = (is_eos.long().cumsum(1) - is_eos.long()) > 0  # an EOS strictly earlier
    return (~seen_before).long(), is_eos.any(1)


def step_logprobs(logits: tuple[Tensor, ...], tokens: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """`generate`'s raw logits (one `[B, V]` a step) and the tokens it drew `[B, R]` -> their log-probs and each
    step's entropy at `temperature`, `[B, R]` each: what `causal_lm.response_logprobs` computes in a forward pass
    over the whole sequence (a step at a time here, so that no `[B, R, V]` tensor is held)."""
    logprobs, entropy = zip(*(token_logprobs(step, tokens[:, t], temperature) for t, step in enumerate(logits)))
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
) -> Samples:
    """One response per prompt (repeat prompts for several). Uses torch's global RNG: seed it for repeats.

    `greedy`: the most likely token at every step (no sampling; `temperature` then only scales the log-probs).

    `stop_at_eos=False` generates exactly `max_new_tokens` tokens and counts them all as real (throughput
    benchmarks), without changing the sampling distribution. `with_logprobs` also returns the sampled tokens'
    log-probs and the entropies at `temperature`, from the logits `generate` computed anyway (the raw logits:
    the model's distribution, as a forward pass gives it), which saves a forward pass where nothing else needs
    one (the critic-free RLHF methods). They agree with a forward pass to float rounding (a test checks).
    """
    chunks = []
    device = model_device(model)
    saved_eos = model.generation_config.eos_token_id
    if not stop_at_eos:
        model.generation_config.eos_token_id = None  # generate() would otherwise fall back to it and stop
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            ids, mask = pad_sequences(encode_prompts(tok, chunk), tok.pad_token_id, "left")
            ids, mask = ids.to(device), mask.to(device)
            how = {"do_sample": False} if greedy else {"do_sample": True, "temperature": temperature, "top_k": 0}
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                top_p=1.0,
                **how,
                max_new_tokens=max_new_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id if stop_at_eos else None,
                return_dict_in_generate=with_logprobs,
                output_logits=with_logprobs,
            )
            sequences = out.sequences if with_logprobs else out
            response = sequences[:, ids.shape[1] :]
            steps = step_logprobs(out.logits, response, temperature) if with_logprobs else (None, None)
            chunks.append((ids, mask, response, *steps))
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
    logprobs = entropy = None
    if with_logprobs:
        logprobs = torch.cat([widen(c[3], R, 0, "right") for c in chunks]) * response_mask
        entropy = torch.cat([widen(c[4], R, 0, "right") for c in chunks]) * response_mask
    return Samples(list(prompts), prompt_ids, prompt_mask, response_ids, response_mask, eos, texts, logprobs, entropy)


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
    )


def decode_responses(tok, response_ids: Tensor, response_mask: Tensor) -> list[str]:
    out = []
    for ids, m in zip(response_ids.tolist(), response_mask.tolist()):
        real = [i for i, keep in zip(ids, m) if keep and i != tok.eos_token_id]
        out.append(tok.decode(real, skip_special_tokens=True).strip())
    return out
