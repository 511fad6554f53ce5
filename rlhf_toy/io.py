"""Safe file output: atomic writes (a temporary beside the target, then a rename) and a lock per output folder.

A crash mid-write leaves the previous file or directory (or none), never a truncated one. Temporaries are named
`.{target}.tmp-XXXXXXXX` so that a later writer holding the folder's lock can sweep what a killed one left.
"""

from __future__ import annotations

import hashlib
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
from filelock import FileLock, Timeout

from .errors import UserError, first_line

TMP_MARK = ".tmp-"


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def disk_nearly_full(folder: Path, margin: int = 1 << 20) -> bool:
    """Whether the file system holding `folder` has less than `margin` bytes left for this user."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < margin


def is_write_failure(exc: BaseException, path: Path) -> bool:
    """Whether an exception from a writer is the disk refusing bytes: torch's zip writer says `RuntimeError` ("file
    write failed", "iostream error", "unexpected pos"), safetensors `SafetensorError` ("IoError ... StorageFull"),
    neither an `OSError`."""
    text = str(exc).lower()
    if type(exc).__name__ == "SafetensorError":
        return disk_nearly_full(path.parent) or any(w in text for w in ("ioerror", "space", "storagefull", "write"))
    return isinstance(exc, RuntimeError) and (disk_nearly_full(path.parent) or "write" in text)


def raise_write_failure(exc: BaseException, path: Path) -> None:
    """A full disk, whichever library's words report it, as one line. The temporary is already gone and the
    previous version of `path` is untouched."""
    if is_write_failure(exc, path):
        first = first_line(exc)
        raise UserError(
            f"cannot write {path} ({first}); is the disk full? Free space and run again: the previous version is kept"
        ) from None


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
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        raise_write_failure(exc, path)
        raise


def atomic_write(path: str | os.PathLike[str], writer: Callable[[Path], Any]) -> None:
    """Call `writer(tmp_path)` and move the result to `path` only if it succeeded."""
    with atomic_path(path) as tmp:
        writer(tmp)


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> None:
    atomic_write(path, lambda tmp: torch.save(obj, tmp))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def read_json(path: str | os.PathLike[str], fix: str = "delete it and re-run the command that wrote it") -> Any:
    """A JSON file a command wrote, or one `UserError` naming it and `fix` when a hand or a crash damaged it
    (not JSON, not UTF-8, or not an object)."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too
        raise UserError(f"{path} is not readable JSON ({type(exc).__name__}: {first_line(exc, 80)}); {fix}") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path} holds a {type(obj).__name__}, not a JSON object; {fix}")
    return obj


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
        ordinary_permissions(tmp)
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}{TMP_MARK}old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise_write_failure(exc, path)
        raise


def folder_digest(folder: str | os.PathLike[str]) -> str:
    """A content hash of every file in `folder` (names and bytes, in sorted order; hidden files skipped): the
    identity of a saved model, its weights and tokenizer included. About a second per 500 MB."""
    h = hashlib.blake2b(digest_size=16)
    root = Path(folder)
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def ordinary_permissions(folder: Path) -> None:
    """Give everything under `folder` the permissions the umask allows (files 0666, folders 0777, less the
    umask): some writers (safetensors, peft) create their files 0600 through a private temporary, which would
    make a shared run's weights unreadable to others."""
    umask = _umask()
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o777 & ~umask)
        for f in files:
            os.chmod(os.path.join(root, f), 0o666 & ~umask)


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


HELD: set[Path] = set()  # the folders whose output lock this process holds

# The kinds of folder the commands write, each told by files only it holds (the first kind that matches wins):
# a command refuses to write its kind of output over another kind's.
KIND_FILES = (
    ("language-model agent run", ("agent.json",)),  # `rlhf-toy agent` (its models are in subfolders)
    ("model", ("config.json", "ensemble.json")),  # a Hugging Face model (SFT, reward, policy) or a reward ensemble
    ("CartPole run", ("final.pt", "best.pt", "seed_0")),
    ("policy run", ("checkpoint", "policy", "adapter", "ppo.json")),
    ("run", ("tokenizer", "sft", "preferences", "base_model", "sft.json")),
)


def folder_kind(folder: str | os.PathLike[str]) -> str | None:
    """What an existing output folder holds (`KIND_FILES`; a `summary.json` naming an environment or an algorithm
    also tells), or None: empty, new, or not written by a command of this project."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    for kind, names in KIND_FILES:
        if any((folder / n).exists() for n in names):
            return kind
    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if isinstance(summary, dict) and "env_id" in summary:
        return "CartPole run"
    if isinstance(summary, dict) and ("algorithm" in summary or summary.get("stage") == "policy"):
        return "policy run"
    return None


def missing_folders(folder: Path) -> list[Path]:
    """`folder` and those of its parents that do not exist yet, deepest first: what a `mkdir(parents=True)`
    creates, and so what a refused command removes again."""
    missing = []
    for p in (folder, *folder.parents):
        if p.exists():
            break
        missing.append(p)
    return missing


def remove_if_empty(folders: list[Path], ignore: tuple[str, ...] = ()) -> None:
    """Remove each folder (deepest first) that holds nothing but `ignore`d names."""
    for f in folders:
        try:
            for name in ignore:
                entry = f / name
                if entry.is_dir():
                    entry.rmdir()  # only if empty: a live reader's file keeps it
                else:
                    entry.unlink(missing_ok=True)
            f.rmdir()
        except OSError:
            return


@contextmanager
def output_lock(folder: str | os.PathLike[str], what: str = "run") -> Iterator[Path]:
    """Hold an exclusive lock on an output folder for the block; a second writer gets a one-line `UserError`
    naming the holder (pid, host, start time). The lock is the OS's (`filelock`), so it dies with its process.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder} is a file, not a directory; pass a directory path for the {what}")
    held = folder_kind(folder)
    if held is not None and held != what:
        raise UserError(
            f"{folder} holds a {held}, not a {what}; pass another directory for the {what} (or delete that one)"
        )
    created = missing_folders(folder)  # a refused or failed command must not leave empty folders behind
    folder.mkdir(parents=True, exist_ok=True)
    owner = folder / ".lock.owner"
    lock = FileLock(str(folder / ".lock"), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        holder = owner.read_text().strip() if owner.is_file() else "another process"
        raise UserError(f"{folder} is in use by {holder}; wait for it to finish or pass another directory") from None
    failed = False
    HELD.add(folder.resolve())
    try:
        sweep_temporaries(folder)
        owner.write_text(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        yield folder
    except BaseException:
        failed = True
        raise
    finally:
        HELD.discard(folder.resolve())
        owner.unlink(missing_ok=True)
        lock.release()
        if failed and created:
            remove_if_empty(created, ignore=(".lock",))


def _held_elsewhere(lock_file: Path) -> bool:
    """Whether another process holds the OS lock on `lock_file` (a dead holder's lock is free)."""
    if not lock_file.is_file():
        return False
    probe = FileLock(str(lock_file), timeout=0)
    try:
        probe.acquire()
    except Timeout:
        return True
    probe.release()
    return False


@contextmanager
def reader_lock(folder: str | os.PathLike[str], what: str = "run") -> Iterator[None]:
    """Register this process as a reader of `folder`'s own files for the block (a policy stage reading the SFT
    and reward models): a writer of the folder (`check_no_readers`, under `output_lock`) refuses to replace them
    meanwhile, and a reader does not start while a writer holds the folder."""
    folder = Path(folder)
    if folder.resolve() not in HELD and _held_elsewhere(folder / ".lock"):
        owner = folder / ".lock.owner"
        holder = owner.read_text().strip() if owner.is_file() else "another process"
        raise UserError(f"{folder} is being written by {holder}; wait for it to finish before reading the {what}")
    readers = folder / ".readers"
    created = missing_folders(folder)
    path = readers / f"{socket.gethostname()}-{os.getpid()}-{time.monotonic_ns()}.lock"
    lock = FileLock(str(path), timeout=0)
    for attempt in range(5):  # another reader leaving may remove `.readers` between our mkdir and our lock file
        readers.mkdir(parents=True, exist_ok=True)
        try:
            lock.acquire()
            break
        except FileNotFoundError:
            if attempt == 4:
                raise
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        lock.release()
        path.unlink(missing_ok=True)
        remove_if_empty([readers])  # another reader's file keeps it
        if failed and created:  # a refused command on a new --run_dir leaves nothing behind
            remove_if_empty(created, ignore=(".lock",))


def check_no_readers(folder: str | os.PathLike[str]) -> None:
    """Refuse, with the reader named, to write `folder` while another process reads it (`reader_lock`); the
    files of readers that died are swept. Call it while holding the folder's `output_lock`."""
    readers = Path(folder) / ".readers"
    for path in sorted(readers.glob("*.lock")) if readers.is_dir() else []:
        if _held_elsewhere(path):
            host, pid = path.stem.split("-")[:2]
            raise UserError(
                f"{folder} is being read by a running stage (pid {pid} on {host}), which a rewrite would pull its "
                "models from under; wait for it to finish or use another --run_dir"
            )
        path.unlink(missing_ok=True)
