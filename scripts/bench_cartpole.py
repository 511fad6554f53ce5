#!/usr/bin/env python
"""Wall time to solve CartPole-v1: rlhf-toy PPO vs Stable-Baselines3 PPO (rl-zoo settings), same threads,
alternated seed by seed. Needs the bench extra for SB3: pip install -e '.[bench]'.

    python scripts/bench_cartpole.py --seeds 0 1 2 3 4 --threads 1
"""

import argparse
import json
import sys

from benchlib.cartpole import compare

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--peers", nargs="+", default=["rlhf-toy", "sb3"], choices=["rlhf-toy", "sb3"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--total-steps", type=int, default=100_000)
    a = p.parse_args()
    if "sb3" in a.peers:
        try:
            import stable_baselines3  # noqa: F401
        except ImportError:
            sys.exit("error: stable-baselines3 is not installed; pip install -e '.[bench]', or pass --peers rlhf-toy")
    print(json.dumps(compare(a.seeds, a.peers, a.threads, a.total_steps), indent=2))
