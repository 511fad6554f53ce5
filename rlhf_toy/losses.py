"""PPO and policy-gradient losses as pure functions of tensors.

Every function takes per-sample tensors of one shared shape (`[B]` for environment steps, `[B, L]` for
tokens) and an optional `mask` of that shape; padded entries never count. The caller sums the parts:

    loss = policy.loss - ent_coef * entropy + vf_coef * value_loss
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .masks import Dims, masked_mean, masked_var


class PolicyLoss(NamedTuple):
    """The clipped surrogate loss and its diagnostics (diagnostics are detached)."""

    loss: Tensor  # scalar, to minimise
    clip_fraction: Tensor  # share of samples whose ratio left [1 - clip, 1 + clip]
    approx_kl: Tensor  # k3 estimate of KL(old || new)
    ratio_mean: Tensor


def kl_k1(logp: Tensor, logq: Tensor) -> Tensor:
    """Per-sample k1 estimate of KL(p || q) from samples of p: log p - log q. Unbiased, can be < 0."""
    return logp - logq


def kl_k3(logp: Tensor, logq: Tensor) -> Tensor:
    """Per-sample k3 estimate of KL(p || q) from samples of p: (q/p - 1) - log(q/p). Unbiased and >= 0."""
    log_ratio = logq - logp
    return torch.expm1(log_ratio) - log_ratio


def clipped_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    clip_range: float | None,
    mask: Tensor | None = None,
    dim: Dims = None,
) -> PolicyLoss:
    """PPO's clipped surrogate: mean of max(-A * r, -A * clip(r, 1 - eps, 1 + eps)), r = pi_new / pi_old.

    `clip_range=None` gives the unclipped surrogate -A * r (the lesson's "break the clip" exercise).
    At r = 1 its gradient equals the plain policy gradient's, -A * grad log pi. `dim` (as in `masked_mean`)
    keeps the other dimensions: a population's `[N, b]` with `dim=1` gives one loss per agent.
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    if clip_range is None:
        per_sample = unclipped
        clipped_mask = torch.zeros_like(ratio, dtype=torch.bool)
    else:
        clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
        per_sample = torch.maximum(unclipped, clipped)
        clipped_mask = (ratio - 1.0).abs() > clip_range
    with torch.no_grad():
        clip_fraction = masked_mean(clipped_mask.to(ratio.dtype), mask, dim)
        approx_kl = masked_mean(kl_k3(old_logprobs, logprobs), mask, dim)
        ratio_mean = masked_mean(ratio, mask, dim)
    return PolicyLoss(masked_mean(per_sample, mask, dim), clip_fraction, approx_kl, ratio_mean)


def policy_gradient_loss(logprobs: Tensor, advantages: Tensor, mask: Tensor | None = None, dim: Dims = None) -> Tensor:
    """REINFORCE: -mean(log pi(a|s) * A). `advantages` are returns (no baseline) or returns - V (baseline)."""
    return masked_mean(-logprobs * advantages.detach(), mask, dim)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    clip_range: float | None = None,
    mask: Tensor | None = None,
    dim: Dims = None,
) -> Tensor:
    """Mean squared error to the returns; with `clip_range`, the max of the plain and the clipped error,
    where the clipped prediction stays within `clip_range` of the value that collected the data."""
    error = (values - returns) ** 2
    if clip_range is not None:
        clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
        error = torch.maximum(error, (clipped - returns) ** 2)
    return masked_mean(error, mask, dim)


@torch.no_grad()
def explained_variance(values: Tensor, returns: Tensor, mask: Tensor | None = None, dim: Dims = None) -> float | Tensor:
    """1 - Var[returns - values] / Var[returns]: 1 is a perfect critic, 0 no better than a constant,
    NaN when the returns do not vary. A float; with `dim` (as in `masked_mean`), a tensor of one value per index
    of the other dimensions (per agent of a population)."""
    var_returns = masked_var(returns, mask, dim)
    ev = torch.where(var_returns == 0, float("nan"), 1.0 - masked_var(returns - values, mask, dim) / var_returns)
    return ev if dim is not None else float(ev)


class DPOLoss(NamedTuple):
    """The DPO loss and its implicit rewards (detached)."""

    loss: Tensor  # scalar, to minimise
    chosen_rewards: Tensor  # [B] beta * (log pi(y_w|x) - log pi_ref(y_w|x))
    rejected_rewards: Tensor  # [B] the same for y_l
    accuracy: Tensor  # share of pairs whose chosen reply has the larger implicit reward


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float,
) -> DPOLoss:
    """DPO (Rafailov et al. 2023): -log sigmoid(beta * [(log pi_w - log ref_w) - (log pi_l - log ref_l)]).

    Each argument is `[B]`: the summed log-probability of the chosen (w) or rejected (l) reply under the policy
    being trained or the frozen reference. `beta` plays the KL coefficient's part.
    """
    chosen = policy_chosen_logps - ref_chosen_logps
    rejected = policy_rejected_logps - ref_rejected_logps
    loss = -torch.nn.functional.logsigmoid(beta * (chosen - rejected)).mean()
    with torch.no_grad():
        chosen_rewards, rejected_rewards = beta * chosen, beta * rejected
        accuracy = (chosen_rewards > rejected_rewards).float().mean()
    return DPOLoss(loss, chosen_rewards, rejected_rewards, accuracy)
