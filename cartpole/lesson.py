"""The lesson's Build and Break exercises as experiments over several seeds.

- build: REINFORCE + baseline (500 episodes) against PPO on the lesson's budget (40 x 2048 steps).
- break_baseline: REINFORCE with and without the baseline.
- break_clip: PPO with the lesson's deliberately large updates (10x lr, 30 epochs, 25 x 2048 steps), clip 0.2
  against no clip.

Every run uses the PPO core: REINFORCE its `discounted_returns` and `policy_gradient_loss`, PPO its `gae` and
the per-agent population update (`rlhf_toy.population`). All seeds of a variant train as one population
(`cartpole.reinforce`, `cartpole.population`), and an experiment's two variants run on two workers. Each
experiment writes a markdown table, a CSV and a PNG of the learning curves (mean across seeds, with a +/- 1 std
band).
"""

from __future__ import annotations

import csv
import io
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlhf_toy.config import check, option
from rlhf_toy.io import atomic_write_text
from rlhf_toy.logging import markdown_table, moving_average, plt_module, save_figure
from rlhf_toy.ppo import PPOConfig

from .population import train_population
from .reinforce import ReinforceConfig, train_reinforce_population
from .settings import TrainConfig

# The lesson's PPO (its Build answer, `ppo(iterations=40, steps=2048, epochs=10, clip=0.2, lr=3e-4)`), as
# PPOConfig's defaults plus its differences; run with one env and 2048-step batches (`lesson_train_config`).
# Nothing is annealed: the lesson's clip range and learning rate are constant.
LESSON_PPO = PPOConfig(
    anneal_lr=False,  # the lesson's Adam runs at a constant lr
    minibatch_size=256,  # `torch.randperm(steps).split(256)`
    # normalize_advantages stays True: the lesson normalizes over the whole batch, we per minibatch (docs)
    max_grad_norm=None,  # the lesson does not clip gradients
    # adam_eps stays 1e-5: the lesson uses Adam's default 1e-8 (docs list the differences)
)

# The lesson's Break-the-clip run, `ppo(iterations=25, epochs=30, lr=3e-3, clip=...)`: deliberately large
# updates. The experiment's other arm is this preset with `clip=False`, nothing else.
LESSON_BREAK_CLIP_PPO = PPOConfig(
    learning_rate=3e-3,  # 10x the lesson's lr, on purpose
    anneal_lr=False,  # constant, as in the lesson
    n_epochs=30,  # 30 epochs per batch, on purpose
    minibatch_size=256,  # as in the lesson
    # clip stays True: the experiment compares this with clip=False
    max_grad_norm=None,  # the lesson does not clip gradients
)
LESSON_STEPS = 2048  # env steps per batch, one env: `ppo(steps=2048)`


@dataclass
class LessonConfig:
    """Settings shared by the lesson scripts."""

    seeds: int = option("Number of seeds (0, 1, ..., seeds - 1).", 5)
    out: str = option("Directory for the table (.md, .csv) and plot.", "runs/lesson")
    tiny: bool = option("A tiny budget (seconds), for smoke tests.", False)
    workers: int = option("Runs in parallel (processes with one torch thread each).", 2)

    def __post_init__(self) -> None:
        check(self.seeds >= 1, "seeds", self.seeds, ">= 1, e.g. 5")
        check(self.workers >= 1, "workers", self.workers, ">= 1, e.g. 2")


@dataclass
class Run:
    """One training run's episode history."""

    variant: str
    seed: int
    returns: list[float]
    env_steps: list[int]
    wall_s: float


def run_reinforce(variant: str, seeds: list[int], episodes: int, baseline: bool) -> list[Run]:
    """Every seed's REINFORCE run at once, as one population (`cartpole.reinforce`). Each run's `wall_s` is the
    population's wall time divided by the number of seeds."""
    torch.set_num_threads(1)
    logs = train_reinforce_population(ReinforceConfig(episodes=episodes, baseline=baseline), seeds)
    return [Run(variant, seed, log.returns, log.env_steps, log.wall_s) for seed, log in zip(seeds, logs)]


def lesson_train_config(seed: int, iterations: int, out: str) -> TrainConfig:
    """The lesson's PPO run layout: one env, 2048-step batches, `iterations` batches, no periodic evaluation."""
    return TrainConfig(
        seed=seed,
        num_envs=1,
        n_steps=LESSON_STEPS,
        total_steps=iterations * LESSON_STEPS,
        out=out,
        eval_every=0,
        eval_episodes=1,
        progress=False,
        tensorboard=False,
        plot=False,
        threads=1,
    )


def run_ppo(variant: str, seeds: list[int], iterations: int, ppo: PPOConfig) -> list[Run]:
    """Every seed's PPO run at once, as one population (one env per agent, as in the lesson). Each run's
    `wall_s` is the population's wall time divided by the number of seeds."""
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        trackers = train_population(lesson_train_config(seeds[0], iterations, out), seeds, ppo)["trackers"]
        wall = (time.perf_counter() - t0) / len(seeds)
    return [Run(variant, seed, t.all_returns, t.all_steps, wall) for seed, t in zip(seeds, trackers)]


def experiment_jobs(name: str, seeds: int, tiny: bool) -> list[tuple[Any, tuple[Any, ...]]]:
    """The (function, args) of every job of an experiment; each job returns a list of runs. Every variant is one
    population job (all seeds at once); the two variants of an experiment run side by side on two workers."""
    episodes = 10 if tiny else 500
    ppo_iters, break_iters = (2, 2) if tiny else (40, 25)
    all_seeds = list(range(seeds))
    ppo = lambda variant, iters, cfg: [(run_ppo, (variant, all_seeds, iters, cfg))]  # noqa: E731
    reinforce = lambda variant, baseline: [(run_reinforce, (variant, all_seeds, episodes, baseline))]  # noqa: E731
    return {
        "build": ppo("PPO", ppo_iters, LESSON_PPO) + reinforce("REINFORCE + baseline", True),
        "break_baseline": reinforce("REINFORCE + baseline", True) + reinforce("REINFORCE, no baseline", False),
        "break_clip": ppo("PPO, clip 0.2", break_iters, LESSON_BREAK_CLIP_PPO)
        + ppo("PPO, no clip", break_iters, replace(LESSON_BREAK_CLIP_PPO, clip=False)),
    }[name]


VARIANT_ORDER = {
    "build": ["REINFORCE + baseline", "PPO"],
    "break_baseline": ["REINFORCE + baseline", "REINFORCE, no baseline"],
    "break_clip": ["PPO, clip 0.2", "PPO, no clip"],
}


def run_experiment(name: str, cfg: LessonConfig) -> list[Run]:
    jobs = experiment_jobs(name, cfg.seeds, cfg.tiny)
    if cfg.workers == 1:
        results = [fn(*args) for fn, args in jobs]
    else:
        # Spawned workers, one torch thread each: two busy processes with two threads would thrash 2 cores.
        with ProcessPoolExecutor(cfg.workers, mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(fn, *args) for fn, args in jobs]
            results = [f.result() for f in futures]
    runs = [run for result in results for run in result]
    return sorted(runs, key=lambda r: (VARIANT_ORDER[name].index(r.variant), r.seed))


COLUMNS = ["last20_mean", "last50_mean", "last50_std", "best", "episodes", "env_steps", "wall_s"]


def run_metrics(run: Run) -> dict[str, float]:
    r = np.asarray(run.returns, dtype=float)
    return {
        "last20_mean": r[-20:].mean(),
        "last50_mean": r[-50:].mean(),
        "last50_std": r[-50:].std(),
        "best": r.max(),
        "episodes": len(r),
        "env_steps": run.env_steps[-1],
        "wall_s": run.wall_s,
    }


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


def lesson_table(rows: list[dict[str, Any]]) -> str:
    """The experiment's markdown table: each metric as mean +/- std across seeds, then the per-seed last-20."""
    head = [
        "variant",
        "seeds",
        "mean of last 20",
        "mean of last 50",
        "noise: std of last 50",
        "best",
        "episodes",
        "env steps",
        "wall s",
        "last-20 mean per seed",
    ]
    digits = {c: 1 if c == "wall_s" else 0 for c in COLUMNS}
    return markdown_table(
        head,
        [
            [
                r["variant"],
                r["seeds"],
                *(f"{r[c + '_mean']:.{digits[c]}f} ± {r[c + '_std']:.{digits[c]}f}" for c in COLUMNS),
                r["per_seed_last20"],
            ]
            for r in rows
        ],
    )


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
    table = lesson_table(rows)
    out = Path(cfg.out)
    atomic_write_text(out / f"{name}.md", f"## {TITLES[name]}\n\n{table}")
    atomic_write_text(out / f"{name}.csv", csv_text(rows))
    plot_curves(runs, TITLES[name], out / f"{name}.png")
    print(f"{TITLES[name]} ({cfg.seeds} seeds, {time.perf_counter() - t0:.0f} s)\n\n{table}")
    return table
