"""The lesson's Build and Break exercises as experiments over several seeds.

- build: REINFORCE + baseline (500 episodes) against PPO on the lesson's budget (40 x 2048 steps).
- break_baseline: REINFORCE with and without the baseline.
- break_clip: PPO with the lesson's deliberately large updates (10x lr, 30 epochs, 25 x 2048 steps), clip 0.2
  against no clip.

Every run uses the PPO core: REINFORCE its `discounted_returns` and `policy_gradient_loss`, PPO its `gae` and
`ppo_update` through `cartpole.train`. Each experiment writes a markdown table, a CSV and a PNG of the
learning curves (mean across seeds, with a +/- 1 std band).
"""

from __future__ import annotations

import csv
import io
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from rlhf_toy.errors import UserError
from rlhf_toy.io import atomic_write_text
from rlhf_toy.logging import plt_module, save_figure

from .plots import moving_average

# The lesson's PPO (its Build answer) expressed as core settings: one env, 2048-step batches, 10 epochs of
# 256-step minibatches, lr 3e-4 constant, gamma 0.99, lambda 0.95, value loss weight 0.5, no grad clipping.
LESSON_PPO = dict(learning_rate=3e-4, anneal_lr=False, n_epochs=10, minibatch_size=256, gamma=0.99,
                  gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=None)


@dataclass
class LessonConfig:
    """Settings shared by the lesson scripts."""

    seeds: int = field(default=5, metadata={"help": "Number of seeds (0, 1, ..., seeds - 1)."})
    out: str = field(default="runs/lesson", metadata={"help": "Directory for the table (.md, .csv) and plot."})
    tiny: bool = field(default=False, metadata={"help": "A tiny budget (seconds), for smoke tests."})
    workers: int = field(default=2, metadata={"help": "Runs in parallel (processes with one torch thread each)."})

    def __post_init__(self) -> None:
        if self.seeds < 1:
            raise UserError(f"seeds must be >= 1 (got {self.seeds}); pass --seeds 5")
        if self.workers < 1:
            raise UserError(f"workers must be >= 1 (got {self.workers}); pass --workers 2")


@dataclass
class Run:
    """One training run's episode history."""

    variant: str
    seed: int
    returns: list[float]
    env_steps: list[int]
    wall_s: float


def run_reinforce(variant: str, seed: int, episodes: int, baseline: bool) -> Run:
    import torch

    from .reinforce import ReinforceConfig, train_reinforce

    torch.set_num_threads(1)
    log = train_reinforce(ReinforceConfig(episodes=episodes, baseline=baseline, seed=seed))
    return Run(variant, seed, log.returns, log.env_steps, log.wall_s)


def run_ppo(variant: str, seed: int, iterations: int, overrides: dict[str, Any]) -> Run:
    from .train import TrainConfig, cartpole_ppo_config, run_training

    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        result = run_training(
            TrainConfig(seed=seed, num_envs=1, n_steps=2048, total_steps=iterations * 2048, out=out, eval_every=0,
                        eval_episodes=1, progress=False, tensorboard=False, plot=False, threads=1),
            cartpole_ppo_config(**{**LESSON_PPO, **overrides}),
        )
    return Run(variant, seed, result.episode_returns, result.episode_steps, time.perf_counter() - t0)


def experiment_jobs(name: str, seeds: int, tiny: bool) -> list[tuple[Any, tuple[Any, ...]]]:
    """The (function, args) of every run of an experiment; variants alternate within each seed."""
    episodes = 10 if tiny else 500
    ppo_iters, break_iters = (2, 2) if tiny else (40, 25)
    variants: dict[str, list[tuple[Any, tuple[Any, ...]]]] = {
        "build": [(run_reinforce, ("REINFORCE + baseline", episodes, True)),
                  (run_ppo, ("PPO", ppo_iters, {}))],
        "break_baseline": [(run_reinforce, ("REINFORCE + baseline", episodes, True)),
                           (run_reinforce, ("REINFORCE, no baseline", episodes, False))],
        "break_clip": [(run_ppo, ("PPO, clip 0.2", break_iters, {"learning_rate": 3e-3, "n_epochs": 30})),
                       (run_ppo, ("PPO, no clip", break_iters, {"learning_rate": 3e-3, "n_epochs": 30,
                                                               "clip": False}))],
    }
    return [(fn, (args[0], seed, *args[1:])) for seed in range(seeds) for fn, args in variants[name]]


def run_experiment(name: str, cfg: LessonConfig) -> list[Run]:
    jobs = experiment_jobs(name, cfg.seeds, cfg.tiny)
    if cfg.workers == 1:
        return [fn(*args) for fn, args in jobs]
    # Spawned workers, one torch thread each: two busy processes with two threads would thrash 2 cores.
    with ProcessPoolExecutor(cfg.workers, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(fn, *args) for fn, args in jobs]
        return [f.result() for f in futures]


COLUMNS = ["last20_mean", "last50_mean", "last50_std", "best", "episodes", "env_steps", "wall_s"]


def run_metrics(run: Run) -> dict[str, float]:
    r = np.asarray(run.returns, dtype=float)
    return {"last20_mean": r[-20:].mean(), "last50_mean": r[-50:].mean(), "last50_std": r[-50:].std(),
            "best": r.max(), "episodes": len(r), "env_steps": run.env_steps[-1], "wall_s": run.wall_s}


def summarize(runs: list[Run]) -> list[dict[str, Any]]:
    """One row per variant: each metric's mean and std across seeds."""
    rows = []
    for variant in dict.fromkeys(r.variant for r in runs):
        per_seed = [run_metrics(r) for r in runs if r.variant == variant]
        row: dict[str, Any] = {"variant": variant, "seeds": len(per_seed)}
        for c in COLUMNS:
            vals = np.array([m[c] for m in per_seed])
            row[f"{c}_mean"], row[f"{c}_std"] = float(vals.mean()), float(vals.std())
        row["per_seed_last20"] = " ".join(f"{m['last20_mean']:.0f}" for m in per_seed)
        rows.append(row)
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    head = ["variant", "seeds", "mean of last 20", "mean of last 50", "noise: std of last 50", "best", "episodes",
            "env steps", "wall s", "last-20 mean per seed"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [r["variant"], str(r["seeds"])]
        for c in COLUMNS:
            digits = 1 if c == "wall_s" else 0
            cells.append(f"{r[c + '_mean']:.{digits}f} ± {r[c + '_std']:.{digits}f}")
        cells.append(r["per_seed_last20"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def csv_text(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def plot_curves(runs: list[Run], title: str, path: Path) -> None:
    """Moving average (20 episodes) of each run on a common env-step grid; mean across seeds +/- 1 std."""
    plt = plt_module()
    fig, ax = plt.subplots(figsize=(7, 4))
    for variant in dict.fromkeys(r.variant for r in runs):
        mine = [r for r in runs if r.variant == variant]
        end = min(r.env_steps[-1] for r in mine)
        grid = np.linspace(min(r.env_steps[0] for r in mine), end, 200)
        curves = np.stack([np.interp(grid, r.env_steps, moving_average(r.returns, 20)) for r in mine])
        mean, std = curves.mean(0), curves.std(0)
        ax.plot(grid, mean, label=f"{variant} ({len(mine)} seeds)")
        ax.fill_between(grid, mean - std, mean + std, alpha=0.2)
    ax.axhline(475, ls="--", c="gray", lw=1)
    ax.set(xlabel="env steps", ylabel="return (mean of last 20 episodes)", title=title, ylim=(0, 520))
    ax.legend(loc="upper left", fontsize=8)
    save_figure(fig, path)


TITLES = {
    "build": "Build: REINFORCE + baseline vs PPO on CartPole-v1",
    "break_baseline": "Break the baseline: REINFORCE with and without it",
    "break_clip": "Break the clip: PPO with 10x lr and 30 epochs, clip 0.2 vs none",
}


def main(name: str, cfg: LessonConfig) -> str:
    """Run one experiment; write `<out>/<name>.md`, `.csv` and `.png`; return the markdown table."""
    t0 = time.perf_counter()
    runs = run_experiment(name, cfg)
    rows = summarize(runs)
    table = markdown_table(rows)
    out = Path(cfg.out)
    atomic_write_text(out / f"{name}.md", f"## {TITLES[name]}\n\n{table}")
    atomic_write_text(out / f"{name}.csv", csv_text(rows))
    plot_curves(runs, TITLES[name], out / f"{name}.png")
    print(f"{TITLES[name]} ({cfg.seeds} seeds, {time.perf_counter() - t0:.0f} s)\n\n{table}")
    return table
