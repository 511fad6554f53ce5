#!/usr/bin/env python
"""What a reward-model ensemble costs a PPO step: the same PPO steps against one reward model and against an
ensemble (one process, the same SFT model and prompts, alternated rounds, medians of the step times).

Needs a run directory with the reward model and an ensemble (`rlhf-toy reward --ensemble 5 --reward_dir
reward_ensemble`; the `remedies` command trains it when missing).

    python scripts/bench_ensemble.py --run_dir runs/helpdesk --threads 1
"""

import argparse
import statistics
import time

import torch

from rlhf_toy.lm.algorithms.online import LM_PPO
from rlhf_toy.lm.algorithms.rlhf import RLHFConfig, RLHFTrainer
from rlhf_toy.lm.data.tasks import helpdesk_task
from rlhf_toy.lm.pipeline.remedies import ENSEMBLE_DIR
from rlhf_toy.lm.pipeline.rundir import RunDir


def step_times(trainer: RLHFTrainer, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        trainer.step()
        out.append(time.perf_counter() - t0)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run_dir", default="runs/helpdesk")
    p.add_argument("--ensemble_dir", default=ENSEMBLE_DIR, help="a bare name under run_dir, or a path")
    p.add_argument("--objective", default="worst", choices=["mean", "worst", "uncertainty"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=4, help="PPO steps per round and side")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    prompts = helpdesk_task().train_prompts
    trainers = {}
    for name, reward_dir in (("one reward model", "reward_model"), ("ensemble", a.ensemble_dir)):
        rd = RunDir(a.run_dir, reward_dir)
        model, tok = rd.load_sft()
        objective = "mean" if reward_dir == "reward_model" else a.objective
        rm = rd.load_reward_model(tok, objective=objective, coef=1.0)
        cfg = RLHFConfig(batch_size=a.batch_size, steps=10**6, save_every=0)
        trainers[name] = (RLHFTrainer(model, rm, tok, cfg, LM_PPO, prompts, seed=0), len(rm.members))
    times: dict[str, list[float]] = {n: [] for n in trainers}
    for trainer, _ in trainers.values():
        step_times(trainer, 1)  # warm-up
    for _ in range(a.rounds):
        for name, (trainer, _) in trainers.items():
            times[name] += step_times(trainer, a.steps)
    base = statistics.median(times["one reward model"])
    for name, (_, k) in trainers.items():
        med = statistics.median(times[name])
        print(f"{name} ({k} model{'s' * (k > 1)}): median PPO step {med:.3f} s, {med / base:.2f}x")
    print(f"batch {a.batch_size}, {a.threads} thread(s), {a.rounds} rounds x {a.steps} steps per side")
