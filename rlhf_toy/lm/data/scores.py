"""One check for every reward, judge and checker's output: one finite number per reply."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rlhf_toy.errors import UserError


def check_scores(values: Any, n: int, where: str, unit: str = "reply", dtype: torch.dtype = torch.float32) -> Tensor:
    """`values` as a float `[n]` tensor (CPU), or a `UserError` naming `where` (the reward model, function or judge,
    as the user knows it) and what it returned: one finite number per `unit`, not a scalar to broadcast, not a
    table, not text or None (`dtype`: float64 keeps a Python float exactly). Rewards are checked before any
    update, so that a bad one never reaches the weights."""
    try:
        scores = torch.as_tensor(values, dtype=dtype).detach().cpu()
    except (TypeError, ValueError, RuntimeError):
        shown = repr(values)[:80]
        raise UserError(f"{where} returned {shown}, not numbers; return one float per {unit} ({n})") from None
    units = "replies" if unit == "reply" else f"{unit}s"
    if scores.dim() != 1 or scores.shape[0] != n:
        raise UserError(
            f"{where} returned shape {tuple(scores.shape)} for {n} {units}; return a list of {n} floats, one per {unit}"
        )
    bad = (~torch.isfinite(scores)).nonzero().flatten()
    if len(bad):
        i = int(bad[0])
        raise UserError(
            f"{where} returned {scores[i].item()} for {unit} {i} ({len(bad)} of {n} not finite); return finite numbers"
            " (nothing was updated)"
        )
    return scores
