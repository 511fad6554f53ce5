"""A population of CartPole agents trained as one batched network: `cartpole train --seeds 0-31`.

Agent k starts from exactly the network a single run with seed k builds, samples its actions and shuffles its
minibatches with its own generator (the one `seed_everything(k)` returns), and is updated by the core's
population update (its own advantage normalization, gradient clip and KL early stop). Its layers run as batched
matmuls over the stacked weights (`torch.bmm`), whose forward pass gives the same numbers as `nn.Linear` on one
agent (the first layer's weight gradient rounds differently, by about 1e-10).

What differs from N single runs: the N x num_envs environments are one gymnasium vector env (one call steps
them all, the reason a population is fast), and CartPole's native vector env draws every sub-env's start and
reset states from one random generator, seeded with the first seed. So agent k meets other start states than a
single run with seed k, and a population's results are reproducible as a whole (same seeds, same numbers),
not seed by seed. A population of one collects the single run's first rollout action for action and matches
its first update to float rounding; CartPole then amplifies the rounding over a run (tests/test_population.py).
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from rlhf_toy.advantages import gae
from rlhf_toy.errors import UserError
from rlhf_toy.io import atomic_write_json, output_lock
from rlhf_toy.logging import MetricLogger
from rlhf_toy.population import population_ppo_update
from rlhf_toy.ppo import PPOConfig, RolloutBatch, make_optimizer

from .agent import save_agent
from .envs import make_vec_env, reward_threshold
from .evaluate import play_first_episodes
from .rollout import RolloutCollector
from .settings import SolvedTracker, TrainConfig, clear_finished_run, count_iterations
from .stacked import PopulationMLPActorCritic, build_population, by_agent


def evaluate_population(
    policy: PopulationMLPActorCritic, env_id: str, n_episodes: int, seed: int, max_steps: int = 100_000
) -> np.ndarray:
    """Deterministic returns `[N, n_episodes]`: every agent's episodes in one vector env, one forward a step."""
    envs = make_vec_env(env_id, policy.n * n_episodes)
    return play_first_episodes(envs, policy.predict, seed, max_steps).reshape(policy.n, n_episodes)


def distribution(values: list[float | None]) -> dict[str, float | None]:
    """Median and interquartile range of the values that exist (None where no seed has one)."""
    xs = np.array([v for v in values if v is not None], dtype=float)
    if len(xs) == 0:
        return {"median": None, "q25": None, "q75": None}
    q25, med, q75 = np.percentile(xs, [25, 50, 75])
    return {"median": float(med), "q25": float(q25), "q75": float(q75)}


# Measured on CartPole-v1 with 64-64 MLPs (docs: Results, Speed): the stacked network, its gradients, Adam's
# moments and each agent's generator take about 0.4 MB an agent; the rollout buffers about 64 bytes an env step.
BYTES_PER_AGENT = 400_000
BYTES_PER_ENV_STEP = 64


def available_memory() -> int:
    """Bytes of physical memory free now (Linux and macOS; elsewhere, unknown: 0 disables the check)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def check_population_fits(cfg: TrainConfig, n_agents: int) -> None:
    """Refuse, before allocating anything, a population that cannot fit in the memory free now."""
    need = n_agents * (BYTES_PER_AGENT * cfg.hidden // 64 + BYTES_PER_ENV_STEP * cfg.num_envs * cfg.n_steps)
    free = available_memory()
    if free and need > 0.8 * free:
        raise UserError(
            f"a population of {n_agents} agents needs about {need / 1e9:.1f} GB, more than the "
            f"{free / 1e9:.1f} GB of memory free; train fewer seeds at once (e.g. --seeds 0-"
            f"{max(0, int(0.8 * free / (need / n_agents)) - 1)}) and the rest in another run"
        )


def train_population(cfg: TrainConfig, seeds: list[int], ppo: PPOConfig) -> dict[str, Any]:
    """Train one agent per seed; write `seed_K/final.pt` per agent and `summary.json`. With `cfg.workers` > 1,
    the seeds are split into that many contiguous shares, each trained as its own population in its own process
    (one torch thread each; its metrics in `part_I/`)."""
    check_population_fits(cfg, len(seeds))
    iterations = count_iterations(cfg, ppo)
    with output_lock(cfg.out, "CartPole run"):
        t0 = time.perf_counter()
        shares = [list(map(int, s)) for s in np.array_split(seeds, min(cfg.workers, len(seeds)))]
        if len(shares) == 1:
            parts = [_train_population(cfg, seeds, ppo, iterations, Path(cfg.out))]
        else:
            parts = _train_in_processes(cfg, shares, ppo, iterations)
        summary = population_summary(
            cfg,
            seeds,
            [row for part in parts for row in part["per_seed"]],
            parts[0]["env_steps_per_seed"],
            time.perf_counter() - t0,
        )
        atomic_write_json(Path(cfg.out) / "summary.json", summary)
    agents = [agent for part in parts for agent in part["agents"]]
    policy = parts[0]["policy"] if len(parts) == 1 else PopulationMLPActorCritic(agents)
    return {"summary": summary, "policy": policy, "trackers": [t for part in parts for t in part["trackers"]]}


def _train_in_processes(
    cfg: TrainConfig, shares: list[list[int]], ppo: PPOConfig, iterations: int
) -> list[dict[str, Any]]:
    """Each share of the seeds as a population in its own process, with one torch thread. Forked where the OS
    allows it (Linux), so that a worker starts with everything imported; spawned elsewhere."""
    ctx = get_context("fork" if sys.platform == "linux" else "spawn")
    with ProcessPoolExecutor(len(shares), mp_context=ctx) as pool:
        futures = [
            pool.submit(_train_share, cfg, share, ppo, iterations, Path(cfg.out) / f"part_{i}")
            for i, share in enumerate(shares)
        ]
        try:
            return [f.result() for f in futures]
        except BrokenProcessPool:
            raise UserError(
                f"a worker process of the population died before it finished (killed, or out of memory); nothing "
                f"was written to {cfg.out}'s summary; run again, with fewer seeds or --workers 1"
            ) from None


def _train_share(cfg: TrainConfig, seeds: list[int], ppo: PPOConfig, iterations: int, log_dir: Path) -> dict[str, Any]:
    # One torch thread (TrainConfig refuses --threads > 1 with --workers; `seed_everything` sets it): two busy
    # processes with two threads each would thrash two cores.
    part = _train_population(cfg, seeds, ppo, iterations, log_dir)
    del part["policy"]  # its agents travel back instead (plain modules, rebuilt into one population)
    return part


def _train_population(
    cfg: TrainConfig, seeds: list[int], ppo: PPOConfig, iterations: int, log_dir: Path
) -> dict[str, Any]:
    t0 = time.perf_counter()
    N = len(seeds)
    envs = make_vec_env(cfg.env_id, N * cfg.num_envs)
    obs_dim, n_actions = envs.single_observation_space.shape[0], int(envs.single_action_space.n)
    policy, generators = build_population(seeds, obs_dim, n_actions, cfg.hidden, cfg.threads)
    optimizer = make_optimizer(policy.parameters(), ppo)
    collector = RolloutCollector(envs, seeds[0])
    out = Path(cfg.out)
    clear_finished_run(out)
    logger = MetricLogger(log_dir, report_to=cfg.trackers, project="cartpole")
    threshold = reward_threshold(cfg.env_id)
    trackers = [SolvedTracker(threshold, cfg.solved_window, t0) for _ in seeds]
    try:
        for it in range(iterations):
            r = collector.collect(policy, cfg.n_steps, generators)
            for ep in r.episodes:  # sub-envs are grouped by agent; each agent's steps are 1/N of the total
                trackers[ep.env // cfg.num_envs].add([replace(ep, env_step=ep.env_step // N)])
            advantages, returns = gae(
                r.rewards,
                r.values,
                r.next_values,
                r.terminated,
                r.truncated,
                gamma=ppo.gamma,
                lam=ppo.gae_lambda,
                mask=r.mask,
            )
            batch = RolloutBatch(
                by_agent(r.observations, N),
                by_agent(r.actions, N),
                by_agent(r.logprobs, N),
                by_agent(r.values, N),
                by_agent(advantages, N),
                by_agent(returns, N),
                by_agent(r.mask, N),
            )
            stats = population_ppo_update(
                policy, optimizer, batch, ppo, generators=generators, progress=it / iterations
            )
            means = [t.mean() for t in trackers]
            row = {f"losses/{k}": float(v.nanmedian()) for k, v in stats.items()}
            row.update(
                {
                    "charts/episodic_return_median": distribution(means)["median"],
                    "charts/solved_fraction": sum(t.solved_step is not None for t in trackers) / N,
                    "charts/SPS": collector.env_steps / (time.perf_counter() - t0),
                }
            )
            logger.log(collector.env_steps // N, row)
    finally:
        envs.close()
        logger.close()
    evals = evaluate_population(policy, cfg.env_id, cfg.eval_episodes, seeds[0] + 10_000)
    per_seed, agents = [], []
    for k, (seed, tracker) in enumerate(zip(seeds, trackers)):
        meta = {
            "env_id": cfg.env_id,
            "train": asdict(cfg),
            "ppo": ppo.to_dict(),
            "seed": seed,
            "population": seeds,
            "env_steps": collector.env_steps // N,
            "eval_mean": float(evals[k].mean()),
        }
        agents.append(policy.agent(k))
        save_agent(out / f"seed_{seed}" / "final.pt", agents[-1], meta)
        per_seed.append(
            {
                "seed": seed,
                "solved_step": tracker.solved_step,
                "solved_s": None if tracker.solved_s is None else round(tracker.solved_s, 3),
                "last20_mean": None if not tracker.all_returns else float(np.mean(tracker.all_returns[-20:])),
                "eval_mean": float(evals[k].mean()),
                "episodes": len(tracker.all_returns),
            }
        )
    return {
        "per_seed": per_seed,
        "env_steps_per_seed": collector.env_steps // N,
        "policy": policy,
        "agents": agents,
        "trackers": trackers,
    }


def population_summary(
    cfg: TrainConfig, seeds: list[int], per_seed: list[dict[str, Any]], env_steps_per_seed: int, wall_s: float
) -> dict[str, Any]:
    """`summary.json`: each seed's figures, and their distribution over the seeds."""
    N = len(seeds)
    return {
        "env_id": cfg.env_id,
        "seeds": seeds,
        "env_steps_per_seed": env_steps_per_seed,
        "workers": cfg.workers,
        "wall_s": round(wall_s, 3),
        "fraction_solved": sum(s["solved_step"] is not None for s in per_seed) / N,
        "solved_s": distribution([s["solved_s"] for s in per_seed]),
        "solved_step": distribution([s["solved_step"] for s in per_seed]),
        "last20_mean": distribution([s["last20_mean"] for s in per_seed]),
        "eval_mean": distribution([s["eval_mean"] for s in per_seed]),
        "per_seed": per_seed,
    }
