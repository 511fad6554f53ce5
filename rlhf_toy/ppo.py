"""The PPO update: epochs of shuffled minibatches over one batch of experience.

Anything that implements `ActorCritic.evaluate` can be trained: a CartPole MLP (one sample = one env step)
and a language model (one sample = one sequence of tokens, with a padding mask) both turn their experience
into a `RolloutBatch` and call `ppo_update`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from .config import TracksGiven, check, option
from .distributed import any_rank
from .errors import UserError
from .losses import (
    AGGREGATIONS,
    RATIO_LEVELS,
    aggregate,
    clipped_policy_loss,
    explained_variance,
    kl_estimate,
    policy_gradient_loss,
    value_loss,
)
from .masks import Dims, masked_mean, masked_whiten


class NonFiniteUpdate(UserError):
    """`ppo_update` met a non-finite loss or gradient and stopped before stepping on it."""


class RolloutBatch(NamedTuple):
    """Experience flattened to samples on the first dimension.

    `observations` is a tensor `[B, ...]` or a tuple/dict of them (e.g. token ids and attention mask);
    `actions` is `[B, ...]`; the per-step tensors below share one shape `[B, *S]` (`S` empty for env
    steps, `[L]` for L tokens). `mask` marks the real steps (None = all real). `ref_logprobs` (optional) are a
    frozen reference policy's log-probs of the actions, for a KL penalty in the loss (GRPO's).
    """

    observations: Any
    actions: Tensor
    logprobs: Tensor
    values: Tensor
    advantages: Tensor
    returns: Tensor
    mask: Tensor | None = None
    ref_logprobs: Tensor | None = None


class ActorCritic(Protocol):
    """The small protocol the update needs (an `nn.Module` that also has this method)."""

    def evaluate(self, observations: Any, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Return `(logprobs, entropy, values)` for the given actions, each shaped `[B, *S]` like
        `RolloutBatch.logprobs`; gradients must flow into the parameters being trained."""
        ...


@dataclass(frozen=True)
class PPOConfig(TracksGiven):
    """Hyperparameters of the PPO update and of GAE. Validated on construction; frozen, so a preset (a module-
    level instance such as `cartpole.train.CARTPOLE_PPO`) cannot be changed by accident: derive a variant with
    `dataclasses.replace(preset, field=value)`."""

    learning_rate: float = option("Adam learning rate at the start of training.", 3e-4)
    anneal_lr: bool = option("Anneal the learning rate linearly to 0 over training.", True)
    n_epochs: int = option("Passes over each batch of experience.", 10)
    minibatch_size: int = option("Samples per gradient step (env steps, or sequences for a language model).", 64)
    gamma: float = option("Discount factor.", 0.99)
    gae_lambda: float = option("GAE lambda: 0 is one-step TD, 1 is Monte-Carlo.", 0.95)
    clip: bool = option("Clip the policy ratio; --no_clip gives the unclipped surrogate.", True)
    clip_range: float = option("Policy ratio clip epsilon: r is kept in [1 - eps, 1 + eps].", 0.2)
    clip_range_high: float | None = option(
        "Upper clip epsilon (DAPO's clip-higher): r is kept in [1 - clip_range, 1 + this] (None: clip_range).", None
    )
    ratio_level: str = option(
        "token: one ratio per token (PPO, GRPO); sequence: one per reply, its tokens' mean log-ratio (GSPO).", "token"
    )
    loss_aggregation: str = option(
        "How per-token losses become one: token (mean over the minibatch's tokens), sequence (each reply's mean, "
        "then the mean over replies: GRPO) or constant (sum / (replies x max_new_tokens): Dr. GRPO).",
        "token",
    )
    anneal_clip: bool = option("Anneal clip_range linearly to 0 over training (rl-zoo style).", False)
    clip_range_vf: float | None = option("Clip the value prediction to old value +/- this (None: no clip).", None)
    normalize_advantages: bool = option("Normalize advantages to mean 0, std 1 in each minibatch.", True)
    ent_coef: float = option("Weight of the entropy bonus.", 0.0)
    vf_coef: float = option("Weight of the value loss.", 0.5)
    max_grad_norm: float | None = option("Clip the global gradient norm to this (None: no clip).", 0.5)
    target_kl: float | None = option("Stop the epochs early once approx KL > 1.5 x this (None: never).", None)
    adam_eps: float = option("Adam epsilon.", 1e-5)

    def __post_init__(self) -> None:
        check(self.learning_rate > 0, "learning_rate", self.learning_rate, "> 0, e.g. 3e-4")
        check(self.n_epochs >= 1, "n_epochs", self.n_epochs, "an integer >= 1")
        check(self.minibatch_size >= 1, "minibatch_size", self.minibatch_size, "an integer >= 1")
        check(0.0 <= self.gamma <= 1.0, "gamma", self.gamma, "in [0, 1], e.g. 0.99")
        check(0.0 <= self.gae_lambda <= 1.0, "gae_lambda", self.gae_lambda, "in [0, 1], e.g. 0.95")
        check(self.clip_range > 0, "clip_range", self.clip_range, "> 0, e.g. 0.2 (use --no_clip to disable)")
        check(
            self.clip_range_high is None or self.clip_range_high >= self.clip_range,
            "clip_range_high",
            self.clip_range_high,
            f">= clip_range ({self.clip_range}; eps_high below eps_low is the opposite of clip-higher)",
        )
        check(self.ratio_level in RATIO_LEVELS, "ratio_level", self.ratio_level, " or ".join(RATIO_LEVELS))
        check(self.loss_aggregation in AGGREGATIONS, "loss_aggregation", self.loss_aggregation, ", ".join(AGGREGATIONS))
        check(self.clip_range_vf is None or self.clip_range_vf > 0, "clip_range_vf", self.clip_range_vf, "> 0")
        check(self.ent_coef >= 0, "ent_coef", self.ent_coef, ">= 0")
        check(self.vf_coef >= 0, "vf_coef", self.vf_coef, ">= 0")
        check(self.max_grad_norm is None or self.max_grad_norm > 0, "max_grad_norm", self.max_grad_norm, "> 0")
        check(self.target_kl is None or self.target_kl > 0, "target_kl", self.target_kl, "> 0, e.g. 0.02")
        check(self.adam_eps > 0, "adam_eps", self.adam_eps, "> 0, e.g. 1e-5")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def index_observations(observations: Any, idx: Tensor) -> Any:
    """Select samples `idx` from a tensor, or from each tensor of a tuple/list/dict."""
    if isinstance(observations, Tensor):
        return observations[idx]
    if isinstance(observations, dict):
        return {k: index_observations(v, idx) for k, v in observations.items()}
    if isinstance(observations, (tuple, list)):
        return type(observations)(index_observations(v, idx) for v in observations)
    raise TypeError(f"observations must be a tensor or a tuple/list/dict of tensors, not {type(observations)}")


def make_optimizer(params: Any, cfg: PPOConfig) -> torch.optim.Optimizer:
    """Adam with the config's learning rate and epsilon (eps 1e-5 as in the PPO implementations)."""
    return torch.optim.Adam(params, lr=cfg.learning_rate, eps=cfg.adam_eps, fused=True)


def current_schedule(cfg: PPOConfig, progress: float) -> tuple[float, float | None]:
    """Learning rate and clip range after `progress` (0 at the start of training, 1 at the end)."""
    remaining = max(0.0, 1.0 - progress)
    lr = cfg.learning_rate * (remaining if cfg.anneal_lr else 1.0)
    clip = cfg.clip_range * (remaining if cfg.anneal_clip else 1.0) if cfg.clip else None
    return lr, clip


def set_learning_rates(
    optimizer: torch.optim.Optimizer, lr: float, lr_scales: Sequence[float] | None = None
) -> list[Tensor]:
    """Set each param group's lr to `lr` times its scale (default 1); returns all the parameters."""
    scales = [1.0] * len(optimizer.param_groups) if lr_scales is None else list(lr_scales)
    if len(scales) != len(optimizer.param_groups):
        raise ValueError(f"lr_scales has {len(scales)} values for {len(optimizer.param_groups)} param groups")
    for group, scale in zip(optimizer.param_groups, scales):
        group["lr"] = lr * scale
    return [p for group in optimizer.param_groups for p in group["params"]]


STAT_KEYS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "kl_loss")
POLICY_LOSSES = ("clipped", "pg")  # PPO's clipped surrogate (clip_range None: unclipped); plain REINFORCE


def minibatch(batch: RolloutBatch, idx: Tensor) -> RolloutBatch:
    """The samples `idx` of a batch (every field, observations of any structure)."""
    return RolloutBatch(
        index_observations(batch.observations, idx),
        batch.actions[idx],
        batch.logprobs[idx],
        batch.values[idx],
        batch.advantages[idx],
        batch.returns[idx],
        None if batch.mask is None else batch.mask[idx],
        None if batch.ref_logprobs is None else batch.ref_logprobs[idx],
    )


def trimmed(mb: RolloutBatch) -> RolloutBatch:
    """A minibatch of token rows `[b, L]` without the columns after its last real token: a causal model's later
    positions change nothing before them, and the loss reads real tokens only (the same numbers, less work)."""
    if mb.mask is None or mb.actions.dim() != 2:
        return mb
    real = mb.mask.bool().any(0).nonzero()
    end = int(real.max()) + 1 if len(real) else 1
    if end == mb.actions.shape[1]:
        return mb
    ref = None if mb.ref_logprobs is None else mb.ref_logprobs[:, :end]
    return RolloutBatch(
        mb.observations, mb.actions[:, :end], mb.logprobs[:, :end], mb.values[:, :end], mb.advantages[:, :end],
        mb.returns[:, :end], mb.mask[:, :end], ref,
    )  # fmt: skip


def length_groups(lengths: list[int], overhead: int) -> list[list[int]]:
    """The rows `0..n-1` of lengths `lengths` cut into groups of similar length, each to be run as long as its
    longest: the cut that minimizes the positions run, sum(rows x longest), plus `overhead` positions a group (what
    one more forward call costs). Sorted shortest first; a dynamic program over the cut points (n is a minibatch)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    sorted_lengths = [max(1, lengths[i]) for i in order]
    best = [0.0] + [math.inf] * len(order)  # best[j]: the cost of the first j rows
    cut = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(j):  # rows i..j-1 in one group, run at the longest's length
            cost = best[i] + (j - i) * sorted_lengths[j - 1] + overhead
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], len(order)
    while j:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def evaluate_by_length(policy: ActorCritic, mb: RolloutBatch) -> tuple[Tensor, Tensor, Tensor]:
    """`policy.evaluate` on a minibatch of token rows `[b, L]` of very different lengths (an agent's episodes, 2 to
    20 turns): the rows run in groups of similar length (`length_groups`), each trimmed to its longest, and the
    outputs come back in the minibatch's order and width `[b, L]` (zeros after each row's last real token, where the
    mask reads nothing). The same numbers to float rounding, gradients included: only padding is not computed, which
    on FrozenLake played through a tool was half of every minibatch (rows of 205 tokens on average, the longest 425).
    Several forward passes before one backward pass: not for a `DistributedDataParallel` module."""
    mask = mb.mask
    if mask is None or mb.actions.dim() != 2:
        return policy.evaluate(mb.observations, mb.actions)
    width = mask.shape[1]
    lengths = (mask.bool() * torch.arange(1, width + 1, device=mask.device)).amax(1).tolist()
    # a pass's fixed cost taken as a quarter of the widest row (the shared prompt runs again each pass); not tuned
    groups = length_groups(lengths, overhead=max(1, width // 4))
    if len(groups) == 1:
        return policy.evaluate(mb.observations, mb.actions)
    parts: list[tuple[Tensor, ...]] = []
    for rows in groups:
        sub = trimmed(minibatch(mb, torch.tensor(rows, device=mask.device)))
        outputs = policy.evaluate(sub.observations, sub.actions)
        parts.append(tuple(torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in outputs))
    back = torch.argsort(torch.tensor([r for rows in groups for r in rows], device=mask.device))  # to mb's order
    logprobs, entropy, values = (torch.cat([p[k] for p in parts])[back] for k in range(3))
    return logprobs, entropy, values


def shuffled_minibatches(
    n: int, size: int, generator: torch.Generator | None = None, group_size: int = 1
) -> tuple[Tensor, ...]:
    """One epoch's minibatch indices: a random order of the `n` samples cut into minibatches of `size`. With
    `group_size` > 1 the samples come in groups of consecutive rows (RLOO's and GRPO's k replies to one prompt)
    and whole groups are shuffled, so a minibatch holds whole groups (as TRL's trainers have them): their
    advantages sum to zero within it, and the replies share their prompt's forward pass. `group_size` 1 draws
    exactly `torch.randperm(n)`."""
    order = torch.randperm(n // group_size, generator=generator)
    if group_size > 1:
        order = (order[:, None] * group_size + torch.arange(group_size)).flatten()
    return order.split(size)


def episode_minibatches(episodes: Tensor, size: int, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
    """One epoch's minibatch indices when samples come in episodes of different lengths (an agent's turns): `episodes
    [n]` the episode of each sample, consecutive; the episodes are shuffled and every minibatch holds all the samples
    of `size` of them. The number of gradient steps per epoch is then the batch's episodes / `size`, however long
    the episodes were."""
    starts = torch.cat([torch.ones(1, dtype=torch.bool), episodes[1:] != episodes[:-1]]).nonzero().flatten()
    spans = torch.cat([starts, torch.tensor([len(episodes)])])
    order = torch.randperm(len(starts), generator=generator)
    rows = [torch.arange(int(spans[e]), int(spans[e + 1])) for e in range(len(starts))]
    return tuple(torch.cat([rows[e] for e in chunk.tolist()]) for chunk in order.split(size))


def minibatch_loss(
    logprobs: Tensor,
    entropy: Tensor,
    values: Tensor,
    mb: RolloutBatch,
    cfg: PPOConfig,
    clip_range: float | None,
    policy_loss: str = "clipped",
    kl_loss_coef: float = 0.0,
    dim: Dims = None,
    kl_estimator: str = "k3",
    length: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's loss on one minibatch, from the policy's fresh `(logprobs, entropy, values)` (each `[b, *S]`).

    Advantages are normalized over the minibatch's real steps (if enabled), then: the policy loss (`clipped`:
    the clipped surrogate; `pg`: REINFORCE's -log pi * A) + vf_coef * (clipped) value loss - ent_coef * entropy
    (+ kl_loss_coef * the `kl_estimator` KL to `mb.ref_logprobs`: GRPO's k3 in the loss, or k2). The policy and KL
    terms are reduced by `cfg.loss_aggregation` (`length`: the constant of "constant", the generation limit).
    Returns the scalar loss and its parts (`policy_loss`, `value_loss`, `entropy`, `approx_kl`, `clip_fraction`,
    `kl_loss`; diagnostics detached).
    `dim` (as in `masked_mean`) runs it on independent problems at once: a population's `[N, b]` tensors with
    `dim=1` give every agent its own advantage normalization and loss, the loss and each part shaped `[N]`
    (`rlhf_toy.population`).
    """
    advantages = mb.advantages
    dims = range(advantages.dim()) if dim is None else (dim,) if isinstance(dim, int) else dim
    if cfg.normalize_advantages and math.prod(advantages.shape[d] for d in dims) > 1:  # > 1 sample per problem
        advantages = masked_whiten(advantages, mb.mask, dim=dim)
    how = cfg.loss_aggregation
    high = None  # eps_high follows eps_low's schedule (anneal_clip)
    if clip_range is not None and cfg.clip_range_high is not None:
        high = cfg.clip_range_high * clip_range / cfg.clip_range
    pg = clipped_policy_loss(
        logprobs, mb.logprobs, advantages, clip_range, mb.mask, dim, high, cfg.ratio_level, how, length
    )
    if policy_loss == "clipped":
        p_loss = pg.loss
    else:
        p_loss = policy_gradient_loss(logprobs, advantages, mb.mask, dim, how, length)
    v_loss = value_loss(values, mb.values, mb.returns, cfg.clip_range_vf, mb.mask, dim)
    loss = p_loss + cfg.vf_coef * v_loss
    kl = torch.zeros_like(loss)
    if kl_loss_coef > 0 and mb.ref_logprobs is not None:
        kl = aggregate(kl_estimate(logprobs, mb.ref_logprobs, kl_estimator), mb.mask, how, length, dim)
        loss = loss + kl_loss_coef * kl
    if cfg.ent_coef > 0:
        ent = masked_mean(entropy, mb.mask, dim)
        loss = loss - cfg.ent_coef * ent
    else:  # keep the entropy out of the graph: a backward pass through it costs time for nothing
        ent = masked_mean(entropy.detach(), mb.mask, dim)
    return loss, {
        "policy_loss": p_loss,
        "value_loss": v_loss,
        "entropy": ent,
        "approx_kl": pg.approx_kl,
        "clip_fraction": pg.clip_fraction,
        "kl_loss": kl.detach(),
    }


def ppo_update(
    policy: Any,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    cfg: PPOConfig,
    *,
    progress: float = 0.0,
    generator: torch.Generator | None = None,
    lr_scales: Sequence[float] | None = None,
    policy_loss: str = "clipped",
    kl_loss_coef: float = 0.0,
    group_size: int = 1,
    kl_estimator: str = "k3",
    length: int | None = None,
    episodes: Tensor | None = None,
    trim: bool = False,
) -> dict[str, float]:
    """Run `cfg.n_epochs` epochs of shuffled minibatches of PPO on `batch`. Returns mean diagnostics.

    `policy` implements `ActorCritic`; `progress` in [0, 1] drives learning-rate and clip annealing;
    `generator` makes the shuffling reproducible; `lr_scales` gives each optimizer param group its learning rate
    as a multiple of the scheduled one (default: 1 for every group; e.g. a freshly initialised value head may
    learn faster than a pretrained language model). `policy_loss` "pg" makes it REINFORCE's update (RLOO's
    too) and `kl_loss_coef` adds a `kl_estimator` (k3: GRPO's; k2) KL to `batch.ref_logprobs` to the loss; `length`
    is the constant of `cfg.loss_aggregation` "constant" (Dr. GRPO: the generation limit); see `minibatch_loss`.
    `group_size` > 1 keeps groups of that many consecutive samples whole in every minibatch
    (`shuffled_minibatches`); `episodes` (`[n]`, each sample's episode, consecutive) makes `cfg.minibatch_size`
    count episodes, each minibatch all the samples of its episodes (`episode_minibatches`: an agent's turns);
    `trim` (rows of very different lengths) drops each minibatch's columns after its last real token (`trimmed`) and
    runs its rows in groups of similar length (`evaluate_by_length`).
    Each minibatch: normalize advantages (if enabled, over
    its real steps), clipped surrogate + value loss - entropy bonus, global grad-norm clip, Adam step.
    """
    if policy_loss not in POLICY_LOSSES:
        raise ValueError(f"policy_loss must be one of {POLICY_LOSSES}, not {policy_loss!r}")
    lr, clip_range = current_schedule(cfg, progress)
    params = set_learning_rates(optimizer, lr, lr_scales)

    n = batch.actions.shape[0]
    if n % group_size:
        raise ValueError(f"a batch of {n} samples is not made of whole groups of {group_size}")
    stats: dict[str, list[Tensor]] = {k: [] for k in STAT_KEYS}
    norms: list[Tensor] = []
    early_stop, epochs_done = False, 0
    for epoch in range(cfg.n_epochs):
        order = (
            shuffled_minibatches(n, cfg.minibatch_size, generator, group_size)
            if episodes is None
            else episode_minibatches(episodes, cfg.minibatch_size, generator)
        )
        for idx in order:
            if trim:  # rows of very different lengths: cut to the longest, run in groups of similar length
                mb = trimmed(minibatch(batch, idx))
                logprobs, entropy, values = evaluate_by_length(policy, mb)
            else:
                mb = minibatch(batch, idx)
                logprobs, entropy, values = policy.evaluate(mb.observations, mb.actions)
            loss, parts = minibatch_loss(
                logprobs, entropy, values, mb, cfg, clip_range, policy_loss, kl_loss_coef, None, kl_estimator, length
            )
            # This minibatch already moved too far: stop before stepping on it (on every rank at once, so that
            # data-parallel ranks stay in lockstep).
            if cfg.target_kl is not None and any_rank(parts["approx_kl"].item() > 1.5 * cfg.target_kl):
                early_stop = True
                break
            # Never step on a non-finite loss or gradient: the weights would all become NaN (on every rank at once).
            if any_rank(not bool(torch.isfinite(loss))):
                raise NonFiniteUpdate(f"the loss is {loss.item()} (epoch {epoch + 1}); nothing was updated on it")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            # The global norm before clipping (clipping to infinity scales nothing): a diagnostic either way.
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm or float("inf"))
            if not bool(torch.isfinite(norm)):
                raise NonFiniteUpdate(f"the gradient norm is {norm.item()} (epoch {epoch + 1}); nothing was updated")
            optimizer.step()
            for k in STAT_KEYS:
                stats[k].append(parts[k].detach())
            norms.append(norm.detach())
        if early_stop:
            break
        epochs_done += 1

    out = {k: (torch.stack(v).mean().item() if v else float("nan")) for k, v in stats.items()}
    out.update(
        explained_variance=float(explained_variance(batch.values, batch.returns, batch.mask)),
        learning_rate=lr,
        clip_range=float("nan") if clip_range is None else clip_range,
        epochs=float(epochs_done),
        early_stop=float(early_stop),
        gradient_steps=float(len(stats["policy_loss"])),
        grad_norm=torch.stack(norms).mean().item() if norms else float("nan"),
    )
    return out
