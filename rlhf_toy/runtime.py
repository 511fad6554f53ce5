"""Process-wide settings that make small-tensor CPU training fast (called once per run by `seed_everything`), and
a clock of a step's phases."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
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


def busy_cores_warning(threads: int, cores: int | None = None, load: float | None = None) -> str | None:
    """A warning when `threads` torch threads will share their cores with other work: the load average (last
    minute) leaves fewer free cores than threads, and two processes that each spin several threads slow each other
    10 to 100 times. None on a machine with room (and always for one thread)."""
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    load = load if load is not None else os.getloadavg()[0]
    free = cores - load
    if threads <= 1 or free >= threads - 0.5:
        return None
    return (
        f"{threads} torch threads on {cores} cores with a load of {load:.1f} (about {max(0.0, free):.1f} free): "
        "other work shares these cores and the run may be 10-100x slower than on a quiet machine; --threads 1 "
        "avoids it (its numbers differ from a multi-thread run's in the last digits)"
    )
