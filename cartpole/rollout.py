"""Fixed-length rollouts of N vector envs x T steps, turned into the PPO core's time-major tensors.

Gymnasium vector envs reset a finished sub-env automatically, in one of two modes:
- NEXT_STEP (the default, and CartPole's native vector env): the step that ends an episode returns the
  episode's true final observation; the *next* step call ignores the action and returns the reset
  observation with reward 0. We mark that step as padding (`mask = 0`), so it is transparent to GAE and the
  losses, and a truncated step bootstraps from `values[t + 1]` = V(final observation), for free.
- SAME_STEP: the step that ends an episode already returns the reset observation, and the final one is in
  `info["final_obs"]`; for truncated episodes we evaluate V(final observation) separately.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from .agent import MLPActorCritic, draw_uniforms
from .envs import AutoresetMode


@dataclass
class Episode:
    """A finished training episode: its return, length, and when it ended."""

    ret: float
    length: int
    env_step: int  # total env steps taken when it ended
    time_s: float  # perf_counter() when it ended
    env: int = 0  # which sub-env of the vector env played it


@dataclass
class Rollout:
    """Time-major experience `[T, N]` (`observations [T, N, obs_dim]`) plus the episodes it finished."""

    observations: Tensor
    actions: Tensor
    logprobs: Tensor
    values: Tensor
    next_values: Tensor
    rewards: Tensor
    terminated: Tensor
    truncated: Tensor
    mask: Tensor
    episodes: list[Episode] = field(default_factory=list)


class RolloutCollector:
    """Steps N vector envs with the current policy and keeps episode statistics across rollouts."""

    def __init__(self, envs: gym.vector.VectorEnv, seed: int) -> None:
        self.envs = envs
        self.num_envs = envs.num_envs
        self.same_step = envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP) == AutoresetMode.SAME_STEP
        obs, _ = envs.reset(seed=seed)
        self.obs = torch.as_tensor(obs, dtype=torch.float32)
        self.reset_next = np.zeros(self.num_envs, dtype=bool)  # NEXT_STEP: this step is an autoreset
        self.ep_return = np.zeros(self.num_envs)
        self.ep_length = np.zeros(self.num_envs, dtype=np.int64)
        self.env_steps = 0

    @torch.no_grad()
    def collect(
        self, agent: MLPActorCritic, n_steps: int, generator: torch.Generator | list[torch.Generator]
    ) -> Rollout:
        """Step the envs `n_steps` times with `agent.act`; then the critic values every observation at once (one
        forward pass instead of one a step). A population passes one generator per agent."""
        T, N = n_steps, self.num_envs
        uniforms = draw_uniforms(generator, T, N)
        obs_buf = torch.empty((T, N, self.obs.shape[-1]))
        act_buf = torch.empty((T, N), dtype=torch.long)
        logp_buf = torch.empty((T, N))
        rew = np.zeros((T, N), dtype=np.float32)
        term, trunc, mask = np.zeros((T, N), bool), np.zeros((T, N), bool), np.ones((T, N), bool)
        final_obs: list[tuple[int, int, np.ndarray]] = []  # SAME_STEP: (t, env, final obs) of truncations
        episodes: list[Episode] = []

        for t in range(T):
            actions, logprobs = agent.act(self.obs, uniforms[t])
            obs_buf[t], act_buf[t], logp_buf[t] = self.obs, actions, logprobs
            next_obs, reward, terminated, truncated, info = self.envs.step(actions.numpy())
            self.env_steps += N
            real = ~self.reset_next
            mask[t] = real
            rew[t], term[t], trunc[t] = reward, terminated & real, truncated & real
            self.ep_return += reward * real
            self.ep_length += real
            done = (terminated | truncated) & real
            if done.any():
                now = time.perf_counter()
                for i in np.flatnonzero(done):
                    episodes.append(
                        Episode(float(self.ep_return[i]), int(self.ep_length[i]), self.env_steps, now, int(i))
                    )
                    if self.same_step and truncated[i]:
                        final_obs.append((t, int(i), info["final_obs"][i]))
                self.ep_return[done], self.ep_length[done] = 0.0, 0
            if not self.same_step:
                self.reset_next = done
            self.obs = torch.as_tensor(next_obs, dtype=torch.float32)

        all_values = agent.value(torch.cat([obs_buf, self.obs.unsqueeze(0)]))  # [T + 1, N]
        val_buf, next_values = all_values[:-1], all_values[1:].clone()
        if final_obs:  # SAME_STEP: the value after a truncation is that of the final, not the reset, obs
            ts, envs, obs = zip(*final_obs)
            next_values[list(ts), list(envs)] = agent.value(torch.as_tensor(np.stack(obs), dtype=torch.float32))
        return Rollout(
            obs_buf,
            act_buf,
            logp_buf,
            val_buf,
            next_values,
            torch.from_numpy(rew),
            torch.from_numpy(term),
            torch.from_numpy(trunc),
            torch.from_numpy(mask),
            episodes,
        )
