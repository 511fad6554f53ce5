"""Tiny GPT-2 models, batching with padding, and the SFT loop.

Conventions that matter (see shared reference "RLHF details"):
- dropout is off everywhere, so a forward pass is a deterministic function of the weights;
- prompts are LEFT-padded and position ids come from the attention mask, `cumsum(mask) - 1`: GPT-2 does
  not derive them itself, and without them a padded prompt is read differently from an unpadded one;
- loss and log-probs count response tokens only, EOS included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from rlhf_toy.errors import UserError

from .chat import prompt_text


@dataclass
class ModelConfig:
    """Size of the tiny GPT-2 (the defaults give about 0.9M parameters with a 1k vocabulary)."""

    n_layer: int = field(default=4, metadata={"help": "Transformer blocks."})
    n_embd: int = field(default=128, metadata={"help": "Width of the residual stream."})
    n_head: int = field(default=4, metadata={"help": "Attention heads."})
    n_positions: int = field(default=64, metadata={"help": "Context length in tokens (prompt + response + EOS)."})

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_embd", "n_head", "n_positions"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.n_embd % self.n_head:
            raise UserError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")


def new_causal_lm(tok, cfg: ModelConfig, seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tok), n_positions=cfg.n_positions, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
                        n_head=cfg.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        # GPT-2's tanh GELU, as one fused op instead of GPT-2's default chain of Python ops.
                        activation_function="gelu_pytorch_tanh",
                        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return GPT2LMHeadModel(config).eval()


def position_ids(attention_mask: Tensor) -> Tensor:
    """`[B, L]` mask -> `[B, L]` positions counting real tokens only (left padding starts at 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def encode_prompts(tok, prompts: list[str]) -> list[list[int]]:
    return [tok.encode(prompt_text(p)) for p in prompts]


def encode_responses(tok, responses: list[str]) -> list[list[int]]:
    return [tok.encode(r) + [tok.eos_token_id] for r in responses]


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Token lists -> `(ids [B, L], mask [B, L])`, padded on the left."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s)
            mask[i, width - len(s):] = 1
    return ids, mask


def right_pad(seqs: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Token lists -> `(ids [B, L], mask [B, L])`, padded on the right."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def check_fits(prompt_ids: list[list[int]], n_positions: int, min_response: int, what: str) -> None:
    longest = max(len(p) for p in prompt_ids)
    if longest + min_response > n_positions:
        raise UserError(f"a {what} prompt is {longest} tokens, too long for the context of {n_positions} with room "
                        f"for a {min_response}-token response; shorten it or raise --n_positions")


def response_logprobs(model, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                      temperature: float = 1.0, return_hidden: bool = False):
    """Log-probs of the response tokens under `model`, logits divided by `temperature`.

    `prompt_ids/prompt_mask [B, P]` left-padded; `response_ids [B, R]` (any value after EOS).
    Returns `logprobs [B, R]`, `entropy [B, R]` (and the last hidden states at the positions that predict
    each response token, `[B, R, H]`, if `return_hidden`).
    """
    ids = torch.cat([prompt_ids, response_ids], 1)
    mask = torch.cat([prompt_mask, torch.ones_like(response_ids)], 1)
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask),
                output_hidden_states=return_hidden)
    P, R = prompt_ids.shape[1], response_ids.shape[1]
    logits = out.logits[:, P - 1: P + R - 1].float() / temperature  # position t predicts token t + 1
    log_pi = F.log_softmax(logits, -1)
    logprobs = log_pi.gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_pi.exp() * log_pi).sum(-1)
    if return_hidden:
        return logprobs, entropy, out.hidden_states[-1][:, P - 1: P + R - 1]
    return logprobs, entropy


def sft_batches(pairs_ids: list[tuple[list[int], list[int]]], batch_size: int, pad_id: int,
                generator: torch.Generator | None, shuffle: bool = True):
    """Yield `(ids, mask, labels)` right-padded batches; labels are -100 on the prompt and on padding."""
    order = torch.randperm(len(pairs_ids), generator=generator).tolist() if shuffle else range(len(pairs_ids))
    order = list(order)
    for start in range(0, len(order), batch_size):
        chunk = [pairs_ids[i] for i in order[start: start + batch_size]]
        ids, mask = right_pad([p + r for p, r in chunk], pad_id)
        labels = torch.full_like(ids, -100)
        for i, (p, r) in enumerate(chunk):
            labels[i, len(p): len(p) + len(r)] = torch.tensor(r)
        yield ids, mask, labels


def lm_loss(model, ids: Tensor, mask: Tensor, labels: Tensor) -> tuple[Tensor, int]:
    """Summed next-token cross-entropy over labelled tokens, and their count."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    target = labels[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100,
                           reduction="sum")
    return loss, int((target != -100).sum())


@torch.no_grad()
def mean_response_loss(model, pairs_ids, pad_id: int, batch_size: int = 256) -> float:
    """Mean loss per response token (nats), EOS included."""
    total, count = 0.0, 0
    for ids, mask, labels in sft_batches(pairs_ids, batch_size, pad_id, None, shuffle=False):
        loss, n = lm_loss(model, ids, mask, labels)
        total, count = total + loss.item(), count + n
    return total / max(count, 1)


def cosine_lr(step: int, total: int, base: float, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    return base * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
