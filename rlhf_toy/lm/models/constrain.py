"""Decoding constrained to a fixed set of replies: invalid-action masking for a language model.

A discrete-action agent whose environment lists its valid actions can be kept to them by masking the others' logits
(sb3-contrib's MaskablePPO); a language-model agent, by letting it write only the environment's actions (GLAM, Carta
et al. 2023, scores only those). Here a reply is a token sequence: `ReplyConstraint` holds the allowed replies (each
ending in EOS) as a prefix tree, and gives at each position of a reply the tokens that keep it a prefix of one of
them. The policy is then the language model's distribution renormalized over those tokens, in sampling
(`sampling.decode` draws from it, `generate` through its `prefix_allowed_tokens_fn`) and in every log-prob the
update and the KL read (`causal_lm.token_logprobs`'s `allowed`), so the importance ratio and the entropy are the
constrained policy's.
"""

from __future__ import annotations

import torch
from torch import Tensor


class ReplyConstraint:
    """`replies`: the allowed replies' token ids, each ending in EOS (e.g. `encode_responses(tok, actions)`).

    After a complete reply (the prefix ends in EOS), and after any prefix that is not one of theirs, every token is
    allowed: those positions are padding, masked out of every loss, and must only stay finite."""

    def __init__(self, replies: list[list[int]]) -> None:
        if not replies or any(not r for r in replies):
            raise ValueError("a reply constraint needs at least one reply, each of at least one token")
        self.replies = [list(r) for r in replies]
        self.next: dict[tuple[int, ...], list[int]] = {}
        for r in self.replies:
            for t in range(len(r)):
                options = self.next.setdefault(tuple(r[:t]), [])
                if r[t] not in options:
                    options.append(r[t])

    def allowed(self, prefixes: Tensor, vocab_size: int) -> Tensor:
        """`prefixes [B, t]` (the reply's tokens so far; t may be 0) -> `[B, V]` bool, True where a token may come
        next."""
        # One row per distinct prefix (a batch holds few: the replies share their beginnings), then spread back.
        if prefixes.shape[1] == 0:  # the reply's first token: one prefix for every row
            distinct, index = prefixes.new_zeros(1, 0).cpu(), torch.zeros(len(prefixes), dtype=torch.long)
        else:
            distinct, index = torch.unique(prefixes.cpu(), dim=0, return_inverse=True)
        out = torch.ones(len(distinct), vocab_size, dtype=torch.bool)
        for i, prefix in enumerate(distinct.tolist()):
            options = self.next.get(tuple(prefix))
            if options is not None:
                out[i] = False
                out[i, options] = True
        return out[index].to(prefixes.device)

    def masks(self, response_ids: Tensor, vocab_size: int) -> Tensor:
        """`response_ids [B, R]` -> `[B, R, V]` bool: what `allowed` gave at each position of each reply."""
        B, R = response_ids.shape
        return torch.stack([self.allowed(response_ids[:, :t], vocab_size) for t in range(R)], 1).view(B, R, -1)


def mask_logits(logits: Tensor, allowed: Tensor | None) -> Tensor:
    """`logits [..., V]` with the tokens `allowed [..., V]` forbids at -inf (unchanged when `allowed` is None)."""
    return logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))
