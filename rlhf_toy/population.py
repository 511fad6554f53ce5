"""PPO for a population: N independent agents whose parameters are stacked on a leading dimension and trained
as one batched program (PureJaxRL's idea, in torch on a CPU).

The policy holds every parameter as `[N, ...]` and evaluates `[N, b, ...]` minibatches at once (e.g. with
batched matmuls). `population_ppo_update` runs the core's own minibatch loss (`rlhf_toy.ppo.minibatch_loss`)
with `dim=1`, one loss per agent, so each agent gets what `ppo_update` would give it alone: its own minibatch
order (its own generator), its own advantage normalization, its own gradient-norm clip, its own KL early stop,
and its own Adam moments (Adam is elementwise, so one Adam over stacked tensors is N Adams). One difference:
Adam's step count is shared, so with `target_kl` an agent that stopped early counts the skipped steps in its
bias correction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from .losses import explained_variance
from .ppo import STAT_KEYS, PPOConfig, RolloutBatch, current_schedule, minibatch_loss, set_learning_rates


class PopulationActorCritic(Protocol):
    """`evaluate(observations [N, b, ...], actions [N, b]) -> (logprobs, entropy, values)`, each `[N, b]`;
    every parameter has the population on its first dimension."""

    def evaluate(self, observations: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]: ...


def per_agent(batch: RolloutBatch, idx: Tensor) -> RolloutBatch:
    """Samples `idx [N, b]` of each agent from a population batch whose fields are `[N, n, ...]`."""

    def pick(x: Tensor) -> Tensor:  # x[k, idx[k]] for every k (gather: 2-3x quicker than x[rows, idx] here)
        return x.gather(1, idx.view(*idx.shape, *[1] * (x.dim() - 2)).expand(-1, -1, *x.shape[2:]))

    mask = batch.mask if batch.mask is not None else torch.ones_like(batch.advantages, dtype=torch.bool)
    return RolloutBatch(
        pick(batch.observations),
        pick(batch.actions),
        pick(batch.logprobs),
        pick(batch.values),
        pick(batch.advantages),
        pick(batch.returns),
        pick(mask),
    )


def clip_grad_norm_per_agent(params: Sequence[Tensor], max_norm: float) -> Tensor:
    """`torch.nn.utils.clip_grad_norm_` for each agent separately: `[N, ...]` grads; returns the norms `[N]`."""
    grads = [p.grad for p in params if p.grad is not None]
    if len(grads) != len(params):
        raise ValueError("clip_grad_norm_per_agent: every parameter needs a gradient (call backward first)")
    norms = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads]), dim=0)
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(grads, [coef.view(-1, *[1] * (g.dim() - 1)) for g in grads])
    return norms


def step_agents(optimizer: torch.optim.Optimizer, params: Sequence[Tensor], active: Tensor) -> None:
    """`optimizer.step()` for the agents where `active [N]` is set; the others keep their parameters and moments."""
    if bool(active.all()):
        optimizer.step()
        return
    keep = ~active
    saved = [
        (
            p,
            p.detach()[keep].clone(),
            {k: v[keep].clone() for k, v in optimizer.state[p].items() if torch.is_tensor(v) and v.dim() > 0},
        )
        for p in params
    ]
    optimizer.step()
    with torch.no_grad():
        for p, old, state in saved:
            p[keep] = old
            for k, v in state.items():
                optimizer.state[p][k][keep] = v


def population_ppo_update(
    policy: Any,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    cfg: PPOConfig,
    *,
    generators: Sequence[torch.Generator],
    progress: float = 0.0,
    lr_scales: Sequence[float] | None = None,
) -> dict[str, Tensor]:
    """`ppo_update` for each of N agents at once. `batch` fields are `[N, n, ...]`; `generators[k]` shuffles
    agent k's minibatches. Returns each diagnostic of `ppo_update` as an `[N]` tensor."""
    lr, clip_range = current_schedule(cfg, progress)
    params = set_learning_rates(optimizer, lr, lr_scales)
    N, n = batch.actions.shape[:2]
    active = torch.ones(N, dtype=torch.bool)  # agents still updating (each stops at its own KL limit)
    epochs_done = torch.zeros(N)
    sums = torch.zeros(len(STAT_KEYS), N)  # each diagnostic's running sum over the steps an agent took
    steps = torch.zeros(N)
    for _epoch in range(cfg.n_epochs):
        # Each agent draws its own order; an agent that stopped draws nothing, as its single run would not.
        perms = torch.stack(
            [torch.randperm(n, generator=g) if a else torch.arange(n) for g, a in zip(generators, active.tolist())]
        )
        shuffled = per_agent(batch, perms)  # one gather an epoch; each minibatch is then a view
        for start in range(0, n, cfg.minibatch_size):
            fields = [x for x in shuffled[:7] if x is not None]  # per_agent set every field, the mask included
            mb = RolloutBatch(*(x[:, start : start + cfg.minibatch_size] for x in fields))
            logprobs, entropy, values = policy.evaluate(mb.observations, mb.actions)
            # The core's loss reduced over each agent's samples only (dim 1): `[N]` losses and parts. (torch.vmap
            # over agents gives the same numbers and cost 0.6 ms more a minibatch here, ~8% of a population's time.)
            losses, parts = minibatch_loss(logprobs, entropy, values, mb, cfg, clip_range, dim=1)
            if cfg.target_kl is not None:
                active = active & ~(parts["approx_kl"] > 1.5 * cfg.target_kl)
                if not bool(active.any()):
                    break
            for p in params:  # optimizer.zero_grad(set_to_none=True), without its profiler hook's ~40 us a step
                p.grad = None
            (losses * active).sum().backward()  # disjoint parameters: agent k's gradient is its own loss's
            if cfg.max_grad_norm is not None:
                clip_grad_norm_per_agent(params, cfg.max_grad_norm)
            step_agents(optimizer, params, active)
            sums += torch.where(active, torch.stack([parts[k].detach() for k in STAT_KEYS]), 0.0)
            steps += active
        epochs_done += active
        if not bool(active.any()):
            break
    out = {k: sums[i] / steps for i, k in enumerate(STAT_KEYS)}  # NaN for an agent that never stepped, as ppo_update's
    mask = batch.mask
    out.update(
        explained_variance=torch.as_tensor(explained_variance(batch.values, batch.returns, mask, dim=1)),
        learning_rate=torch.full((N,), lr),
        clip_range=torch.full((N,), float("nan") if clip_range is None else clip_range),
        epochs=epochs_done,
        early_stop=(~active).float(),
        gradient_steps=steps,
    )
    return out
