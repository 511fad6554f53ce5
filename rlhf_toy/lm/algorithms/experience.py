"""`Experience`: one step's rollouts, as the online RLHF loop (`rlhf.py`) builds them and the core's `ppo_update`
trains on them; and the same as tensors and plain types, for a checkpoint (`--async_rollouts` saves the batch it
sampled ahead)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from torch import Tensor

from rlhf_toy.ppo import RolloutBatch


@dataclass
class Experience:
    """One step's rollouts: everything `ppo_update` and the logs need. Tensors are `[B, R]` unless noted."""

    batch: RolloutBatch  # its mask is the loss's (without truncated replies under `mask_truncated`)
    scores: Tensor  # [B] reward-model scores (after any EOS or overlong penalty)
    kl: Tensor  # [B, R] per-token k1 KL (0 on padding): what is logged
    texts: list[str]
    eos: Tensor  # [B]
    entropy: Tensor
    prompts: list[str]  # [B] the prompts sampled (dynamic sampling draws more than one batch of them)
    response_mask: Tensor  # [B, R] 1 on every real response token
    sampling: dict[str, float]  # the sampling's own figures (equal groups, rounds)
    beta: float = 0.0  # the KL coefficient its rewards were shaped with
    version: int = 0  # the policy it was sampled with: the number of updates before it (`--async_rollouts`)


def shallow(obj: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, its values as they are (`asdict` would copy every tensor)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def experience_state(exp: Experience) -> dict[str, Any]:
    """An `Experience` as tensors and plain types (a checkpoint is read with `weights_only=True`)."""
    return {**shallow(exp), "batch": tuple(exp.batch)}


def experience_from_state(state: dict[str, Any]) -> Experience:
    return Experience(**{**state, "batch": RolloutBatch(*state["batch"])})
