"""Returns and generalized advantage estimation (GAE) on time-major tensors.

Shapes: every tensor is `[T, *B]`, time first, then any batch dimensions (`[T, N]` for N vector envs,
`[L, B]` for B token sequences of length L). Each step t has:

- `rewards[t]`: the reward received after acting at t.
- `values[t]`: V(s_t) from the critic that collected the data.
- `next_values[t]`: V(s_{t+1}), the value of the observation that followed step t. At a *truncated* step
  this must be V(final observation) (the state the time limit cut off), so the estimate bootstraps through
  the cut; at a *terminated* step it is ignored (a true terminal state is worth 0).
- `terminated[t]`: the episode ended at t in a terminal state: no bootstrap.
- `truncated[t]`: the episode was cut at t (time limit, end of a token budget): bootstrap from
  `next_values[t]`, but do not carry the advantage of the next episode back across the cut.
- `mask[t]`: 0 for padding (tokens after EOS, the ignored step after an autoreset). Padded steps get
  advantage 0 and return 0 and are transparent: the running estimate passes across them unchanged.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .errors import UserError


def _as_float(x: Tensor | None, like: Tensor) -> Tensor:
    if x is None:
        return torch.zeros_like(like)
    return x.to(like.dtype)


def gae(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    truncated: Tensor | None = None,
    *,
    gamma: float,
    lam: float,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016). Returns `(advantages, returns)`.

    Args: see the module docstring; all `[T, *B]`. `gamma` discounts, `lam` trades bias (0: one-step TD)
    against variance (1: Monte-Carlo returns minus the baseline).
    Returns: `advantages [T, *B]`, `returns = advantages + values [T, *B]` (both 0 where masked).

        delta_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1}) - V(s_t)
        A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1},   done = terminated | truncated
    """
    if not (rewards.shape == values.shape == next_values.shape == terminated.shape):
        raise ValueError(
            f"gae: rewards {tuple(rewards.shape)}, values {tuple(values.shape)}, next_values "
            f"{tuple(next_values.shape)} and terminated {tuple(terminated.shape)} must share one [T, *B] shape"
        )
    not_terminal = 1.0 - _as_float(terminated, rewards)
    done = torch.clamp(_as_float(terminated, rewards) + _as_float(truncated, rewards), max=1.0)
    real = torch.ones_like(rewards) if mask is None else _as_float(mask, rewards)
    # Work on detached copies: advantages are targets, never differentiated through.
    values, next_values = values.detach(), next_values.detach()

    deltas = (rewards + gamma * not_terminal * next_values - values) * real
    carry_factor = gamma * lam * (1.0 - done)
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        # A padded step neither adds a delta nor cuts the chain: `running` passes through it unchanged.
        step = deltas[t] + carry_factor[t] * running
        running = real[t] * step + (1.0 - real[t]) * running
        advantages[t] = real[t] * step
    returns = (advantages + values) * real
    return advantages, returns


def discounted_returns(rewards: Tensor, dones: Tensor, *, gamma: float, mask: Tensor | None = None) -> Tensor:
    """Discounted return G_t = r_t + gamma * (1 - done_t) * G_{t+1}, with no bootstrap. `[T, *B] -> [T, *B]`.

    This is GAE with lambda = 1 and a zero critic, so it is computed by `gae` (one recursion to trust).
    Used by REINFORCE, which updates on whole finished episodes.
    """
    zeros = torch.zeros_like(rewards, dtype=torch.result_type(rewards, 1.0))
    _, returns = gae(rewards.to(zeros.dtype), zeros, zeros, dones, gamma=gamma, lam=1.0, mask=mask)
    return returns


def _groups(rewards: Tensor, group_size: int) -> Tensor:
    """`[B]` rewards of B / k prompts with k samples each (consecutive) -> `[B / k, k]`."""
    if group_size < 2:
        raise UserError(
            f"group_size must be >= 2 to compare samples of one prompt (got {group_size}); pass --group_size 4"
        )
    if rewards.dim() != 1 or rewards.shape[0] % group_size:
        raise UserError(
            f"the batch ({tuple(rewards.shape)}) is not a whole number of groups of {group_size}; "
            "make the batch size a multiple of --group_size"
        )
    return rewards.view(-1, group_size)


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """RLOO (Ahmadian et al. 2024): each sample's reward minus the mean of the *other* k - 1 samples of its
    prompt. `rewards [B]`, consecutive groups of `group_size` -> advantages `[B]`. No critic."""
    g = _groups(rewards, group_size)
    k = group_size
    baseline = (g.sum(1, keepdim=True) - g) / (k - 1)  # leave-one-out mean
    return (g - baseline).reshape(-1)


def grpo_advantages(rewards: Tensor, group_size: int, eps: float = 1e-4) -> Tensor:
    """GRPO (Shao et al. 2024): rewards normalized within each prompt's group, (r - mean) / (std + eps), with
    the unbiased std. A group whose rewards are all equal gets 0. `rewards [B]` -> advantages `[B]`."""
    g = _groups(rewards, group_size)
    return ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + eps)).reshape(-1)


def dr_grpo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """Dr. GRPO (Liu et al. 2025): each reward minus its group's mean, without GRPO's division by the group's std
    (which weights easy and hard prompts unequally). `rewards [B]` -> advantages `[B]`."""
    g = _groups(rewards, group_size)
    return (g - g.mean(1, keepdim=True)).reshape(-1)


def equal_groups(rewards: Tensor, group_size: int) -> Tensor:
    """`[B / k]` bool: True for each group whose k rewards are all equal. Every group baseline gives such a group
    zero advantage, so it teaches nothing (DAPO's dynamic sampling drops it)."""
    g = _groups(rewards, group_size)
    return (g == g[:, :1]).all(1)
