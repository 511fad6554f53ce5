#!/usr/bin/env python
"""The human-feedback loop with a simulated labeler: `rlhf-toy label` serves the run's policy, a judge presses the
keys in headless Chromium (the task's gold judge by default: on the help-desk task, a labeler who prefers friendly,
on-topic replies), then the reward stage trains on those labels and reports its accuracy on the labeler's own
held-out labels. Prints one JSON line: labels, the page's key-to-next-pair latency, the reward model's figures.

    python scripts/simulate_labeler.py --run_dir runs/helpdesk --labels 100
"""

import argparse
import json
import time

from rlhf_toy.errors import run_cli
from rlhf_toy.lm.labeling.browser import headless_chromium, simulate_labeler, start_label
from rlhf_toy.lm.labeling.store import read_log
from rlhf_toy.lm.pipeline.cli import main
from rlhf_toy.lm.pipeline.run import RunConfig

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run_dir", default="runs/helpdesk")
    p.add_argument("--labels", type=int, default=100)
    p.add_argument("--judge", default=None, help="module:function (default: the task's gold judge)")
    p.add_argument("--model", default=None, help="sample from this model directory (default: label's own choice)")
    p.add_argument("--out", default="human_preferences.jsonl", help="the label log, under run_dir")
    p.add_argument("--reward_dir", default="human_rm", help="where the reward model on these labels goes")
    p.add_argument("--heldout_fraction", type=float, default=0.3)
    args = p.parse_args()

    judge = RunConfig(run_dir=args.run_dir, judge=args.judge, progress=False).start().judge
    flags = ["--out", args.out, *(["--model", args.model] if args.model else [])]
    t0 = time.perf_counter()
    server = start_label(args.run_dir, *flags)
    try:
        with headless_chromium() as browser:
            done = simulate_labeler(browser.new_page(), server.url, judge, args.labels)
    finally:
        server.stop()
    label_s = time.perf_counter() - t0
    log = f"{args.run_dir}/{args.out}"
    reward_flags = ["--preferences_file", log, "--reward_dir", args.reward_dir]
    reward_flags += ["--heldout_fraction", str(args.heldout_fraction), "--progress", "False"]
    if run_cli(main, ["reward", "--run_dir", args.run_dir, *reward_flags]) != 0:
        raise SystemExit(1)
    report = json.loads(open(f"{args.run_dir}/{args.reward_dir}.json").read())
    keys = {"1": "left", "2": "right", "3": "tie"}
    print(
        json.dumps(
            {
                "labels": read_log(log).decided,
                "keys": {keys[k]: done.keys.count(k) for k in keys},
                "label_wall_s": round(label_s, 1),
                "latency": done.latency(),
                "reward_heldout_accuracy": report.get("heldout_accuracy"),
                "reward_heldout_pairs": report.get("heldout_pairs"),
                "reward_train_pairs": report.get("pairs"),
            }
        )
    )
