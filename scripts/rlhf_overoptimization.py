#!/usr/bin/env python
"""The lesson's warning about RLHF, shown: PPO with beta 0, 0.03 and 0.1 against best-of-n, reward-model score
and gold score against sqrt(KL). A comparison of one method at several betas:
`rlhf-toy compare --methods ppo --seeds 0 --kl_coef 0,0.03,0.1 --name overoptimization` (extra flags pass on).
Needs stages 1-4 in --run_dir (e.g. `python -m rlhf_toy.lm all`).

    python scripts/rlhf_overoptimization.py --run_dir runs/helpdesk
"""

import sys

from rlhf_toy.errors import run_cli
from rlhf_toy.lm.pipeline.cli import main

if __name__ == "__main__":
    flags = ["--methods", "ppo", "--seeds", "0", "--kl_coef", "0,0.03,0.1", "--name", "overoptimization"]
    raise SystemExit(run_cli(main, ["compare", *flags, *sys.argv[1:]]))
