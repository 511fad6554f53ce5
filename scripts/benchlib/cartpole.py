"""Time-to-solved benchmark: this project's PPO against Stable-Baselines3 PPO (rl-baselines3-zoo settings).

Each run is a fresh subprocess (imports are not timed, environment and model creation are), peers alternate
seed by seed in one session so that machine drift hits both, and the report gives medians and their ratio.
"Solved" is the first time the mean of the last 20 finished training episodes reaches the env's threshold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch

from cartpole.population import train_population
from cartpole.settings import CARTPOLE_PPO, TrainConfig
from cartpole.train import train

from . import SCRIPTS


def sb3_time_to_solve(seed: int, threads: int, total_steps: int = 100_000) -> dict[str, Any]:
    """SB3 PPO with the rl-baselines3-zoo CartPole-v1 hyperparameters (hyperparams/ppo.yml)."""
    # stable-baselines3 is the optional 'bench' extra: imported only when the peer runs.
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    class Solved(BaseCallback):
        def __init__(self, t0: float) -> None:
            super().__init__()
            self.t0, self.returns, self.solved = t0, [], None

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(info["episode"]["r"])
                    if self.solved is None and len(self.returns) >= 20 and np.mean(self.returns[-20:]) >= 475:
                        self.solved = (time.perf_counter() - self.t0, self.num_timesteps)
            return True

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    linear = lambda v: lambda p: p * v  # noqa: E731
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        seed=seed,
        device="cpu",
    )
    cb = Solved(t0)
    model.learn(total_steps, callback=cb)
    return {
        "peer": "sb3",
        "seed": seed,
        "solved_s": cb.solved[0] if cb.solved else None,
        "solved_step": cb.solved[1] if cb.solved else None,
        "wall_s": time.perf_counter() - t0,
        "last20_mean": float(np.mean(cb.returns[-20:])),
    }


def ours_time_to_solve(seed: int, threads: int, total_steps: int = 100_000) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as out:
        s = train(
            TrainConfig(
                seed=seed,
                total_steps=total_steps,
                threads=threads,
                out=out,
                progress=False,
                tensorboard=False,
                plot=False,
            )
        )
    return {"peer": "rlhf-toy", **s}


def population_wall(seeds: int, threads: int, total_steps: int = 100_000, workers: int = 1) -> dict[str, Any]:
    """Wall time of a population of `seeds` agents (seeds 0..N-1), each trained for `total_steps`, split over
    `workers` processes (`TrainConfig.workers`)."""
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        cfg = TrainConfig(
            total_steps=total_steps,
            threads=threads,
            out=out,
            progress=False,
            tensorboard=False,
            plot=False,
            seeds=f"0-{seeds - 1}",
            workers=workers,
        )
        s = train_population(cfg, list(range(seeds)), CARTPOLE_PPO)["summary"]
    return {
        "peer": f"population-{seeds}",
        "seeds": seeds,
        "workers": workers,
        "wall_s": time.perf_counter() - t0,
        "fraction_solved": s["fraction_solved"],
        "median_solved_step": s["solved_step"]["median"],
        "median_eval_mean": s["eval_mean"]["median"],
    }


RUNNERS = {"sb3": sb3_time_to_solve, "rlhf-toy": ours_time_to_solve, "population": population_wall}


def run_in_subprocess(peer: str, seed: int, threads: int, total_steps: int, **kwargs: Any) -> dict[str, Any]:
    """One run in a fresh interpreter, so that no run inherits another's warm caches (`kwargs` go to the runner)."""
    # torch.optim imports torch._dynamo on the first optimizer (~0.65 s here); both peers pay it before
    # their clocks start, so the figure compares training, not a one-time import.
    code = (
        f"import json, sys, torch._dynamo; sys.path.insert(0, {str(SCRIPTS)!r}); "
        "from benchlib.cartpole import RUNNERS; "  # population: seed = N
        f"print(json.dumps(RUNNERS[{peer!r}]({seed}, {threads}, {total_steps}, **{kwargs!r})))"
    )
    env_vars = {"OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env_vars}, check=False
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        return {"peer": peer, "seed": seed, "error": tail[0]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median_or_none(xs: list[float | None]) -> float | None:
    """Median over runs, counting an unsolved run as infinitely slow (so it can only hurt)."""
    vals = [float("inf") if x is None else x for x in xs]
    m = float(np.median(vals)) if vals else float("nan")
    return None if m == float("inf") else m


def compare(seeds: list[int], peers: list[str], threads: int, total_steps: int) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for seed in seeds:
        for peer in peers:  # alternate peers seed by seed
            r = run_in_subprocess(peer, seed, threads, total_steps)
            print(json.dumps(r), flush=True)
            runs.append(r)
    report: dict[str, Any] = {"threads": threads, "seeds": seeds, "total_steps": total_steps}
    for peer in peers:
        mine = [r for r in runs if r["peer"] == peer]
        report[peer] = {
            "median_solved_s": median_or_none([r.get("solved_s") for r in mine]),
            "median_solved_step": median_or_none([r.get("solved_step") for r in mine]),
            "solved": sum(r.get("solved_s") is not None for r in mine),
            "runs": len(mine),
        }
        if peer == "rlhf-toy":
            report[peer]["eval_ge_475"] = sum((r.get("eval_mean") or 0) >= 475 for r in mine)
    if "sb3" in report and report["sb3"]["median_solved_s"] and report["rlhf-toy"]["median_solved_s"]:
        ours, sb3 = report["rlhf-toy"]["median_solved_s"], report["sb3"]["median_solved_s"]
        report["ratio_time_to_solved_ours_over_sb3"] = ours / sb3
    return report


def population_curve(
    sizes: list[int],
    threads: int,
    total_steps: int,
    population_threads: int | None = None,
    repeats: int = 1,
    workers: int = 1,
) -> dict[str, Any]:
    """Wall time against population size, beside one single run (`cartpole train`, seed 0) measured in the same
    session: `repeats` rounds of [single run, each size], each run in a fresh process, so that machine drift hits
    every size alike; the report gives medians and the ratio of medians. The single run uses `threads`, the
    populations `population_threads` (default: the same) or `workers` processes of one thread each."""
    pop_threads = population_threads or threads
    singles: list[dict[str, Any]] = []
    rows: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    for _ in range(repeats):
        singles.append(run_in_subprocess("rlhf-toy", 0, threads, total_steps))
        print(json.dumps(singles[-1]), flush=True)
        for n in sizes:
            rows[n].append(run_in_subprocess("population", n, pop_threads, total_steps, workers=min(workers, n)))
            print(json.dumps(rows[n][-1]), flush=True)
    base = median_or_none([r.get("wall_s") for r in singles])
    populations = []
    for n in sizes:
        wall = median_or_none([r.get("wall_s") for r in rows[n]])
        populations.append(
            {
                "seeds": n,
                "median_wall_s": wall,
                "walls_s": [r.get("wall_s") for r in rows[n]],
                "fraction_solved": [r.get("fraction_solved") for r in rows[n]],
                "ratio_to_single_run": wall / base if wall and base else None,
            }
        )
    return {
        "threads": threads,
        "population_threads": pop_threads,
        "workers": workers,
        "total_steps_per_seed": total_steps,
        "repeats": repeats,
        "single_run_median_wall_s": base,
        "single_run_walls_s": [r.get("wall_s") for r in singles],
        "populations": populations,
    }
