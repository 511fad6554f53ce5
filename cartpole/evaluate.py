"""Deterministic (or sampled) evaluation of an agent over N episodes, all run at once in a vector env.

Episode i is the env seeded `seed + i`, exactly as `gym.make(env_id).reset(seed=seed + i)` would play it one
episode at a time (a sync vector env keeps one env, and one seed, per episode), but every step is one batched
forward pass for all episodes.
"""

from __future__ import annotations

import numpy as np
import torch

from .agent import MLPActorCritic
from .envs import AutoresetMode, make_vec_env


def evaluate(agent: MLPActorCritic, env_id: str, n_episodes: int = 20, seed: int = 10_000,
             deterministic: bool = True, max_steps: int = 100_000) -> list[float]:
    """Run one episode in each of `n_episodes` sub-envs (seeded `seed`, `seed+1`, ...). Returns their returns.

    Each sub-env's first episode counts; the loop stops when all have finished (or after `max_steps`).
    """
    envs = make_vec_env(env_id, n_episodes, autoreset_mode=AutoresetMode.NEXT_STEP)  # sync: a seed per episode
    generator = torch.Generator().manual_seed(seed)
    try:
        obs, _ = envs.reset(seed=seed)
        returns = np.zeros(n_episodes)
        running = np.ones(n_episodes, dtype=bool)
        for _ in range(max_steps):
            actions = agent.predict(obs, deterministic=deterministic, generator=generator)
            obs, reward, terminated, truncated, _ = envs.step(actions.astype(np.int64))
            returns += reward * running
            running &= ~(terminated | truncated)
            if not running.any():
                break
    finally:
        envs.close()
    return returns.tolist()
