"""The label log: `run_dir/human_preferences.jsonl`, one JSON object per line, only ever appended to.

A label row is TRL's preference format (`prompt`, `chosen`, `rejected`) plus what a person's choice needs to be
audited and resumed:

    {"pair_id": "3f2a...", "prompt": ..., "chosen": ..., "rejected": ..., "choice": "left",
     "tie": false, "skip": false, "shown_order": ["chosen", "rejected"], "labeler": "ana",
     "time": "2026-12-05T10:00:00Z", "model": "runs/helpdesk/ppo/policy", "repeat_of": null}

`shown_order` names the reply shown on the left, then the one on the right. A tie keeps the left reply as
`chosen`; a skip keeps both replies and `skip: true` (no label). An undo appends a retraction,
`{"retracts": "3f2a...", "labeler": ..., "time": ...}`, instead of rewriting the file; a retracted pair may be
labeled again. A repeat (`repeat_of`: the first showing's pair id) is the same two replies shown again with the
sides swapped: the labeler's agreement with themselves.

Every append is one `write` of a whole line under an OS file lock, flushed and fsynced before the page moves on,
so two tabs, two labelers or two servers never interleave lines. A kill mid-write can leave at most a partial
last line: `LabelLog.open` cuts it off (with a notice) before the next append.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock

from rlhf_toy.errors import UserError
from rlhf_toy.logging import read_jsonl

CHOICES = ("left", "right", "tie", "skip")
TIE_LABEL = 0.5  # a tie trains as a Bradley-Terry soft label: P(chosen > rejected) = 1/2


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def label_row(
    pair_id: str, prompt: str, left: str, right: str, choice: str, labeler: str, model: str, repeat_of: str | None
) -> dict[str, Any]:
    """The log row of one choice between `left` and `right` (as shown)."""
    if choice not in CHOICES:
        raise ValueError(f"choice {choice!r} is not one of {CHOICES}")
    chosen, rejected, order = (right, left, ["rejected", "chosen"]) if choice == "right" else (left, right, None)
    return {
        "pair_id": pair_id,
        "prompt": prompt,
        "chosen": chosen,
        "rejected": rejected,
        "choice": choice,
        "tie": choice == "tie",
        "skip": choice == "skip",
        "shown_order": order or ["chosen", "rejected"],
        "labeler": labeler,
        "time": now(),
        "model": model,
        "repeat_of": repeat_of,
    }


def retraction_row(pair_id: str, labeler: str) -> dict[str, Any]:
    return {"retracts": pair_id, "labeler": labeler, "time": now()}


@dataclass
class LabelState:
    """What a log says once its retractions are applied: the standing label rows by pair id (in order), and each
    labeler's standing labels, newest last (what `undo` takes back)."""

    labels: dict[str, dict[str, Any]] = field(default_factory=dict)
    by_labeler: dict[str, list[str]] = field(default_factory=dict)
    retractions: int = 0
    rows: int = 0  # rows read or appended, retractions included

    def apply(self, row: dict[str, Any]) -> None:
        self.rows += 1
        if "retracts" in row:
            pid = row["retracts"]
            if self.labels.pop(pid, None) is not None:
                self.retractions += 1
                for ids in self.by_labeler.values():
                    if pid in ids:
                        ids.remove(pid)
            return
        self.labels[row["pair_id"]] = row
        self.by_labeler.setdefault(row["labeler"], []).append(row["pair_id"])

    @property
    def decided(self) -> int:
        """Labels that count toward the target: every standing label but skips."""
        return sum(not r["skip"] for r in self.labels.values())


def agreement(labels: Iterable[dict[str, Any]]) -> tuple[int, int]:
    """(agreeing, compared): repeats whose label and their first showing's are both left/right, and how many of
    them chose the same reply (the sides were swapped, so agreeing means the same text, not the same key)."""
    rows = list(labels)
    first = {r["pair_id"]: r for r in rows}
    same = n = 0
    for r in rows:
        orig = first.get(r.get("repeat_of") or "")
        if orig is None or r["tie"] or r["skip"] or orig["tie"] or orig["skip"]:
            continue
        n += 1
        same += r["chosen"] == orig["chosen"]
    return same, n


def check_row(row: dict[str, Any], where: str) -> None:
    """A row of a label log is a retraction or a label with text fields: anything else is named, with its line."""
    if "retracts" in row:
        if not isinstance(row["retracts"], str):
            raise UserError(f"{where}: a retraction names no pair id ({row!r}); fix or delete that line")
        return
    for key in ("pair_id", "prompt", "chosen", "rejected", "labeler"):
        if not isinstance(row.get(key), str):
            raise UserError(f"{where}: '{key}' is missing or not a text in {str(row)[:80]}; fix or delete that line")
    if row.get("choice") not in CHOICES:
        raise UserError(f"{where}: 'choice' is {row.get('choice')!r}, not one of {', '.join(CHOICES)}")


def is_label_row(row: Any) -> bool:
    """Whether a parsed line is one `label` writes: a label or a retraction."""
    return isinstance(row, dict) and "labeler" in row and ("choice" in row or "retracts" in row)


# How every row `label` writes begins (`label_row` and `retraction_row` put these keys first): a partial last
# line that a kill left starts so, and nothing else is cut from a file
ROW_STARTS = (b'{"pair_id":', b'{"retracts":')


def is_label_log(path: str | os.PathLike[str]) -> bool:
    """Whether a preference file is a label log (its first row is a label or a retraction written by `label`),
    whatever its name: a log saved as `labels.json` is still read as labels, never as plain preferences."""
    p = Path(path)
    if not p.is_file():
        return False
    with p.open("rb") as f:
        first = f.readline()
    try:
        return is_label_row(json.loads(first))
    except ValueError:
        return False


def read_log(path: str | os.PathLike[str]) -> LabelState:
    """The standing labels of a log (a partial last line, from a kill mid-write, is ignored)."""
    state = LabelState()
    try:
        rows = read_jsonl(path, partial_last_line_ok=True)
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text; a label log is written by 'rlhf-toy label'") from None
    for i, row in enumerate(rows, 1):
        check_row(row, f"{path}, row {i}")
        state.apply(row)
    return state


def log_pairs(path: str | os.PathLike[str]) -> dict[str, list]:
    """The preference pairs of a label log for the reward model: standing labels but skips, with `label` 1 for a
    choice and `TIE_LABEL` for a tie (the columns `RunDir.load_preferences` returns)."""
    rows = [r for r in read_log(path).labels.values() if not r["skip"]]
    if not rows:
        raise UserError(f"{path} holds no labels yet (skips and retracted labels do not count); label some pairs")
    return {
        "prompt": [r["prompt"] for r in rows],
        "chosen": [r["chosen"] for r in rows],
        "rejected": [r["rejected"] for r in rows],
        "label": [TIE_LABEL if r["tie"] else 1.0 for r in rows],
    }


class LabelLog:
    """Appends to a label log under an OS lock (`filelock`, beside the file), each line flushed and fsynced."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = FileLock(str(self.path.with_name(f".{self.path.name}.lock")), thread_local=False)

    def open(self) -> LabelState:
        """Create the file if needed, cut a partial last line a kill left (with a notice), and read it. A file
        that is not a label log is refused before a byte of it changes."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            if self.path.is_file():
                data = self.path.read_bytes()
                self.check_is_log(data)
                if data and not data.endswith(b"\n"):
                    keep = data.rfind(b"\n") + 1
                    os.truncate(self.path, keep)
                    print(
                        f"note: {self.path}: dropped a partial last line ({len(data) - keep} bytes) that a kill "
                        "mid-write left",
                        file=sys.stderr,
                    )
            else:
                self.path.touch()
            return read_log(self.path)

    def check_is_log(self, data: bytes) -> None:
        """Refuse a file whose whole lines are not label rows, or whose unfinished last line does not begin as
        one (a kill mid-write leaves only that): `--out` named some other file, which must stay as it was."""
        lines = data.split(b"\n")
        whole, tail = lines[:-1], lines[-1]
        for i, line in enumerate(whole, 1):
            try:
                ok = is_label_row(json.loads(line))
            except ValueError:
                ok = False
            if not ok:
                raise UserError(
                    f"{self.path} is not a label log (line {i} is not a row 'rlhf-toy label' writes); pass "
                    "--out with a new file name, e.g. human_preferences.jsonl"
                )
        if tail and not tail.startswith(ROW_STARTS):
            raise UserError(
                f"{self.path} is not a label log (its last line is not a row 'rlhf-toy label' writes); pass --out "
                "with a new file name, e.g. human_preferences.jsonl"
            )

    def append(self, row: dict[str, Any]) -> None:
        line = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
