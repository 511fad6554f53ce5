"""Reward shaping (the KL penalty, DAPO's overlong penalty) and KL control for RLHF.

Per-token reward (Ziegler et al. 2019): r_t = -beta * KL_t, plus the reward model's score at the last real
token of the response. KL_t is k1 = log pi - log pi_ref (unbiased, can be negative) or k3 (>= 0).
"""

from __future__ import annotations

from collections import deque

import torch
from torch import Tensor

from rlhf_toy.losses import kl_estimate
from rlhf_toy.masks import last_real_index


def per_token_kl(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k1") -> Tensor:
    """`[B, R]` per-token estimate (k1, k2 or k3) of KL(pi || pi_ref) from tokens sampled from pi."""
    return kl_estimate(logprobs, ref_logprobs, kind)


def overlong_penalty(lengths: Tensor, limit: int, buffer: int, penalty: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment: `lengths [B]` (reply tokens) -> `[B]`, 0 up to `limit - buffer` tokens, then
    falling linearly to `-penalty` at `limit` (and below it past the limit). `buffer` 0: no penalty."""
    if buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    over = (lengths.float() - (limit - buffer)).clamp(min=0.0) / buffer
    return -penalty * over


def shaped_rewards(scores: Tensor, kl: Tensor, mask: Tensor, beta: float) -> Tensor:
    """`scores [B]`, `kl [B, R]`, `mask [B, R]` -> rewards `[B, R]`: -beta * KL on real tokens, plus the
    score at the last real token; 0 on padding."""
    rewards = -beta * kl * mask
    rewards[torch.arange(scores.shape[0], device=mask.device), last_real_index(mask)] += scores
    return rewards


class AdaptiveKLController:
    """Ziegler et al.'s proportional controller: beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * n / horizon)."""

    def __init__(self, beta: float, target: float, horizon: int) -> None:
        self.beta, self.target, self.horizon = beta, target, horizon

    def update(self, kl: float, n_steps: int) -> float:
        error = max(-0.2, min(0.2, kl / self.target - 1.0))
        self.beta *= 1.0 + error * n_steps / self.horizon
        return self.beta


class FixedKLController:
    def __init__(self, beta: float) -> None:
        self.beta = beta

    def update(self, kl: float, n_steps: int) -> float:
        return self.beta


class MovingAverage:
    """Mean of the last `window` values: a KL limit judged on one noisy batch stops runs too early."""

    def __init__(self, window: int) -> None:
        self.values: deque[float] = deque(maxlen=window)

    def add(self, x: float) -> float:
        self.values.append(x)
        return self.mean

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else 0.0
