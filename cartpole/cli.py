"""`python -m cartpole train | eval | watch` (also installed as the `cartpole` command)."""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass

import numpy as np

from rlhf_toy.cli import Command, Group, dispatch
from rlhf_toy.config import check, check_seed, option
from rlhf_toy.errors import run_cli
from rlhf_toy.ppo import PPOConfig
from rlhf_toy.report.command import REPORT

from .agent import load_agent
from .evaluate import evaluate
from .lesson import TITLES, LessonConfig
from .lesson import main as run_lesson
from .train import CARTPOLE_PPO, UNREAD, TrainConfig, train


@dataclass
class EvalConfig:
    """Settings for `cartpole eval`."""

    checkpoint: str = option("A .pt checkpoint, or a run directory (uses its final.pt).", MISSING)
    episodes: int = option("Episodes to run.", 20)
    seed: int = option("Seed of the evaluation envs.", 10_000)
    env_id: str | None = option("Env to evaluate on (default: the one trained on).", None)
    stochastic: bool = option("Sample actions instead of taking the most probable.", False)

    def __post_init__(self) -> None:
        check_seed(self.seed)
        check(self.episodes >= 1, "episodes", self.episodes, ">= 1, e.g. 20")


@dataclass
class WatchConfig:
    """Settings for `cartpole watch`."""

    checkpoint: str = option("A .pt checkpoint, or a run directory (uses its final.pt).", MISSING)
    out: str = option("Directory for trained.gif and untrained.gif.", "runs/watch")
    seed: int = option("Seed of the episode (and of the untrained agent).", 0)
    max_steps: int = option("Stop the episode after this many steps.", 500)
    every: int = option("Keep every n-th frame (smaller GIFs).", 2)

    def __post_init__(self) -> None:
        check_seed(self.seed)
        check(self.max_steps >= 1, "max_steps", self.max_steps, ">= 1")
        check(self.every >= 1, "every", self.every, ">= 1")


def _watch(cfg: WatchConfig) -> int:
    from .watch import watch  # not at the top: importing it sets SDL's off-screen drivers, for watching only

    agent, meta = load_agent(cfg.checkpoint)
    counts = watch(agent, meta.get("env_id", "CartPole-v1"), cfg.out, cfg.seed, cfg.max_steps, cfg.every)
    print(json.dumps({"out": cfg.out, "frames": counts}))
    return 0


def _train(cfg: TrainConfig, ppo: PPOConfig) -> int:
    print(json.dumps(train(cfg, ppo)))  # with --seeds: a population, one agent per seed
    return 0


def _eval(cfg: EvalConfig) -> int:
    agent, meta = load_agent(cfg.checkpoint)
    env_id = cfg.env_id or meta.get("env_id", "CartPole-v1")
    returns = evaluate(agent, env_id, cfg.episodes, seed=cfg.seed, deterministic=not cfg.stochastic)
    print(
        json.dumps(
            {
                "env_id": env_id,
                "episodes": cfg.episodes,
                "mean": float(np.mean(returns)),
                "std": float(np.std(returns)),
                "min": min(returns),
                "max": max(returns),
            }
        )
    )
    return 0


def _lesson(name: str) -> Command:
    def run(cfg: LessonConfig) -> int:
        run_lesson(name, cfg)
        return 0

    return Command(f"{TITLES[name]} (over several seeds; writes {name}.md, .csv, .png).", (LessonConfig,), run)


COMMANDS = {
    "train": Command(
        "Train a PPO agent; prints one JSON summary line.",
        (TrainConfig, PPOConfig),
        _train,
        defaults=CARTPOLE_PPO,
        unread=UNREAD,
    ),
    "eval": Command("Evaluate a saved agent; prints mean and std return as JSON.", (EvalConfig,), _eval),
    "watch": Command("Render a trained and an untrained agent to animated GIFs.", (WatchConfig,), _watch),
    "report": REPORT,
    "lesson": Group(
        "The lesson's Build and Break exercises over several seeds.",
        {
            "build": _lesson("build"),
            "break-baseline": _lesson("break_baseline"),
            "break-clip": _lesson("break_clip"),
        },
    ),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("cartpole", COMMANDS, argv)


def console_main(argv: list[str] | None = None) -> None:
    """The `cartpole` command; `argv` (default: sys.argv[1:]) lets the scripts in scripts/ reuse it."""
    raise SystemExit(run_cli(main, argv))
