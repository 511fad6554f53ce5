"""Safe file output: atomic writes (a temporary beside the target, then a rename) and a lock per output folder.

A crash mid-write leaves the previous file or directory (or none), never a truncated one. Temporaries are named
`.{target}.tmp-XXXXXXXX` so that a later writer holding the folder's lock can sweep what a killed one left.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from .errors import UserError

TMP_MARK = ".tmp-"


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path in the target's directory; on success rename it to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{TMP_MARK}", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the result ordinary permissions
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike[str], writer: Callable[[Path], Any]) -> None:
    """Call `writer(tmp_path)` and move the result to `path` only if it succeeded."""
    with atomic_path(path) as tmp:
        writer(tmp)


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> None:
    atomic_write(path, lambda tmp: torch.save(obj, tmp))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


@contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary directory beside `path`; on success it replaces `path` (a crash leaves the old one).

    Everything written inside becomes visible at once: a model with its tokenizer, or a checkpoint's model and
    trainer state together.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}{TMP_MARK}", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700 directories: others could not read a shared run
    try:
        yield tmp
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}{TMP_MARK}old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def sweep_temporaries(folder: str | os.PathLike[str]) -> list[str]:
    """Remove the temporaries that killed writers left directly in `folder`; returns their names.

    A writer killed between `atomic_dir`'s two renames left the previous version as `.NAME.tmp-old` and no
    `NAME`: that one is put back, not removed. Call this only while holding the folder's lock (`output_lock`):
    then no live writer owns a temporary. Subfolders are left alone: another process may hold their own lock
    (a PPO run in run_dir/ppo while run_dir is evaluated).
    """
    removed = []
    for entry in sorted(Path(folder).iterdir()):
        if entry.name.startswith(".") and entry.name.endswith(f"{TMP_MARK}old"):
            target = entry.with_name(entry.name[1 : -len(f"{TMP_MARK}old")])
            if not target.exists():
                os.replace(entry, target)  # the previous version is the last complete one: restore it
                continue
        if entry.name.startswith(".") and TMP_MARK in entry.name:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry.name)
    return removed


@contextmanager
def output_lock(folder: str | os.PathLike[str], what: str = "run") -> Iterator[Path]:
    """Hold an exclusive lock on an output folder for the block; a second writer gets a one-line `UserError`
    naming the holder (pid, host, start time). The lock is the OS's (`filelock`), so it dies with its process.
    """
    from filelock import FileLock, Timeout

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder} is a file, not a directory; pass a directory path for the {what}")
    folder.mkdir(parents=True, exist_ok=True)
    owner = folder / ".lock.owner"
    lock = FileLock(str(folder / ".lock"), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        holder = owner.read_text().strip() if owner.is_file() else "another process"
        raise UserError(f"{folder} is in use by {holder}; wait for it to finish or pass another directory") from None
    try:
        sweep_temporaries(folder)
        owner.write_text(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        yield folder
    finally:
        owner.unlink(missing_ok=True)
        lock.release()
