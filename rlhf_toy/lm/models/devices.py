"""Devices: `--device auto` picks a GPU when there is one; on a GPU with bf16 support the forward passes run under
bf16 autocast (the weights and the optimizer stay fp32)."""

from __future__ import annotations

import contextlib
import re

import torch

from rlhf_toy.errors import UserError


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda if available else cpu; `cuda` without a GPU is a one-line error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name != "cpu" and not re.fullmatch(r"cuda(:\d+)?", name):  # mps, meta, xla...: not paths this project runs
        raise UserError(f"--device {name!r} is not supported; use auto, cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {name} but torch sees no GPU here; pass --device cpu (or auto)")
    try:
        return torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name!r} is not a device; use auto, cpu or cuda") from None


def autocast(device: torch.device):
    """bf16 autocast where the device supports it (a CUDA GPU with bf16), a no-op elsewhere."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def model_device(model) -> torch.device:
    return next(model.parameters()).device
