#!/usr/bin/env python
"""PPO episodes per second: rlhf-toy against TRL's PPO trainer (as shipped, and with its gc.collect() calls
skipped), same model sizes, batch 64, response length 24, 4 epochs, one torch thread, alternated in one session.

    python3 -m venv .venv-trl && .venv-trl/bin/pip install torch==2.13.0 && \\
        .venv-trl/bin/pip install trl==1.12.0 transformers datasets accelerate
    python scripts/bench_rlhf.py --trl-python .venv-trl/bin/python
"""

import argparse
import json
import sys
from pathlib import Path

from rlhf_toy.lm.pipeline.bench import ours_in_subprocess, trl

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trl-python", default=None, help="python of a venv with trl==1.12.0 (omit: ours only)")
    p.add_argument("--sizes", nargs="+", default=["2x64", "4x128"], help="n_layer x n_embd")
    p.add_argument("--episodes", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--response-length", type=int, default=24)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    if a.trl_python and not Path(a.trl_python).exists():
        sys.exit(f"error: no python at {a.trl_python}; create the TRL venv first (see --help)")
    report = {}
    for size in a.sizes:
        n_layer, n_embd = (int(x) for x in size.split("x"))
        kw = dict(episodes=a.episodes, batch_size=a.batch_size, response_length=a.response_length, n_layer=n_layer,
                  n_embd=n_embd, threads=a.threads)
        rows = [ours_in_subprocess(**kw)]
        if a.trl_python:
            rows.append(trl(a.trl_python, **kw, skip_gc=False))
            rows.append(trl(a.trl_python, **kw, skip_gc=True))
        for r in rows:
            print(json.dumps(r), flush=True)
        eps = {r["peer"]: r.get("episodes_per_s") for r in rows}
        report[size] = {"episodes_per_s": eps}
        for peer in ("trl", "trl-nogc"):
            if eps.get(peer) and eps.get("rlhf-toy"):
                report[size][f"ratio_vs_{peer}"] = eps["rlhf-toy"] / eps[peer]
    print(json.dumps(report, indent=2))
