"""Process-wide settings that make small-tensor CPU training fast (called once per run by `seed_everything`), and
a clock of a step's phases."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


@functools.cache
def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse instead of handing it back to the OS at once.

    By default glibc serves blocks over 128 KiB-32 MiB with fresh `mmap` pages and trims the heap as soon as its
    top is free, so a training loop that allocates and frees the same few megabytes on every step page-faults
    them in again each time: here a 2 MiB elementwise op took 1.6 ms instead of 0.16 ms. Keeping up to 1 GiB of
    freed memory is what the `MALLOC_MMAP_THRESHOLD_`/`MALLOC_TRIM_THRESHOLD_` variables or jemalloc would do.
    The cost: a process may hold up to 1 GiB more than it uses until it exits. A no-op (False) off glibc.
    """
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30))
    except (OSError, AttributeError):
        return False


class PhaseClock:
    """Wall time per phase of a step (`with clock("sample"): ...`), summed until `take()` returns and resets them.
    On the CPU every op is synchronous, so the times are the phases' own; on a GPU they include queued work."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def take(self) -> dict[str, float]:
        out, self.seconds = self.seconds, {}
        return out
