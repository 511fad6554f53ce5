"""The tiny GPT-2 policy model, and log-probs of response tokens under any causal LM (GPT-2, Llama, GPT-NeoX,
Qwen2, ...: every one takes `position_ids`).

Conventions that matter (each is a known RLHF implementation detail):
- dropout is off everywhere, so a forward pass is a deterministic function of the weights;
- prompts are LEFT-padded and position ids come from the attention mask, `cumsum(mask) - 1`: GPT-2 does
  not derive them itself, and without them a padded prompt is read differently from an unpadded one;
- log-probs count response tokens only, EOS included.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import GPT2Config, GPT2LMHeadModel

from rlhf_toy.config import check, option

from .constrain import ReplyConstraint, mask_logits
from .devices import model_device


@dataclass
class ModelConfig:
    """Size of the tiny GPT-2 (the defaults give about 0.9M parameters with a 1k vocabulary)."""

    n_layer: int = option("Transformer blocks.", 4)
    n_embd: int = option("Width of the residual stream.", 128)
    n_head: int = option("Attention heads.", 4)
    n_positions: int = option("Context length in tokens (prompt + response + EOS).", 64)

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_embd", "n_head", "n_positions"):
            check(getattr(self, name) >= 1, name, getattr(self, name), ">= 1")
        check(self.n_embd % self.n_head == 0, "n_embd", self.n_embd, f"a multiple of n_head ({self.n_head})")


def new_causal_lm(tok, cfg: ModelConfig, seed: int = 0):
    """A freshly initialised GPT-2 with `tok`'s vocabulary and special tokens, dropout off."""
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tok),
        n_positions=cfg.n_positions,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        # GPT-2's tanh GELU, as one fused op instead of GPT-2's default chain of Python ops.
        activation_function="gelu_pytorch_tanh",
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return GPT2LMHeadModel(config).eval()


def position_ids(attention_mask: Tensor) -> Tensor:
    """`[B, L]` mask -> `[B, L]` positions counting real tokens only (left padding starts at 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(
    logits: Tensor, tokens: Tensor, temperature: float, allowed: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Logits `[..., V]` divided by `temperature` -> the log-probs of `tokens [...]` and the entropies, `[...]` each
    (in float32 whatever the logits' dtype). `allowed [..., V]` (a `constrain.ReplyConstraint`'s masks): the
    distribution renormalized over the allowed tokens (the others' probability 0, left out of the entropy)."""
    log_pi = F.log_softmax(mask_logits(logits.float() / temperature, allowed), -1)
    plogp = log_pi.exp() * (log_pi if allowed is None else log_pi.masked_fill(~allowed, 0.0))
    return log_pi.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), -plogp.sum(-1)


_FORWARD_ARGS: dict[type, frozenset[str]] = {}


def forward_args(model) -> frozenset[str]:
    """The argument names of the model's forward (a PEFT model's: those of the model it wraps, to which it
    passes them on), cached per class."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if type(base) not in _FORWARD_ARGS:
        _FORWARD_ARGS[type(base)] = frozenset(inspect.signature(base.forward).parameters)
    return _FORWARD_ARGS[type(base)]


def keeps_logits(model) -> bool:
    """Whether the model's forward takes `logits_to_keep` (transformers' causal LMs do)."""
    return "logits_to_keep" in forward_args(model)


def takes_cache(model) -> bool:
    """Whether the model's forward takes a KV cache as `cache` (transformers 5): what `run_on_shared_prompts`
    needs."""
    return "cache" in forward_args(model)


def shares_prompts(model) -> bool:
    """Whether `response_logprobs` can run a prompt that several rows share only once: the model takes a `cache`
    and `logits_to_keep` (transformers 5's causal LMs)."""
    return takes_cache(model) and keeps_logits(model)


def distinct_prompts(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor]:
    """`[B, P]` prompts -> `(first [G], index [B])`: the row where each of the G distinct prompts first occurs, and
    which distinct prompt each row holds (`prompt_ids[first][index] == prompt_ids`)."""
    rows = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], 1)
    _, index = torch.unique(rows, dim=0, return_inverse=True)
    B = len(rows)
    first = torch.full((int(index.max()) + 1,), B, device=rows.device).scatter_reduce_(
        0, index, torch.arange(B, device=rows.device), "amin"
    )
    return first, index


def response_logprobs(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    temperature: float = 1.0,
    return_hidden: bool = False,
    constraint: ReplyConstraint | None = None,
):
    """Log-probs of the response tokens under `model`, logits divided by `temperature` (and with a `constraint`,
    renormalized over the tokens it allows at each position: the constrained policy's).

    `prompt_ids/prompt_mask [B, P]` left-padded; `response_ids [B, R]` (any value after EOS).
    Returns `logprobs [B, R]`, `entropy [B, R]` (and the last hidden states at the positions that predict
    each response token, `[B, R, H]`, if `return_hidden`).

    Rows that share a prompt (RLOO's and GRPO's k replies, DPO's chosen and rejected) share its forward pass
    where the model allows it (`shares_prompts`): the prompt runs once, its keys and values are repeated for
    each reply, and the replies run on top of them (the same numbers to float rounding, gradients included).
    """
    device = model_device(model)
    prompt_ids, prompt_mask, response_ids = prompt_ids.to(device), prompt_mask.to(device), response_ids.to(device)

    def allowed(logits: Tensor) -> Tensor | None:
        return None if constraint is None else constraint.masks(response_ids, logits.shape[-1])

    if shares_prompts(model):
        first, index = distinct_prompts(prompt_ids, prompt_mask)
        if len(first) < len(prompt_ids):
            logits, hidden = shared_prompt_forward(
                model, prompt_ids, prompt_mask, response_ids, first, index, return_hidden
            )
            logprobs, entropy = token_logprobs(logits, response_ids, temperature, allowed(logits))
            return (logprobs, entropy, hidden) if return_hidden else (logprobs, entropy)
    ids = torch.cat([prompt_ids, response_ids], 1)
    mask = torch.cat([prompt_mask, torch.ones_like(response_ids)], 1)
    P, R = prompt_ids.shape[1], response_ids.shape[1]
    # Only the last R + 1 positions' logits are needed: the LM head skips the prompt (for a real vocabulary,
    # 49k for SmolLM2, that is most of a [B, P + R, V] tensor). Models without the argument give them all.
    keep = {"logits_to_keep": R + 1} if keeps_logits(model) else {}
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), output_hidden_states=return_hidden, **keep
    )
    # position t predicts token t + 1: positions P - 1 ... P + R - 2, the same slice whichever logits came back
    logits = out.logits[:, -(R + 1) : -1]
    logprobs, entropy = token_logprobs(logits, response_ids, temperature, allowed(logits))
    if return_hidden:
        return logprobs, entropy, out.hidden_states[-1][:, P - 1 : P + R - 1]
    return logprobs, entropy


def shared_prompt_forward(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    first: Tensor,
    index: Tensor,
    return_hidden: bool,
) -> tuple[Tensor, Tensor | None]:
    """The logits `[B, R, V]` that predict each response token (and the last hidden states there, `[B, R, H]`),
    with each distinct prompt `prompt_ids[first]` run once (`run_on_shared_prompts`)."""
    head, tail = run_on_shared_prompts(
        model,
        prompt_ids,
        prompt_mask,
        response_ids,
        torch.ones_like(response_ids),
        first,
        index,
        {"logits_to_keep": 1},
        output_hidden_states=return_hidden,
    )
    # the prompt's last position predicts the first response token, response position t the token t + 1
    logits = torch.cat([head.logits[index], tail.logits[:, :-1]], 1)
    if not return_hidden:
        return logits, None
    return logits, torch.cat([head.hidden_states[-1][index, -1:], tail.hidden_states[-1][:, :-1]], 1)


def run_on_shared_prompts(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    tail_ids: Tensor,
    tail_mask: Tensor,
    first: Tensor,
    index: Tensor,
    head_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """`model`'s outputs on the distinct prompts `prompt_ids[first]` (left-padded, `[G, P]`), then on each row's
    tail `[B, T]` (right-padded by `tail_mask`) on top of its prompt's KV cache, repeated per row (`index`): the
    forward pass of `[prompt, tail]` with each shared prompt computed once (transformers 5's `cache` argument;
    gradients flow back through the repeated cache). `kwargs` go to both calls, `head_kwargs` to the first."""
    ids, mask = prompt_ids[first], prompt_mask[first]
    head = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=position_ids(mask),
        use_cache=True,
        **(head_kwargs or {}),
        **kwargs,
    )
    cache = head.cache
    cache.reorder_cache(index)  # row b gets its prompt's keys and values (index_select)
    full_mask = torch.cat([prompt_mask, tail_mask], 1)
    tail = model(
        input_ids=tail_ids,
        attention_mask=full_mask,
        position_ids=position_ids(full_mask)[:, prompt_ids.shape[1] :],
        cache=cache,
        **kwargs,
    )
    return head, tail
