"""Argument parsing for the three lesson scripts (scripts/lesson_*.py)."""

from __future__ import annotations

import sys

from rlhf_toy.cli import parse_configs
from rlhf_toy.errors import run_cli

from .lesson import TITLES, LessonConfig, main


def script_main(name: str) -> None:
    def _main(argv: list[str] | None) -> int:
        (cfg,) = parse_configs((LessonConfig,), argv or [], prog=f"lesson_{name}", help=TITLES[name])
        main(name, cfg)
        return 0

    raise SystemExit(run_cli(_main, sys.argv[1:]))
