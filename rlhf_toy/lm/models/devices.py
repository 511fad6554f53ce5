"""Devices: `--device auto` picks a GPU when there is one; on a GPU with bf16 support the forward passes run under
bf16 autocast (the weights and the optimizer stay fp32). The RL step's `--bf16 on` takes autocast to a CPU with
native bf16 (AVX512-BF16 or AMX); `off` keeps fp32 everywhere."""

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


BF16 = ("auto", "on", "off")  # --bf16: auto = on a GPU that has it, fp32 on the CPU


def cpu_bf16_native() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX tiles); without it torch emulates
    bf16 and autocast runs slower than fp32."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def check_bf16(device: torch.device, bf16: str) -> None:
    """`--bf16 on` on a device that cannot run it fast is an error, not a silent slowdown."""
    if bf16 != "on":
        return
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError(f"--bf16 on, but the GPU of {device} has no bf16 support; pass --bf16 auto (fp32 there)")
    if device.type == "cpu" and not cpu_bf16_native():
        raise UserError(
            "--bf16 on, but this CPU has no native bf16 (AVX512-BF16 or AMX): torch would emulate it, slower than "
            "fp32; pass --bf16 auto"
        )


def autocast(device: torch.device, bf16: str = "auto", weights_fixed: bool = False):
    """bf16 autocast of the forward passes: `auto` where the device supports it (a CUDA GPU with bf16), `on` on the
    CPU too (`check_bf16` first), `off` never; a no-op otherwise.

    Autocast keeps each fp32 weight's bf16 copy until its outermost context exits and never looks at the weight
    again, so under one context that also steps an optimizer every later forward pass would read the weights of the
    first (measured: an update's own approx-KL 10-40x under fp32's). Only where no optimizer step runs inside
    (`weights_fixed`: sampling, scoring) are the copies kept; a context around training casts afresh each time."""
    if bf16 == "off":
        return contextlib.nullcontext()
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=weights_fixed)
    if device.type == "cpu" and bf16 == "on":
        return torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=weights_fixed)
    return contextlib.nullcontext()


def model_device(model) -> torch.device:
    return next(model.parameters()).device
