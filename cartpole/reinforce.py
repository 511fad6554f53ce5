"""REINFORCE on the PPO core's pieces: discounted returns and the plain policy-gradient loss.

As in the lesson: one environment, one update per finished episode, with a learned value baseline
(advantage = G_t - V(s_t), and V regressed on G_t) or with none (advantage = G_t).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import gymnasium as gym
import torch

from rlhf_toy.advantages import discounted_returns
from rlhf_toy.config import check, option
from rlhf_toy.losses import policy_gradient_loss, value_loss
from rlhf_toy.seeding import seed_everything

from .agent import MLPActorCritic
from .envs import make_vec_env


@dataclass
class ReinforceConfig:
    """REINFORCE settings (defaults: the lesson's Build answer)."""

    env_id: str = option("Gymnasium id (Discrete actions, flat Box obs).", "CartPole-v1")
    episodes: int = option("Episodes to train for, one update each.", 500)
    baseline: bool = option("Subtract a learned value baseline.", True)
    learning_rate: float = option("Adam learning rate (policy and value).", 3e-3)
    gamma: float = option("Discount factor.", 0.99)
    seed: int = option("Seed of the networks, the sampling and the env.", 0)

    def __post_init__(self) -> None:
        check(self.episodes >= 1, "episodes", self.episodes, ">= 1")
        check(self.learning_rate > 0, "learning_rate", self.learning_rate, "> 0, e.g. 3e-3")
        check(0.0 <= self.gamma <= 1.0, "gamma", self.gamma, "in [0, 1], e.g. 0.99")


@dataclass
class EpisodeLog:
    returns: list[float] = field(default_factory=list)  # return of each training episode
    env_steps: list[int] = field(default_factory=list)  # total env steps when each episode ended
    wall_s: float = 0.0


def run_episode(env: gym.Env, agent: MLPActorCritic, generator: torch.Generator,
                seed: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Play one episode in a plain env (one step at a time is all REINFORCE needs, and a plain env steps ~10x
    faster than a 1-env vector env, with the same states). Returns `(observations [T, obs_dim], actions [T],
    rewards [T])`."""
    obs, _ = env.reset(seed=seed)
    observations, actions, rewards = [], [], []
    while True:
        o = torch.as_tensor(obs, dtype=torch.float32)
        a = agent.sample(o.unsqueeze(0), generator)
        obs, r, terminated, truncated, _ = env.step(int(a))
        observations.append(o)
        actions.append(a[0])
        rewards.append(float(r))
        if terminated or truncated:
            return torch.stack(observations), torch.stack(actions), torch.tensor(rewards)


def reinforce_loss(agent: MLPActorCritic, observations: torch.Tensor, actions: torch.Tensor,
                   returns: torch.Tensor, baseline: bool) -> torch.Tensor:
    """The lesson's loss on one episode: -mean(log pi * A) (+ value MSE with a baseline). `[T, ...] -> scalar`."""
    logprobs, _, values = agent.evaluate(observations, actions)
    advantages = returns - values.detach() if baseline else returns
    loss = policy_gradient_loss(logprobs, advantages)
    if baseline:
        loss = loss + value_loss(values, values.detach(), returns)
    return loss


def train_reinforce(cfg: ReinforceConfig) -> EpisodeLog:
    generator = seed_everything(cfg.seed)
    t0 = time.perf_counter()
    envs = make_vec_env(cfg.env_id, 1)  # checks the env id and its spaces (one-line errors)
    obs_dim, n_actions = envs.single_observation_space.shape[0], int(envs.single_action_space.n)
    envs.close()
    env = gym.make(cfg.env_id)
    agent = MLPActorCritic(obs_dim, n_actions)
    optimizer = torch.optim.Adam(agent.parameters(), lr=cfg.learning_rate)
    log, steps = EpisodeLog(), 0
    for episode in range(cfg.episodes):
        observations, actions, rewards = run_episode(env, agent, generator, seed=cfg.seed + episode)
        dones = torch.zeros_like(rewards, dtype=torch.bool)
        dones[-1] = True
        returns = discounted_returns(rewards, dones, gamma=cfg.gamma)
        loss = reinforce_loss(agent, observations, actions, returns, cfg.baseline)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        steps += len(rewards)
        log.returns.append(float(rewards.sum()))
        log.env_steps.append(steps)
    env.close()
    log.wall_s = time.perf_counter() - t0
    return log


def gradient_variance(agent: MLPActorCritic, episodes: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                      gamma: float, baseline: bool) -> float:
    """Total variance (trace of the covariance) of the per-episode policy-gradient estimates."""
    grads = []
    actor_params = list(agent.actor.parameters())
    for observations, actions, rewards in episodes:
        dones = torch.zeros_like(rewards, dtype=torch.bool)
        dones[-1] = True
        returns = discounted_returns(rewards, dones, gamma=gamma)
        logprobs, _, values = agent.evaluate(observations, actions)
        advantages = returns - values.detach() if baseline else returns
        g = torch.autograd.grad(policy_gradient_loss(logprobs, advantages), actor_params)
        grads.append(torch.cat([x.flatten() for x in g]))
    stacked = torch.stack(grads)
    return float(stacked.var(dim=0).sum())
