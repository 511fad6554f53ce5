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


def kl_k2(logp: Tensor, logq: Tensor) -> Tensor:
    """Per-sample k2 estimate of KL(p || q) from samples of p: (log p - log q)^2 / 2. Biased, >= 0; as a loss its
    gradient is the reverse KL's (Schulman's "Approximating KL divergence")."""
    return 0.5 * (logp - logq) ** 2


def kl_k3(logp: Tensor, logq: Tensor) -> Tensor:
    """Per-sample k3 estimate of KL(p || q) from samples of p: (q/p - 1) - log(q/p). Unbiased and >= 0."""
    log_ratio = logq - logp
    return torch.expm1(log_ratio) - log_ratio


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl_estimate(logp: Tensor, logq: Tensor, kind: str) -> Tensor:
    """The per-sample KL(p || q) estimate `kind` (k1, k2 or k3) from samples of p, any shape."""
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"kl estimator must be one of {', '.join(KL_ESTIMATORS)}, not {kind!r}")
    return KL_ESTIMATORS[kind](logp, logq)


# How a per-token loss `[B, L]` becomes one number (the GRPO family differs here):
AGGREGATIONS = ("token", "sequence", "constant")


def aggregate(
    per_token: Tensor, mask: Tensor | None = None, how: str = "token", length: int | None = None, dim: Dims = None
) -> Tensor:
    """A per-token loss `[B, L]` (or per-sample `[B]`) reduced to a scalar:

    - `token`: the mean over every real token of the batch (DAPO's token-level loss; what PPO-RLHF does);
    - `sequence`: each reply's mean over its own tokens, then the mean over replies (GRPO's 1/|o_i|);
    - `constant`: the sum over real tokens divided by B * `length` (Dr. GRPO: a constant, the generation limit,
      instead of each reply's length; `length` defaults to L).

    Samples without a time axis give the plain masked mean for every `how`: environment steps `[B]`, and a
    population's `[N, b]` (given with its `dim`, whose last axis is samples, not time).
    """
    if how == "token" or per_token.dim() < 2 or dim is not None:
        return masked_mean(per_token, mask, dim)
    m = torch.ones_like(per_token) if mask is None else mask.to(per_token.dtype)
    if how == "sequence":
        return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    if how == "constant":
        return (per_token * m).sum() / (per_token.shape[0] * (length or per_token.shape[-1]))
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, not {how!r}")


RATIO_LEVELS = ("token", "sequence")


def log_ratios(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor | None = None, level: str = "token") -> Tensor:
    """log pi_new / pi_old per token `[B, L]`; at `level` "sequence" (GSPO), every token of a reply carries the
    reply's mean log-ratio over its real tokens, log s_i = mean_t log rho_{i,t} (the length-normalized
    sequence ratio), so that one ratio per reply is clipped."""
    log_ratio = logprobs - old_logprobs
    if level == "token" or log_ratio.dim() < 2:
        return log_ratio
    if level != "sequence":
        raise ValueError(f"ratio level must be one of {RATIO_LEVELS}, not {level!r}")
    return masked_mean(log_ratio, mask, -1, keepdim=True).expand_as(log_ratio)


def clipped_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    clip_range: float | None,
    mask: Tensor | None = None,
    dim: Dims = None,
    clip_range_high: float | None = None,
    ratio_level: str = "token",
    aggregation: str = "token",
    length: int | None = None,
) -> PolicyLoss:
    """PPO's clipped surrogate: mean of max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high)), r = pi_new / pi_old.

    `clip_range` is eps_low, and eps_high too unless `clip_range_high` is given (DAPO's clip-higher). `clip_range
    =None` gives the unclipped surrogate -A * r (the lesson's "break the clip" exercise). At r = 1 its gradient
    equals the plain policy gradient's, -A * grad log pi. `ratio_level` "sequence" clips one ratio per reply
    (GSPO, `log_ratios`); `aggregation` and `length` reduce the per-token loss (`aggregate`). `dim` (as in
    `masked_mean`) keeps the other dimensions: a population's `[N, b]` with `dim=1` gives one loss per agent.
    """
    # A population's `[N, b]` (`dim`) has no time axis: one ratio per sample whatever the level.
    ratio = torch.exp(log_ratios(logprobs, old_logprobs, mask, "token" if dim is not None else ratio_level))
    unclipped = -advantages * ratio
    if clip_range is None:
        per_sample = unclipped
        clipped_mask = torch.zeros_like(ratio, dtype=torch.bool)
    else:
        high = clip_range if clip_range_high is None else clip_range_high
        clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + high)
        per_sample = torch.maximum(unclipped, clipped)
        clipped_mask = (ratio < 1.0 - clip_range) | (ratio > 1.0 + high)
    with torch.no_grad():
        clip_fraction = masked_mean(clipped_mask.to(ratio.dtype), mask, dim)
        approx_kl = masked_mean(kl_k3(old_logprobs, logprobs), mask, dim)
        ratio_mean = masked_mean(ratio, mask, dim)
    return PolicyLoss(aggregate(per_sample, mask, aggregation, length, dim), clip_fraction, approx_kl, ratio_mean)


def policy_gradient_loss(
    logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    dim: Dims = None,
    aggregation: str = "token",
    length: int | None = None,
) -> Tensor:
    """REINFORCE: -mean(log pi(a|s) * A). `advantages` are returns (no baseline) or returns - V (baseline);
    `aggregation` as in `aggregate`."""
    return aggregate(-logprobs * advantages.detach(), mask, aggregation, length, dim)


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
