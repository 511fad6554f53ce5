"""Reporting: metric logs (JSONL always, TensorBoard when installed), figures, curve smoothing, markdown tables."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import UserError
from .io import atomic_write, atomic_write_text

TRACKERS = ("tensorboard", "trackio")


def trackers(report_to: str) -> tuple[str, ...]:
    """The trackers a `--report_to` names, as transformers' `report_to`: a comma-separated list of tensorboard and
    trackio, `all` (each one that is installed) or `none`. JSONL is always written."""
    names = [n.strip() for n in report_to.split(",") if n.strip()]
    if names in (["none"], []):
        return ()
    if names == ["all"]:
        return tuple(t for t in TRACKERS if importlib.util.find_spec(t))
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise UserError(
            f"--report_to {report_to!r}: {unknown[0]!r} is not a tracker; use {', '.join(TRACKERS)}, all or none"
        )
    if "trackio" in names and importlib.util.find_spec("trackio") is None:
        raise UserError(
            "--report_to trackio needs the trackio package: pip install -e '.[trackio]' (or pip install trackio)"
        )
    return tuple(dict.fromkeys(names))


class MetricLogger:
    """Append one JSON object per step to `metrics.jsonl` (or `filename`), and the scalars to each tracker of
    `report_to`: TensorBoard (under `tb/`, when installed) and Trackio (local-first: its SQLite store under
    `$TRACKIO_DIR`, browsed with `trackio show`).

    Keys are namespaced like CleanRL's (`charts/episodic_return`, `losses/approx_kl`, ...).
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        report_to: Sequence[str] = ("tensorboard",),
        history: list[dict[str, Any]] | None = None,
        enabled: bool = True,
        filename: str = "metrics.jsonl",
        project: str = "rlhf-toy",
        config: dict[str, Any] | None = None,
    ) -> None:
        """Start the file with the rows of `history` (a resumed run's rows up to its checkpoint), written
        atomically before anything else, then append: a kill at any moment leaves the previous file or the kept
        rows plus whole new lines (at most a partial last line, which readers drop), never an empty history.
        `enabled=False` writes nothing (a data-parallel rank other than 0). A Trackio run is named after the
        output directory and resumed when one of that name exists (`project`, `config`: its project and settings)."""
        self.enabled = enabled
        self._tb: Any = None
        self._trackio: Any = None
        if not enabled:
            return
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / filename
        atomic_write_text(self.path, "".join(json.dumps(row) + "\n" for row in history or []))
        self._file = self.path.open("a")
        if "tensorboard" in report_to:
            try:
                from torch.utils.tensorboard import SummaryWriter  # needs the optional tensorboard package

                self._tb = SummaryWriter(str(self.out_dir / "tb"))
            except ImportError:
                self._tb = None
        if "trackio" in report_to:
            import trackio  # the optional trackio extra (trackers() checked that it is installed)

            name = str(self.out_dir.resolve())
            self._trackio = trackio.init(project=project, name=name, config=config, resume="allow")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        scalars = {
            k: v
            for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and v is not None and math.isfinite(v)
        }
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
        if self._trackio is not None:
            self._trackio.log(scalars, step=step)

    def flush(self) -> None:
        """Put every row logged so far on disk (fsync): called before each checkpoint, so a run killed after
        its checkpoint has the history up to it."""
        if not self.enabled:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._trackio is not None:
            # Trackio's local run says "Uploading logs to Trackio (please wait...)" while it writes its local
            # database: nothing is uploaded, so that line is dropped; anything else it prints is passed on.
            # trackio.finish() (not the run's own): it also forgets the run, so that its exit hook does not finish it
            # again and say so a second time.
            import trackio  # the optional trackio extra (trackers() checked that it is installed)

            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                trackio.finish()
            print("".join(line for line in out.getvalue().splitlines(True) if "Uploading logs" not in line), end="")


def _plain(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN
    return v


def read_jsonl(
    path: str | os.PathLike[str], partial_last_line_ok: bool = False, steps: bool = False
) -> list[dict[str, Any]]:
    """The rows of a JSONL file. A line that is not a JSON object is a one-line `UserError`, except (with
    `partial_last_line_ok`) an unterminated last line: what a writer killed mid-line leaves. `steps`: a step log,
    whose rows' `step` must be an integer where present."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = Path(path).read_bytes()[: exc.start].count(b"\n") + 1
        raise UserError(f"{path} is not UTF-8 text (line {line}); fix or delete that line") from None
    lines = text.split("\n")
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not an object")
        except ValueError:
            if partial_last_line_ok and i == len(lines):  # no newline after it: cut off mid-write
                break
            raise UserError(
                f"{path}, line {i}, is not a JSON object ({line[:60]!r}); fix or delete that line"
            ) from None
        step = row.get("step", 0)
        # a whole number: an int, or a float such as 3.0 (the ranks' mean that a torchrun run logs)
        whole = isinstance(step, int) or (isinstance(step, float) and step.is_integer())
        if steps and (isinstance(step, bool) or not whole):
            raise UserError(f"{path}, line {i}: 'step' is {step!r}, not an integer; fix or delete that line")
        rows.append(row)
    return rows


def save_figure(fig: Any, path: str | os.PathLike[str]) -> None:
    """Save a matplotlib figure atomically and close it."""
    import matplotlib.pyplot as plt

    suffix = Path(path).suffix.lstrip(".") or "png"
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=suffix, dpi=100, bbox_inches="tight"))
    plt.close(fig)


def plt_module() -> Any:
    """pyplot on the non-interactive Agg backend (works headless, in tests and CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def moving_average(x: Sequence[float] | np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over up to `window` points (fewer at the start): `[n] -> [n]`."""
    x = np.asarray(x, dtype=float)
    if len(x) == 0:
        return x
    c = np.cumsum(np.insert(x, 0, 0.0))
    idx = np.arange(1, len(x) + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table: one header row, a separator, one row per item (cells as given, via str)."""
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
