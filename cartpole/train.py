"""Training the MLP agent with the PPO core on a gymnasium vector env.

One iteration: collect N envs x T steps -> GAE (rlhf_toy.advantages.gae) -> PPO epochs
(rlhf_toy.ppo.ppo_update) -> log, evaluate now and then, keep the best checkpoint.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from rlhf_toy.advantages import gae
from rlhf_toy.config import non_default
from rlhf_toy.errors import UserError
from rlhf_toy.io import atomic_write_json, output_lock
from rlhf_toy.logging import MetricLogger
from rlhf_toy.ppo import PPOConfig, RolloutBatch, make_optimizer, ppo_update
from rlhf_toy.report.page import write_report
from rlhf_toy.seeding import seed_everything

from .agent import MLPActorCritic, save_agent
from .envs import make_vec_env, reward_threshold
from .evaluate import evaluate
from .plots import plot_learning_curve
from .population import train_population
from .rollout import RolloutCollector
from .settings import (
    CARTPOLE_PPO,
    SolvedTracker,
    TrainConfig,
    cartpole_ppo_config,
    clear_finished_run,
    count_iterations,
    parse_seeds,
)

__all__ = ["CARTPOLE_PPO", "TrainConfig", "TrainResult", "cartpole_ppo_config", "parse_seeds", "run_training", "train"]


@dataclass
class TrainResult:
    summary: dict[str, Any]  # what `train` returns and `cartpole train` prints
    agent: MLPActorCritic  # the final policy
    episode_returns: list[float]  # every finished training episode, in order
    episode_steps: list[int]  # total env steps when each ended


# PPOConfig's settings a CartPole agent does not read, with why: `cartpole train` refuses them as flags, and
# `train` refuses a config that changes them.
UNREAD = {
    name: "a CartPole sample is one env step: there are no tokens to aggregate or to average ratios over"
    for name in ("ratio_level", "loss_aggregation")
}


def check_reads(ppo: PPOConfig) -> None:
    """Refuse a `PPOConfig` that changes a setting CartPole does not read (`UNREAD`)."""
    for name in non_default(ppo, UNREAD):
        raise UserError(f"{name}={getattr(ppo, name)!r} means nothing here: {UNREAD[name]}; leave it at 'token'")


def train(cfg: TrainConfig, ppo: PPOConfig | None = None) -> dict[str, Any]:
    """Train, write the run directory, and return the summary (also saved as `summary.json`). With `cfg.seeds`,
    train a population (`cartpole.population.train_population`) and return its summary."""
    check_reads(ppo or CARTPOLE_PPO)
    if cfg.seed_list is not None:
        return train_population(cfg, cfg.seed_list, ppo or CARTPOLE_PPO)["summary"]
    return run_training(cfg, ppo).summary


def run_training(cfg: TrainConfig, ppo: PPOConfig | None = None) -> TrainResult:
    """`train` of one agent, returning the agent and the episode history as well."""
    if cfg.seed_list is not None:
        raise UserError("run_training trains one agent; for --seeds use train() or train_population()")
    ppo = ppo or CARTPOLE_PPO
    iterations = count_iterations(cfg, ppo)
    with output_lock(cfg.out, "CartPole run"):
        return _run_training(cfg, ppo, iterations)


def _run_training(cfg: TrainConfig, ppo: PPOConfig, iterations: int) -> TrainResult:
    t0 = time.perf_counter()
    generator = seed_everything(cfg.seed, cfg.threads)
    envs = make_vec_env(cfg.env_id, cfg.num_envs)
    obs_dim, n_actions = envs.single_observation_space.shape[0], int(envs.single_action_space.n)
    agent = MLPActorCritic(obs_dim, n_actions, cfg.hidden)
    optimizer = make_optimizer(agent.parameters(), ppo)
    collector = RolloutCollector(envs, cfg.seed)
    out = Path(cfg.out)
    clear_finished_run(out)
    meta = {"env_id": cfg.env_id, "train": asdict(cfg), "ppo": ppo.to_dict()}
    preset = {**asdict(TrainConfig()), **CARTPOLE_PPO.to_dict()}  # what report.html compares the settings with
    atomic_write_json(out / "settings.json", {"settings": {**asdict(cfg), **ppo.to_dict()}, "preset": preset})
    logger = MetricLogger(out, report_to=cfg.trackers, project="cartpole", config=meta)
    solved = SolvedTracker(reward_threshold(cfg.env_id), cfg.solved_window, t0)
    best_eval, next_eval = -float("inf"), cfg.eval_every
    bar = tqdm(total=iterations * cfg.num_envs * cfg.n_steps, unit="step", disable=not cfg.progress, leave=False)

    try:
        for it in range(iterations):
            # 1. Experience from the current policy.
            rollout = collector.collect(agent, cfg.n_steps, generator)
            solved.add(rollout.episodes)
            # 2. Advantages by the core's GAE; padded (autoreset) steps are masked.
            advantages, returns = gae(
                rollout.rewards,
                rollout.values,
                rollout.next_values,
                rollout.terminated,
                rollout.truncated,
                gamma=ppo.gamma,
                lam=ppo.gae_lambda,
                mask=rollout.mask,
            )
            flat = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731  [T, N, ...] -> [T*N, ...]
            batch = RolloutBatch(
                flat(rollout.observations),
                flat(rollout.actions),
                flat(rollout.logprobs),
                flat(rollout.values),
                flat(advantages),
                flat(returns),
                flat(rollout.mask),
            )
            # 3. PPO epochs on the batch.
            stats = ppo_update(agent, optimizer, batch, ppo, progress=it / iterations, generator=generator)
            # 4. Logging, evaluation and checkpoints.
            step = collector.env_steps
            row = {f"losses/{k}": v for k, v in stats.items()}
            row.update(
                {
                    "charts/episodic_return": solved.mean(),
                    "charts/episodic_length": float(np.mean([e.length for e in rollout.episodes]))
                    if rollout.episodes
                    else None,
                    "charts/episodes": len(solved.all_returns),
                    "charts/SPS": step / (time.perf_counter() - t0),
                }
            )
            if cfg.eval_every and step >= next_eval and it < iterations - 1:
                t_eval = time.perf_counter()
                next_eval += cfg.eval_every
                eval_mean = float(np.mean(evaluate(agent, cfg.env_id, cfg.eval_episodes, seed=cfg.seed + 10_000)))
                row["eval/mean_return"] = eval_mean
                if eval_mean >= best_eval:
                    best_eval = eval_mean
                    save_agent(out / "best.pt", agent, {**meta, "env_steps": step, "eval_mean": eval_mean})
                solved.pause(time.perf_counter() - t_eval)
            logger.log(step, row)
            bar.update(cfg.num_envs * cfg.n_steps)
            bar.set_postfix(ret=f"{solved.mean() or 0:.0f}", refresh=False)
    finally:
        bar.close()
        envs.close()
        logger.close()

    wall_s = time.perf_counter() - t0
    train_s = wall_s - solved.paused_s
    final_returns = evaluate(agent, cfg.env_id, cfg.eval_episodes, seed=cfg.seed + 10_000)
    eval_mean = float(np.mean(final_returns))
    save_agent(out / "final.pt", agent, {**meta, "env_steps": collector.env_steps, "eval_mean": eval_mean})
    if eval_mean >= best_eval:
        save_agent(out / "best.pt", agent, {**meta, "env_steps": collector.env_steps, "eval_mean": eval_mean})
        best_eval = eval_mean
    summary = {
        "seed": cfg.seed,
        "env_id": cfg.env_id,
        "env_steps": collector.env_steps,
        "wall_s": round(wall_s, 3),
        "train_s": round(train_s, 3),
        "solved_step": solved.solved_step,
        "solved_s": None if solved.solved_s is None else round(solved.solved_s, 3),
        "last20_mean": None if not solved.all_returns else float(np.mean(solved.all_returns[-20:])),
        "eval_mean": eval_mean,
        "eval_std": float(np.std(final_returns)),
        "best_eval_mean": best_eval,
        "episodes": len(solved.all_returns),
    }
    atomic_write_json(out / "summary.json", summary)
    if cfg.plot:
        plot_learning_curve(
            solved.all_returns,
            solved.threshold,
            out / "learning_curve.png",
            title=f"PPO on {cfg.env_id}, seed {cfg.seed}",
        )
        write_report([out])
    return TrainResult(summary, agent, solved.all_returns, solved.all_steps)
