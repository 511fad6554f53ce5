"""A run's history survives a kill at any moment: a resumed run writes the rows it keeps atomically before it
trains, and a new run into an old --out never leaves the old run's summary beside a new history."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def test_a_kill_right_after_a_resume_keeps_the_kept_rows(tmp_path):
    rows = [{"step": i, "x": float(i)} for i in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = (
        "import os, sys; from rlhf_toy.logging import MetricLogger;"
        f"log = MetricLogger(sys.argv[1], report_to=(), history={rows[:3]!r});"
        "log.log(4, {'x': 40.0}); os._exit(0)"  # killed: no flush, no close
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, env=ENV, timeout=60)
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == rows[:3]


@pytest.mark.integration
def test_a_new_cartpole_run_killed_early_leaves_no_old_summary(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("summary.json", "final.pt", "best.pt"):
        (out / name).write_text("from an earlier run")
    cmd = [sys.executable, "-m", "cartpole", "train", "--out", str(out), "--total_steps", "10000000",
           "--progress", "False", "--threads", "1"]  # fmt: skip
    p = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not (out / "metrics.jsonl").is_file():
            time.sleep(0.05)
        assert (out / "metrics.jsonl").is_file()
    finally:
        p.kill()
        p.wait()
    assert not any((out / name).exists() for name in ("summary.json", "final.pt", "best.pt"))
