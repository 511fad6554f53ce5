"""Training the MLP agent with the PPO core on a gymnasium vector env.

One iteration: collect N envs x T steps -> GAE (rlhf_toy.advantages.gae) -> PPO epochs
(rlhf_toy.ppo.ppo_update) -> log, evaluate now and then, keep the best checkpoint.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from rlhf_toy.advantages import gae
from rlhf_toy.config import check, derived, option
from rlhf_toy.errors import UserError
from rlhf_toy.io import atomic_write_json, output_lock
from rlhf_toy.logging import MetricLogger
from rlhf_toy.ppo import PPOConfig, RolloutBatch, make_optimizer, ppo_update
from rlhf_toy.seeding import seed_everything

from .agent import MLPActorCritic, save_agent
from .envs import make_vec_env, reward_threshold
from .evaluate import evaluate
from .plots import plot_learning_curve
from .rollout import Episode, RolloutCollector

# The preset `cartpole train` uses: one complete PPOConfig, tuned for CartPole-v1 by wall time to solved over
# seeds 0-4 (README, "Speed"). It starts from rl-baselines3-zoo's CartPole settings and trades the zoo's 20
# epochs on 256 steps for 5 epochs on 512 steps (16 envs x 32) at a higher learning rate: a gradient step
# costs ~1 ms here, so fewer of them on fresher data reach 475 sooner. Comments mark what differs from
# PPOConfig's defaults.
CARTPOLE_PPO = PPOConfig(
    learning_rate=5e-3,  # differs (3e-4): few, large steps on fresh data; annealed to 0 below
    anneal_lr=True,
    n_epochs=5,  # differs (10): fewer passes over each 512-step batch
    minibatch_size=256,  # differs (64): two minibatches per 512-step batch
    gamma=0.98,  # differs (0.99): rl-zoo's CartPole value
    gae_lambda=0.8,  # differs (0.95): rl-zoo's CartPole value
    clip=True,
    clip_range=0.2,
    anneal_clip=True,  # differs (False): rl-zoo anneals the clip to 0 too, so a solved policy stays solved
    clip_range_vf=None,
    normalize_advantages=True,
    ent_coef=0.0,
    vf_coef=0.5,
    max_grad_norm=0.5,
    target_kl=None,
    adam_eps=1e-5,
)


def cartpole_ppo_config(**overrides: Any) -> PPOConfig:
    """`CARTPOLE_PPO` with the given fields changed (`dataclasses.replace`), e.g. `learning_rate=3e-3`."""
    return replace(CARTPOLE_PPO, **overrides)


@dataclass
class TrainConfig:
    """Run settings for `cartpole train` (the PPO hyperparameters are in `rlhf_toy.ppo.PPOConfig`)."""

    env_id: str = option("Gymnasium id: a Discrete-action env with a flat Box observation.", "CartPole-v1")
    seed: int = option("Seed for the networks, the sampling and the envs.", 0)
    seeds: str | None = option("Train a population instead, one agent per seed, in one process: 'A-B' (e.g. 0-31) "
                               "or 'A,B,C'.", None)
    total_steps: int = option("Env steps to train for (summed over envs).", 100_000)
    num_envs: int = option("Envs stepped in parallel.", 16)
    n_steps: int = option("Steps per env per rollout; a batch holds num_envs x n_steps steps.", 32)
    hidden: int = option("Width of the two hidden layers of actor and critic.", 64)
    out: str = option("Run directory for metrics, plots and checkpoints.", "runs/cartpole")
    eval_every: int = option("Evaluate deterministically every this many env steps (0: only at the end).", 10_000)
    eval_episodes: int = option("Episodes per evaluation.", 20)
    solved_window: int = option("Solved = mean return of this many last episodes >= the env's threshold.", 20)
    threads: int = option("torch threads (1 is fastest for these small networks).", 1)
    workers: int = option("With --seeds: processes that train the seeds at once, each a population of a contiguous "
                          "share of them with one torch thread (2 on two cores). Same seeds and workers, same "
                          "numbers; another split gives agents other start states.", 1)
    progress: bool = option("Show a progress bar.", True)
    tensorboard: bool = option("Also log to TensorBoard when it is installed.", True)
    plot: bool = option("Save a learning-curve PNG at the end.", True)

    seed_list: list[int] | None = derived()

    def __post_init__(self) -> None:
        self.seed_list = parse_seeds(self.seeds) if self.seeds else None
        for name in ("total_steps", "num_envs", "n_steps", "hidden", "eval_episodes", "solved_window", "threads",
                     "workers"):
            check(getattr(self, name) >= 1, name, getattr(self, name), ">= 1")
        check(self.workers == 1 or self.seed_list is not None, "workers", self.workers,
              "1 for a single run (workers split a population: add --seeds 0-31)")
        check(self.workers == 1 or self.threads == 1, "threads", self.threads,
              "1 with --workers (each worker process runs one torch thread)")
        check(self.eval_every >= 0, "eval_every", self.eval_every, ">= 0 (0 evaluates only at the end)")
        rollout = self.num_envs * self.n_steps
        check(self.total_steps >= rollout, "total_steps", self.total_steps,
              f"at least one rollout (num_envs x n_steps = {rollout}); or lower --n_steps")


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
    check(bool(seeds) and len(set(seeds)) == len(seeds), "seeds", text,
          "a range such as 0-31 or distinct integers such as 0,1,5")
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
            if (self.solved_step is None and self.threshold is not None and len(self.recent) == self.recent.maxlen
                    and np.mean(self.recent) >= self.threshold):
                self.solved_step, self.solved_s = ep.env_step, ep.time_s - self.t0 - self.paused_s

    def pause(self, seconds: float) -> None:
        """Time spent outside training (evaluating, saving): not counted in `solved_s` from now on."""
        self.paused_s += seconds

    def mean(self) -> float | None:
        return float(np.mean(self.recent)) if self.recent else None


@dataclass
class TrainResult:
    summary: dict[str, Any]  # what `train` returns and `cartpole train` prints
    agent: MLPActorCritic  # the final policy
    episode_returns: list[float]  # every finished training episode, in order
    episode_steps: list[int]  # total env steps when each ended


def train(cfg: TrainConfig, ppo: PPOConfig | None = None) -> dict[str, Any]:
    """Train, write the run directory, and return the summary (also saved as `summary.json`). With `cfg.seeds`,
    train a population (`cartpole.population.train_population`) and return its summary."""
    if cfg.seed_list is not None:
        from .population import train_population

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


def count_iterations(cfg: TrainConfig, ppo: PPOConfig) -> int:
    """Rollouts to run. Whole rollouts only: at least total_steps, as Stable-Baselines3 does, said when rounding
    up; a minibatch larger than a rollout is refused."""
    rollout = cfg.num_envs * cfg.n_steps
    if ppo.minibatch_size > rollout:
        raise UserError(f"minibatch_size ({ppo.minibatch_size}) is larger than the batch (num_envs x n_steps = "
                        f"{rollout}); lower --minibatch_size or raise --n_steps")
    iterations = -(-cfg.total_steps // rollout)
    if iterations * rollout != cfg.total_steps:
        print(f"note: training {iterations * rollout} env steps: {iterations} rollouts of num_envs x n_steps = "
              f"{rollout} (--total_steps {cfg.total_steps} rounded up)", file=sys.stderr)
    return iterations


def _run_training(cfg: TrainConfig, ppo: PPOConfig, iterations: int) -> TrainResult:
    t0 = time.perf_counter()
    generator = seed_everything(cfg.seed, cfg.threads)
    envs = make_vec_env(cfg.env_id, cfg.num_envs)
    obs_dim, n_actions = envs.single_observation_space.shape[0], int(envs.single_action_space.n)
    agent = MLPActorCritic(obs_dim, n_actions, cfg.hidden)
    optimizer = make_optimizer(agent.parameters(), ppo)
    collector = RolloutCollector(envs, cfg.seed)
    out = Path(cfg.out)
    logger = MetricLogger(out, tensorboard=cfg.tensorboard)
    meta = {"env_id": cfg.env_id, "train": asdict(cfg), "ppo": ppo.to_dict()}
    solved = SolvedTracker(reward_threshold(cfg.env_id), cfg.solved_window, t0)
    best_eval, next_eval = -float("inf"), cfg.eval_every
    bar = tqdm(total=iterations * cfg.num_envs * cfg.n_steps, unit="step", disable=not cfg.progress, leave=False)

    try:
        for it in range(iterations):
            # 1. Experience from the current policy.
            rollout = collector.collect(agent, cfg.n_steps, generator)
            solved.add(rollout.episodes)
            # 2. Advantages by the core's GAE; padded (autoreset) steps are masked.
            advantages, returns = gae(rollout.rewards, rollout.values, rollout.next_values, rollout.terminated,
                                      rollout.truncated, gamma=ppo.gamma, lam=ppo.gae_lambda, mask=rollout.mask)
            flat = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731  [T, N, ...] -> [T*N, ...]
            batch = RolloutBatch(flat(rollout.observations), flat(rollout.actions), flat(rollout.logprobs),
                                 flat(rollout.values), flat(advantages), flat(returns), flat(rollout.mask))
            # 3. PPO epochs on the batch.
            stats = ppo_update(agent, optimizer, batch, ppo, progress=it / iterations, generator=generator)
            # 4. Logging, evaluation and checkpoints.
            step = collector.env_steps
            row = {f"losses/{k}": v for k, v in stats.items()}
            row.update({"charts/episodic_return": solved.mean(), "charts/episodes": len(solved.all_returns),
                        "charts/SPS": step / (time.perf_counter() - t0)})
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
        "seed": cfg.seed, "env_id": cfg.env_id, "env_steps": collector.env_steps, "wall_s": round(wall_s, 3),
        "train_s": round(train_s, 3),
        "solved_step": solved.solved_step,
        "solved_s": None if solved.solved_s is None else round(solved.solved_s, 3),
        "last20_mean": None if not solved.all_returns else float(np.mean(solved.all_returns[-20:])),
        "eval_mean": eval_mean, "eval_std": float(np.std(final_returns)), "best_eval_mean": best_eval,
        "episodes": len(solved.all_returns),
    }
    atomic_write_json(out / "summary.json", summary)
    if cfg.plot:
        plot_learning_curve(solved.all_returns, solved.threshold, out / "learning_curve.png",
                            title=f"PPO on {cfg.env_id}, seed {cfg.seed}")
    return TrainResult(summary, agent, solved.all_returns, solved.all_steps)
