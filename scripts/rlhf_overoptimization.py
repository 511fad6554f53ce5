#!/usr/bin/env python
"""The lesson's warning about RLHF, shown: PPO with beta 0, 0.03 and 0.1 (--betas) against best-of-n,
reward-model score and gold score against sqrt(KL); the same as `rlhf-toy overopt`.
Needs stages 1-4 in --run_dir (e.g. `python -m rlhf_toy.lm all`).

    python scripts/rlhf_overoptimization.py --run_dir runs/helpdesk --steps 100
"""

import sys

from rlhf_toy.errors import run_cli
from rlhf_toy.lm.pipeline.cli import main

if __name__ == "__main__":
    raise SystemExit(run_cli(main, ["overopt", *sys.argv[1:]]))
