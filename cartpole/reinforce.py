"""REINFORCE on the PPO core's pieces: discounted returns and the plain policy-gradient loss.

As in the lesson: one environment per agent, one update per finished episode, with a learned value baseline
(advantage = G_t - V(s_t), and V regressed on G_t) or with none (advantage = G_t).

Several seeds train at once as a population (`train_reinforce_population`): agent k plays its own plain env,
reset with seed k + episode as a single run resets it, samples with its own generator, and is updated on its
own episode. The agents play their episodes in lockstep (one batched forward pass per step for all of them;
an agent whose episode ended waits for the others), then all update at once; the stacked Adam is N Adams. So
agent k computes what a single run with seed k computes, up to float rounding (tests/test_lesson.py). A
single run is a population of one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from rlhf_toy.advantages import discounted_returns
from rlhf_toy.config import check, option
from rlhf_toy.losses import policy_gradient_loss, value_loss
from rlhf_toy.masks import Dims

from .agent import MLPActorCritic
from .envs import make_vec_env
from .stacked import PopulationMLPActorCritic, build_population

UNIFORMS_CHUNK = 512  # uniform numbers an agent draws at a time for its actions (CartPole's episodes: <= 500 steps)


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


def run_episode(
    env: gym.Env, agent: MLPActorCritic, generator: torch.Generator, seed: int | None
) -> tuple[Tensor, Tensor, Tensor]:
    """Play one episode of one agent in a plain env, sampling as training does. Returns `(observations
    [T, obs_dim], actions [T], rewards [T])`."""
    [(obs, actions, rewards)] = play_episodes([env], agent_actions(agent), [generator], [seed])
    return obs, actions, rewards


def agent_actions(agent: MLPActorCritic | PopulationMLPActorCritic):
    """`act(obs [N, obs_dim], uniforms [N]) -> actions [N]` for a single agent (N = 1) or a population."""
    return lambda obs, uniforms: agent.act(obs, uniforms)[0]


def play_episodes(
    envs: list[gym.Env], act, generators: list[torch.Generator], seeds: list[int | None]
) -> list[tuple[Tensor, Tensor, Tensor]]:
    """One episode in each env at once (env k reset with `seeds[k]`, actions of agent k drawn with
    `generators[k]`), one batched `act` per step until every episode has ended. Returns each episode's
    `(observations [T_k, obs_dim], actions [T_k], rewards [T_k])`."""
    n = len(envs)
    obs = np.stack([env.reset(seed=s)[0] for env, s in zip(envs, seeds)]).astype(np.float32)
    history: list[list[tuple[np.ndarray, int, float]]] = [[] for _ in range(n)]
    running = list(range(n))
    uniforms = torch.empty(n, UNIFORMS_CHUNK)
    t = 0
    while running:
        if t % UNIFORMS_CHUNK == 0:  # only agents still playing draw, as each would alone
            for k in running:
                uniforms[k] = torch.rand(UNIFORMS_CHUNK, generator=generators[k])
        actions = act(torch.from_numpy(obs), uniforms[:, t % UNIFORMS_CHUNK]).tolist()
        still = []
        for k in running:
            next_obs, reward, terminated, truncated, _ = envs[k].step(actions[k])
            history[k].append((obs[k].copy(), actions[k], float(reward)))
            obs[k] = next_obs
            if not (terminated or truncated):
                still.append(k)
        running = still
        t += 1
    return [
        (
            torch.from_numpy(np.stack([h[0] for h in hist])),
            torch.tensor([h[1] for h in hist]),
            torch.tensor([h[2] for h in hist]),
        )
        for hist in history
    ]


def reinforce_loss(
    logprobs: Tensor, values: Tensor, returns: Tensor, mask: Tensor, baseline: bool, dim: Dims = None
) -> Tensor:
    """The lesson's loss on one episode: -mean(log pi * A) (+ value MSE with a baseline). `[T]` tensors (padding
    where `mask` is 0) -> scalar; `[N, T]` with `dim=1` -> one loss per agent `[N]`."""
    advantages = returns - values.detach() if baseline else returns
    loss = policy_gradient_loss(logprobs, advantages, mask, dim)
    if baseline:
        loss = loss + value_loss(values, values.detach(), returns, mask=mask, dim=dim)
    return loss


def padded(episodes: list[tuple[Tensor, Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Episodes of unequal length -> `(observations [N, T, obs_dim], actions [N, T], rewards [N, T], mask [N, T])`."""
    T = max(len(e[2]) for e in episodes)
    obs = torch.zeros(len(episodes), T, episodes[0][0].shape[-1])
    actions, rewards = torch.zeros(len(episodes), T, dtype=torch.long), torch.zeros(len(episodes), T)
    mask = torch.zeros(len(episodes), T, dtype=torch.bool)
    for k, (o, a, r) in enumerate(episodes):
        obs[k, : len(r)], actions[k, : len(r)], rewards[k, : len(r)], mask[k, : len(r)] = o, a, r, True
    return obs, actions, rewards, mask


def episode_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Discounted returns of padded episodes, each ending at its last real step: `[N, T] -> [N, T]`."""
    lengths = mask.sum(1)
    dones = torch.arange(rewards.shape[1]).unsqueeze(0) == (lengths - 1).unsqueeze(1)
    return discounted_returns(rewards.T, dones.T, gamma=gamma, mask=mask.T).T


def train_reinforce_population(cfg: ReinforceConfig, seeds: list[int]) -> list[EpisodeLog]:
    """One REINFORCE agent per seed (`cfg.seed` is not used), trained as one population; a log per seed."""
    t0 = time.perf_counter()
    probe = make_vec_env(cfg.env_id, 1)  # checks the env id and its spaces (one-line errors)
    obs_dim, n_actions = probe.single_observation_space.shape[0], int(probe.single_action_space.n)
    probe.close()
    policy, generators = build_population(seeds, obs_dim, n_actions, hidden=64, threads=None)
    envs = [gym.make(cfg.env_id) for _ in seeds]
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate)
    logs, steps = [EpisodeLog() for _ in seeds], [0] * len(seeds)
    act = agent_actions(policy)
    for episode in range(cfg.episodes):
        episodes = play_episodes(envs, act, generators, [s + episode for s in seeds])
        obs, actions, rewards, mask = padded(episodes)
        returns = episode_returns(rewards, mask, cfg.gamma)
        logprobs, _, values = policy.evaluate(obs, actions)
        optimizer.zero_grad(set_to_none=True)
        # One loss per agent (reduced over its own steps, dim 1); disjoint parameters: each agent's own gradient.
        reinforce_loss(logprobs, values, returns, mask, cfg.baseline, dim=1).sum().backward()
        optimizer.step()
        for k, (_, _, r) in enumerate(episodes):
            steps[k] += len(r)
            logs[k].returns.append(float(r.sum()))
            logs[k].env_steps.append(steps[k])
    for env in envs:
        env.close()
    for log in logs:
        log.wall_s = (time.perf_counter() - t0) / len(seeds)
    return logs


def train_reinforce(cfg: ReinforceConfig) -> EpisodeLog:
    """One REINFORCE run with `cfg.seed` (a population of one)."""
    return train_reinforce_population(cfg, [cfg.seed])[0]


def gradient_variance(
    agent: MLPActorCritic, episodes: list[tuple[Tensor, Tensor, Tensor]], gamma: float, baseline: bool
) -> float:
    """Total variance (trace of the covariance) of the per-episode policy-gradient estimates."""
    grads = []
    actor_params = list(agent.actor.parameters())
    for observations, actions, rewards in episodes:
        returns = episode_returns(rewards.unsqueeze(0), torch.ones(1, len(rewards), dtype=torch.bool), gamma)[0]
        logprobs, _, values = agent.evaluate(observations, actions)
        advantages = returns - values.detach() if baseline else returns
        g = torch.autograd.grad(policy_gradient_loss(logprobs, advantages), actor_params)
        grads.append(torch.cat([x.flatten() for x in g]))
    stacked = torch.stack(grads)
    return float(stacked.var(dim=0).sum())
