"""One error type for every problem a user can fix, and the CLI wrapper that prints it as one line.

Library code raises `UserError` (a `ValueError`) with a message that names the problem and the fix.
Command-line entry points run through `run_cli`, which turns such errors into `error: ...` on stderr and exit
status 2 instead of a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


class UserError(ValueError):
    """A problem with the user's input (a value, a file, an environment) that they can fix."""


_SAID: set[str] = set()


def note_once(text: str) -> None:
    """`note: {text}` on stderr, once per process (rank 0 under torchrun): what a run does differently from what
    was asked, or from its fast path, said instead of done silently."""
    if text not in _SAID:
        _SAID.add(text)
        if os.environ.get("RANK", "0") == "0":
            print(f"note: {text}", file=sys.stderr)


def first_line(exc: BaseException, limit: int = 160) -> str:
    """An exception's first non-empty line, cut to `limit` characters, for a one-line error; "(no message)" when
    it has none (a bare `RuntimeError()` must not crash the handler that names it)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0][:limit] if lines else "(no message)"


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run `main(argv)`; print user errors as one line and return a non-zero exit status.

    Config dataclasses raise `UserError` from `__post_init__`; argparse-level errors exit 2 by themselves.
    """
    try:
        return int(main(argv) or 0)
    except UserError as exc:
        if os.environ.get("RANK", "0") == "0":  # under torchrun every rank fails alike: rank 0 says it once
            print(f"error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"error: file not found: {exc.filename or exc}; check the path", file=sys.stderr)
        return 2
    except OSError as exc:  # a path that is a file where a directory is needed, a read-only place, a full disk
        where = exc.filename or "a path"
        print(
            f"error: cannot write or read {where}: {exc.strerror or exc}; pass a writable directory or an existing "
            "file there",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
