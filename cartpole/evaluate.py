"""Deterministic (or sampled) evaluation of an agent over N episodes, all run at once in a vector env.

Episode i is the env seeded `seed + i`, exactly as `gym.make(env_id).reset(seed=seed + i)` would play it one
episode at a time (a sync vector env keeps one env, and one seed, per episode), but every step is one batched
forward pass for all episodes.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

from .agent import MLPActorCritic
from .envs import AutoresetMode, make_vec_env


def evaluate(
    agent: MLPActorCritic,
    env_id: str,
    n_episodes: int = 20,
    seed: int = 10_000,
    deterministic: bool = True,
    max_steps: int = 100_000,
) -> list[float]:
    """Run one episode in each of `n_episodes` sub-envs (seeded `seed`, `seed+1`, ...). Returns their returns.

    Each sub-env's first episode counts; the loop stops when all have finished (or after `max_steps`).
    """
    envs = make_vec_env(env_id, n_episodes, autoreset_mode=AutoresetMode.NEXT_STEP)  # sync: a seed per episode
    generator = torch.Generator().manual_seed(seed)
    policy = lambda obs: agent.predict(obs, deterministic=deterministic, generator=generator)  # noqa: E731
    return play_first_episodes(envs, policy, seed, max_steps).tolist()


def play_first_episodes(
    envs: gym.vector.VectorEnv, policy: Callable[[np.ndarray], np.ndarray], seed: int, max_steps: int = 100_000
) -> np.ndarray:
    """The return of each sub-env's first episode `[num_envs]`, one batched `policy(obs) -> actions` per step.
    Closes `envs`."""
    try:
        obs, _ = envs.reset(seed=seed)
        returns = np.zeros(envs.num_envs)
        running = np.ones(envs.num_envs, dtype=bool)
        for _ in range(max_steps):
            obs, reward, terminated, truncated, _ = envs.step(policy(obs).astype(np.int64))
            returns += reward * running
            running &= ~(terminated | truncated)
            if not running.any():
                break
    finally:
        envs.close()
    return returns
