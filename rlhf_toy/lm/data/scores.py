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
    not_numbers = UserError(f"{where} returned {repr(values)[:80]}, not numbers; return one float per {unit} ({n})")
    # torch reads a dict as its keys and a string as its characters' digits: neither is a list of numbers
    if isinstance(values, (str, bytes, dict, set)) or (
        isinstance(values, (list, tuple)) and any(isinstance(v, (str, bytes, dict, set)) for v in values)
    ):
        raise not_numbers
    try:
        wide = torch.as_tensor(values, dtype=torch.float64).detach().cpu()
    except (TypeError, ValueError, RuntimeError):
        raise not_numbers from None
    units = "replies" if unit == "reply" else f"{unit}s"
    if wide.dim() != 1 or wide.shape[0] != n:
        raise UserError(
            f"{where} returned shape {tuple(wide.shape)} for {n} {units}; return a list of {n} floats, one per {unit}"
        )
    bad = (~torch.isfinite(wide)).nonzero().flatten()
    if len(bad):
        i = int(bad[0])
        raise UserError(
            f"{where} returned {wide[i].item()} for {unit} {i} ({len(bad)} of {n} not finite); return finite numbers"
            " (nothing was updated)"
        )
    scores = wide.to(dtype)
    big = (~torch.isfinite(scores)).nonzero().flatten()  # finite in float64, beyond the narrower type's range
    if len(big):
        i = int(big[0])
        raise UserError(
            f"{where} returned {wide[i].item():g} for {unit} {i}, beyond {dtype}'s range "
            f"(±{torch.finfo(dtype).max:.3g}); return rewards of a sensible scale, e.g. in [-10, 10] (nothing was "
            "updated)"
        )
    return scores
