"""The `report` command of both CLIs (`rlhf-toy report`, `cartpole report`): rebuild report.html from run
directories."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from rlhf_toy.cli import Command
from rlhf_toy.config import check

from .page import write_report


@dataclass
class ReportConfig:
    """Which runs, and where the page goes."""

    runs: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Run directories (also as the first arguments): a policy run (run_dir/ppo), a run directory (its "
            "policy runs, overlaid), a CartPole --out; several are overlaid."
        },
    )
    out: str | None = field(
        default=None,
        metadata={"help": "Where the page goes (default: RUN/report.html; for several runs, their common parent's)."},
    )

    def __post_init__(self) -> None:
        check(bool(self.runs), "runs", self.runs, "at least one run directory, e.g. report runs/helpdesk/ppo")


def run_report(cfg: ReportConfig) -> int:
    t0 = time.perf_counter()
    path = write_report(cfg.runs, cfg.out)
    print(json.dumps({"report": str(path), "bytes": path.stat().st_size, "wall_s": time.perf_counter() - t0}))
    return 0


# One command for both CLIs (`rlhf-toy report`, `cartpole report`).
REPORT = Command(
    "A run explains itself: report.html with its curves, sampled replies, settings and alarms (one run, a run "
    "directory's runs, or several, overlaid).",
    (ReportConfig,),
    run_report,
    positional="runs",
)
