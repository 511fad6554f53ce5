"""Rank, world size and metric averaging, called by the RLHF trainer at every step.

In one process they are no-ops (rank 0 of 1). Under an initialised `torch.distributed` process group, each
rank seeds itself with `seed + rank` and draws its own prompts, and metrics are averaged across ranks, so logs
mean the same thing at any world size. (Gradient averaging across ranks is not built yet.)
"""

from __future__ import annotations

import torch


def rank_and_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def mean_across_ranks(metrics: dict[str, float]) -> dict[str, float]:
    _, world = rank_and_world()
    if world == 1:
        return metrics
    keys = sorted(metrics)
    t = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64)
    torch.distributed.all_reduce(t)
    return {k: float(v) / world for k, v in zip(keys, t.tolist())}
