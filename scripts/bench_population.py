#!/usr/bin/env python
"""Wall time of CartPole populations (N agents as one batched network, 100k env steps each) against one
single run, each in a fresh process, alternated in one session (medians over --repeats rounds):

    python scripts/bench_population.py --sizes 1 4 16 32 128 --threads 1
    python scripts/bench_population.py --sizes 32 --threads 1 --workers 2 --repeats 3   # each at its fastest
    python scripts/bench_population.py --sizes 32 --threads 1 --population-threads 2 --repeats 3
"""

import argparse
import json

from benchlib.cartpole import population_curve

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 32, 128])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--population-threads",
        type=int,
        default=None,
        help="torch threads of the populations (default: --threads); the single run keeps --threads",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes a population is split over, one torch thread each (needs --population-threads 1)",
    )
    p.add_argument("--total-steps", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=1, help="rounds of [single run, each size]; medians are reported")
    a = p.parse_args()
    report = population_curve(a.sizes, a.threads, a.total_steps, a.population_threads, a.repeats, a.workers)
    print(json.dumps(report, indent=2))
