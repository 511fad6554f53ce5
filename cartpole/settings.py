"""What a CartPole run is: its settings (`TrainConfig`), the PPO preset it trains with (`CARTPOLE_PPO`), how
many rollouts it runs, and when it counts as solved. Shared by the single run (`train`) and the population
(`population`), which import this module and not each other."""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from rlhf_toy.config import SEED_LIMIT, check, check_seed, derived, option
from rlhf_toy.errors import UserError
from rlhf_toy.logging import trackers
from rlhf_toy.ppo import PPOConfig

from .rollout import Episode

# The preset `cartpole train` uses: PPOConfig's defaults plus its own differences, tuned for CartPole-v1 by wall
# time to solved over seeds 0-4 (docs: Results, "Speed"). It starts from rl-baselines3-zoo's CartPole settings
# and trades the zoo's 20 epochs on 256 steps for 5 epochs on 512 steps (16 envs x 32) at a higher learning
# rate: a gradient step costs ~1 ms here, so fewer of them on fresher data reach 475 sooner.
CARTPOLE_PPO = PPOConfig(
    learning_rate=5e-3,  # few, large steps on fresh data; annealed to 0 below
    n_epochs=5,  # fewer passes over each 512-step batch
    minibatch_size=256,  # two minibatches per 512-step batch
    gamma=0.98,  # rl-zoo's CartPole value
    gae_lambda=0.8,  # rl-zoo's CartPole value
    anneal_clip=True,  # rl-zoo anneals the clip to 0 too, so a solved policy stays solved
)


def cartpole_ppo_config(**overrides: Any) -> PPOConfig:
    """`CARTPOLE_PPO` with the given fields changed (`dataclasses.replace`), e.g. `learning_rate=3e-3`."""
    return replace(CARTPOLE_PPO, **overrides)


@dataclass
class TrainConfig:
    """Run settings for `cartpole train` (the PPO hyperparameters are in `rlhf_toy.ppo.PPOConfig`)."""

    env_id: str = option("Gymnasium id: a Discrete-action env with a flat Box observation.", "CartPole-v1")
    seed: int = option("Seed for the networks, the sampling and the envs.", 0)
    seeds: str | None = option(
        "Train a population instead, one agent per seed, in one process: 'A-B' (e.g. 0-31) or 'A,B,C'.", None
    )
    total_steps: int = option("Env steps to train for (summed over envs).", 100_000)
    num_envs: int = option("Envs stepped in parallel.", 16)
    n_steps: int = option("Steps per env per rollout; a batch holds num_envs x n_steps steps.", 32)
    hidden: int = option("Width of the two hidden layers of actor and critic.", 64)
    out: str = option("Run directory for metrics, plots and checkpoints.", "runs/cartpole")
    eval_every: int = option("Evaluate deterministically every this many env steps (0: only at the end).", 10_000)
    eval_episodes: int = option("Episodes per evaluation.", 20)
    solved_window: int = option("Solved = mean return of this many last episodes >= the env's threshold.", 20)
    threads: int = option("torch threads (1 is fastest for these small networks).", 1)
    workers: int = option(
        "With --seeds: processes that train the seeds at once, each a population of a contiguous "
        "share of them with one torch thread (2 on two cores). Same seeds and workers, same "
        "numbers; another split gives agents other start states.",
        1,
    )
    progress: bool = option("Show a progress bar.", True)
    tensorboard: bool = option("Also log to TensorBoard when it is installed.", True)
    report_to: str = option(
        "Trackers besides metrics.jsonl: tensorboard, trackio (comma-separated), all or none (as transformers' "
        "report_to; --tensorboard False drops TensorBoard).",
        "tensorboard",
    )
    plot: bool = option("Save a learning-curve PNG and report.html at the end.", True)

    seed_list: list[int] | None = derived()
    trackers: tuple[str, ...] = derived()  # those of --report_to (less TensorBoard under --tensorboard False)

    def __post_init__(self) -> None:
        check_seed(self.seed)
        # An unknown or missing tracker: one line now, not after training.
        self.trackers = tuple(t for t in trackers(self.report_to) if t != "tensorboard" or self.tensorboard)
        self.seed_list = parse_seeds(self.seeds) if self.seeds else None
        for name in (
            "total_steps",
            "num_envs",
            "n_steps",
            "hidden",
            "eval_episodes",
            "solved_window",
            "threads",
            "workers",
        ):
            check(getattr(self, name) >= 1, name, getattr(self, name), ">= 1")
        check(
            self.workers == 1 or self.seed_list is not None,
            "workers",
            self.workers,
            "1 for a single run (workers split a population: add --seeds 0-31)",
        )
        check(
            self.workers == 1 or self.threads == 1,
            "threads",
            self.threads,
            "1 with --workers (each worker process runs one torch thread)",
        )
        check(self.eval_every >= 0, "eval_every", self.eval_every, ">= 0 (0 evaluates only at the end)")
        rollout = self.num_envs * self.n_steps
        check(
            self.total_steps >= rollout,
            "total_steps",
            self.total_steps,
            f"at least one rollout (num_envs x n_steps = {rollout}); or lower --n_steps",
        )


def parse_seeds(text: str) -> list[int]:
    """'0-31' -> [0, 1, ..., 31]; '3,5,8' -> [3, 5, 8]. A bad spec is a one-line `UserError`."""
    try:
        if "-" in text.strip("-"):
            lo, hi = (int(x) for x in text.split("-", 1))
            seeds = list(range(lo, hi + 1))
        else:
            seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        seeds = []
    check(
        bool(seeds) and len(set(seeds)) == len(seeds) and all(0 <= s < SEED_LIMIT for s in seeds),
        "seeds",
        text,
        "a range such as 0-31 or distinct integers from 0 to 4294967295 such as 0,1,5",
    )
    return seeds


class SolvedTracker:
    """Finds the first moment the mean of the last `window` finished episodes reaches `threshold`.

    Its clock measures training: time spent in evaluations and checkpoint saves (`pause`) is not counted.
    """

    def __init__(self, threshold: float | None, window: int, t0: float) -> None:
        self.threshold, self.t0 = threshold, t0
        self.paused_s = 0.0
        self.recent: deque[float] = deque(maxlen=window)
        self.all_returns: list[float] = []
        self.all_steps: list[int] = []
        self.solved_step: int | None = None
        self.solved_s: float | None = None

    def add(self, episodes: list[Episode]) -> None:
        for ep in episodes:
            self.recent.append(ep.ret)
            self.all_returns.append(ep.ret)
            self.all_steps.append(ep.env_step)
            if (
                self.solved_step is None
                and self.threshold is not None
                and len(self.recent) == self.recent.maxlen
                and np.mean(self.recent) >= self.threshold
            ):
                self.solved_step, self.solved_s = ep.env_step, ep.time_s - self.t0 - self.paused_s

    def pause(self, seconds: float) -> None:
        """Time spent outside training (evaluating, saving): not counted in `solved_s` from now on."""
        self.paused_s += seconds

    def mean(self) -> float | None:
        return float(np.mean(self.recent)) if self.recent else None


def count_iterations(cfg: TrainConfig, ppo: PPOConfig) -> int:
    """Rollouts to run. Whole rollouts only: at least total_steps, as Stable-Baselines3 does, said when rounding
    up; a minibatch larger than a rollout is refused."""
    rollout = cfg.num_envs * cfg.n_steps
    if ppo.minibatch_size > rollout:
        raise UserError(
            f"minibatch_size ({ppo.minibatch_size}) is larger than the batch (num_envs x n_steps = "
            f"{rollout}); lower --minibatch_size or raise --n_steps"
        )
    iterations = -(-cfg.total_steps // rollout)
    if iterations * rollout != cfg.total_steps:
        print(
            f"note: training {iterations * rollout} env steps: {iterations} rollouts of num_envs x n_steps = "
            f"{rollout} (--total_steps {cfg.total_steps} rounded up)",
            file=sys.stderr,
        )
    return iterations


# What a finished run leaves in its --out: a new run into the same directory removes them before it logs a
# line, so a kill early in the new run never leaves the old run's summary and checkpoints beside a new history.
FINISHED_RUN_FILES = ("summary.json", "final.pt", "best.pt", "learning_curve.png", "report.html")


def clear_finished_run(out: Path) -> None:
    """Remove a previous run's `FINISHED_RUN_FILES` from `out` (the new run's history replaces its metrics)."""
    for name in FINISHED_RUN_FILES:
        (out / name).unlink(missing_ok=True)
