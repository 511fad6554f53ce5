"""Seeding: one call makes a run reproducible on the same machine."""

from __future__ import annotations

import random

import numpy as np
import torch

from .runtime import keep_freed_memory


def seed_everything(seed: int, threads: int | None = None) -> torch.Generator:
    """Seed Python, NumPy and torch; optionally fix torch's thread count (results depend on it).

    Also sets the process up for fast CPU training (`runtime.keep_freed_memory`: it changes no number).
    Returns a dedicated `torch.Generator` for sampling and shuffling, so that library code that draws from
    the global generator cannot shift the run's random stream.
    """
    keep_freed_memory()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.Generator().manual_seed(seed)
