"""Data parallelism under PyTorch's own launcher: `torchrun --nproc_per_node N -m rlhf_toy.lm STAGE ...`.

In one process every function here is a no-op (rank 0 of 1) and no launcher is needed. Under torchrun:
- `init_distributed` joins the process group torchrun describes (gloo on CPU, NCCL on GPU; one GPU per rank);
- each rank seeds itself with `seed + rank`, so it draws its own prompts and samples;
- `data_parallel` wraps a model in `DistributedDataParallel`, which averages gradients across ranks in backward;
- `mean_across_ranks` averages logged metrics, so logs mean the same thing at any world size;
- only rank 0 writes (`is_main`), and `barrier` keeps the others from reading before it has written.
Every rank runs the same number of minibatches and collective calls whatever its replies' lengths: batch sizes
are per rank and equal, and any early stop is decided on values averaged across ranks.
"""

from __future__ import annotations

import datetime
import gc
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .errors import UserError


def rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    return rank_and_world()[0] == 0


def launched_world() -> int:
    """The world size torchrun announced in the environment (1 without a launcher)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise UserError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number; launch with torchrun") from None


COLLECTIVE_TIMEOUT_S = 1800  # torch's own default for gloo; NCCL's is 10 minutes


def init_distributed(device: torch.device, timeout_s: float = COLLECTIVE_TIMEOUT_S) -> torch.device:
    """Join torchrun's process group once (gloo on CPU, NCCL on CUDA); returns this rank's device.

    `timeout_s` bounds every collective: a rank that stops (a stopped or hung process, not a dead one, which
    torchrun already handles) makes the others fail with an error after that long instead of waiting forever;
    torchrun then stops the group."""
    if launched_world() <= 1:
        return device
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    return device


def leave_distributed(clean: bool) -> None:
    """Leave torchrun's process group before the interpreter exits (nothing in one process).

    A process that exits with the group alive tears gloo down during interpreter finalization, when its worker
    threads may still hold work whose tensors need the interpreter: the rank aborted ("terminate called without an
    active exception", SIGABRT) at the end of a resumed run in one suite walk of 2026-12-07, after every write.
    `clean` (the command succeeded, so every rank ran the same collectives): wait for all ranks first, so none
    tears down while a peer still talks to it. After an error the ranks may be out of step: leave at once (torchrun
    stops the group when any rank fails)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if clean:
        dist.barrier()
    gc.collect()  # drop a finished run's DDP wrappers, which hold the group's communication state
    dist.destroy_process_group()


def barrier() -> None:
    if rank_and_world()[1] > 1:
        dist.barrier()


def mean_across_ranks(metrics: dict[str, float]) -> dict[str, float]:
    _, world = rank_and_world()
    if world == 1:
        return metrics
    keys = sorted(metrics)
    t = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return {k: float(v) / world for k, v in zip(keys, t.tolist())}


def any_rank(flag: bool) -> bool:
    """True on every rank if it is True on any (a decision all ranks must take together)."""
    if rank_and_world()[1] == 1:
        return flag
    t = torch.tensor([float(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (one process: `[obj]`)."""
    _, world = rank_and_world()
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


class DataParallelActorCritic(nn.parallel.DistributedDataParallel):
    """DDP around an `ActorCritic` whose `forward` is its `evaluate`: `ppo_update` calls `evaluate`, and DDP
    averages the gradients of every backward pass across ranks."""

    def evaluate(self, observations: Any, actions: torch.Tensor):
        return self(observations, actions)


def data_parallel(module: nn.Module, actor_critic: bool = False) -> nn.Module:
    """`module` wrapped in DDP under torchrun (parameters broadcast from rank 0), itself in one process."""
    if rank_and_world()[1] == 1:
        return module
    device = next(module.parameters()).device
    ids = [device.index] if device.type == "cuda" else None
    cls = DataParallelActorCritic if actor_critic else nn.parallel.DistributedDataParallel
    return cls(module, device_ids=ids)


def shard(items: list[Any]) -> list[Any]:
    """This rank's share of `items`, every rank the same count (the tail that does not divide is dropped)."""
    rank, world = rank_and_world()
    n = len(items) // world * world
    return items[rank:n:world]


def check_in_sync(module: nn.Module) -> None:
    """Under torchrun: raise if this rank's trainable weights differ from rank 0's (a float64 checksum)."""
    if rank_and_world()[1] == 1:
        return
    with torch.no_grad():
        total = sum(float(p.detach().double().sum()) for p in module.parameters() if p.requires_grad)
    sums = gather(total)
    if any(s != sums[0] for s in sums):
        raise RuntimeError(f"data-parallel ranks out of sync: weight checksums {sums}")
