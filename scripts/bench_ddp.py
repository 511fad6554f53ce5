#!/usr/bin/env python
"""PPO episodes per second: 2 processes x 1 thread (torchrun, gloo) against 1 process x 2 threads, the same
global batch (64 = 2 ranks x 32), on the default helpdesk task.

    python scripts/bench_ddp.py --run_dir runs/helpdesk --steps 10

The run directory needs stages 1-4 (`python -m rlhf_toy.lm all` or the stages up to `reward`). Each mode
writes its own PPO directory (ddp_bench_1x2, ddp_bench_2x1) and the figure is its `episodes_per_s`
(time spent in PPO steps only). The two modes run alternately, `--repeats` times each.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys


def run(mode: str, run_dir: str, steps: int) -> float:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    common = ["--run_dir", run_dir, "--steps", str(steps), "--save_every", "0", "--progress", "False"]
    if mode == "1x2":
        env["OMP_NUM_THREADS"] = "2"
        cmd = [
            sys.executable,
            "-m",
            "rlhf_toy.lm",
            "ppo",
            *common,
            "--batch_size",
            "64",
            "--threads",
            "2",
            "--policy_dir",
            "ddp_bench_1x2",
        ]
    else:
        env["OMP_NUM_THREADS"] = "1"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "rlhf_toy.lm",
            "ppo",
            *common,
            "--batch_size",
            "32",
            "--minibatch_size",
            "8",
            "--threads",
            "1",
            "--policy_dir",
            "ddp_bench_2x1",
        ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if p.returncode != 0:
        sys.exit(f"error: {mode} failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    return summary["episodes_per_s"]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run_dir", default="runs/helpdesk")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    figures: dict[str, list[float]] = {"1x2": [], "2x1": []}
    for _ in range(a.repeats):
        for mode in figures:
            figures[mode].append(run(mode, a.run_dir, a.steps))
            print(json.dumps({"mode": mode, "episodes_per_s": figures[mode][-1]}), flush=True)
    med = {m: statistics.median(v) for m, v in figures.items()}
    print(json.dumps({"median_episodes_per_s": med, "ratio_2x1_over_1x2": med["2x1"] / med["1x2"]}))
