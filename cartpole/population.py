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

import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from rlhf_toy.advantages import gae
from rlhf_toy.io import atomic_write_json, output_lock
from rlhf_toy.logging import MetricLogger
from rlhf_toy.population import population_ppo_update
from rlhf_toy.ppo import PPOConfig, RolloutBatch, make_optimizer
from rlhf_toy.seeding import seed_everything

from .agent import MLPActorCritic, inverse_cdf_sample, save_agent, tanh_
from .envs import make_vec_env, reward_threshold
from .evaluate import play_first_episodes
from .rollout import RolloutCollector
from .train import SolvedTracker, TrainConfig, count_iterations


def stacked_linear(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """x @ W^T + b as nn.Linear computes it, agent by agent: `[N, B, n_in]`, `[N, n_out, n_in]`, `[N, 1, n_out]`
    -> `[N, B, n_out]` (baddbmm with a transposed weight ran 3x slower than bmm + add with 2 threads here)."""
    return torch.bmm(x, w.transpose(1, 2)).add_(b)


def run_stacked_mlp(x: Tensor, layers: Sequence[tuple[Tensor, Tensor]]) -> list[Tensor]:
    """The stacked layers' forward pass, tanh between them (in place, as `agent.tanh` computes it): returns the
    input and every layer's output, `[N, B, n_in]` first, `[N, B, n_out]` last."""
    acts = [x]
    for i, (w, b) in enumerate(layers):
        out = stacked_linear(acts[-1], w, b)
        acts.append(tanh_(out) if i < len(layers) - 1 else out)
    return acts


class _StackedMLP(torch.autograd.Function):
    """`run_stacked_mlp` with a hand-written backward: `(x, w0, b0, w1, b1, ...) -> output`.

    Autograd would compute a weight's gradient as `x^T @ grad`, the layout of `w^T`; for the output layers
    (n_out 1 or 2) MKL's batched gemm is 8x slower in that layout than in `grad^T @ x` (440 us against 56 us at
    `[32, 256, 64]` on one core here), while for the input layer (n_in 4) it is the other way round. So the
    backward pass picks, per layer, the layout whose result has the smaller dimension first. One autograd node
    for the whole network instead of two a layer: a population runs about 2,000 minibatches a run."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, *params: Tensor) -> Tensor:
        layers = list(zip(params[0::2], params[1::2]))
        acts = run_stacked_mlp(x, layers)
        ctx.save_for_backward(*acts[:-1], *params[0::2])  # each layer's input (= the previous tanh output), weights
        return acts[-1]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        saved = ctx.saved_tensors
        n = len(saved) // 2
        inputs, weights = saved[:n], saved[n:]
        grads: list[Tensor | None] = [None] * (2 * n)
        for i in reversed(range(n)):
            x, w = inputs[i], weights[i]
            if w.shape[1] <= w.shape[2]:
                grads[2 * i] = torch.bmm(grad.transpose(1, 2), x)
            else:
                grads[2 * i] = torch.bmm(x.transpose(1, 2), grad).transpose(1, 2)
            grads[2 * i + 1] = grad.sum(1, keepdim=True)
            if i > 0:  # through the weights, then the tanh before them: grad * (1 - tanh^2), tanh's own derivative
                grad = torch.ops.aten.tanh_backward(torch.bmm(grad, w), x)
        grad_x = torch.bmm(grad, weights[0]) if ctx.needs_input_grad[0] else None
        return grad_x, *grads


class StackedMLP(nn.Module):
    """N copies of `agent.mlp`'s architecture with their weights stacked: `[N, B, n_in] -> [N, B, n_out]`."""

    def __init__(self, mlps: list[nn.Sequential]) -> None:
        super().__init__()
        linears = [[m for m in mlp if isinstance(m, nn.Linear)] for mlp in mlps]
        self.weights = nn.ParameterList(
            [nn.Parameter(torch.stack([ls[i].weight.detach() for ls in linears])) for i in range(len(linears[0]))])
        self.biases = nn.ParameterList(
            [nn.Parameter(torch.stack([ls[i].bias.detach() for ls in linears]).unsqueeze(1))
             for i in range(len(linears[0]))])
        # The same Parameter objects as plain tuples: indexing a ParameterList costs ~3 us a time, and a
        # population's rollout runs this forward pass at every env step.
        self._layers = tuple(zip(self.weights, self.biases))
        self._params = tuple(t for layer in self._layers for t in layer)

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled():
            return _StackedMLP.apply(x, *self._params)
        return run_stacked_mlp(x, self._layers)[-1]


class PopulationMLPActorCritic(nn.Module):
    """N `MLPActorCritic`s as one module. `evaluate` takes `[N, b, ...]`; `act`/`value` take the (time-major)
    `[..., N * E, obs_dim]` observations of one vector env whose sub-envs are grouped by agent."""

    def __init__(self, agents: list[MLPActorCritic]) -> None:
        super().__init__()
        self.n = len(agents)
        self.obs_dim, self.n_actions, self.hidden = agents[0].obs_dim, agents[0].n_actions, agents[0].hidden
        self.actor = StackedMLP([a.actor for a in agents])
        self.critic = StackedMLP([a.critic for a in agents])

    def _by_agent(self, obs: Tensor) -> Tensor:
        return obs.reshape(self.n, -1, obs.shape[-1])

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`obs [N, b, obs_dim]`, `actions [N, b]` -> `(log pi(a|s), entropy, V(s))`, each `[N, b]`."""
        log_pi = torch.log_softmax(self.actor(obs), dim=-1)
        logprobs = log_pi.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(log_pi.exp() * log_pi).sum(-1)
        return logprobs, entropy, self.critic(obs).squeeze(-1)

    def value(self, obs: Tensor) -> Tensor:
        """V(s) for time-major observations of the population's vector env: `[..., N * E, obs_dim] -> [..., N * E]`."""
        lead, d = obs.shape[:-1], obs.shape[-1]
        x = obs.reshape(-1, self.n, lead[-1] // self.n, d)  # [T, N, E, d]
        T, E = x.shape[0], x.shape[2]
        v = self.critic(x.transpose(0, 1).reshape(self.n, T * E, d))  # [N, T * E, 1]
        return v.reshape(self.n, T, E).transpose(0, 1).reshape(lead)

    @torch.no_grad()
    def act(self, obs: Tensor, uniforms: Tensor) -> tuple[Tensor, Tensor]:
        """`MLPActorCritic.act` for every agent at once: flat `[N * E, obs_dim]` observations and `[N * E]` uniforms
        (agent k's own, `draw_uniforms`) -> flat `(actions [N * E], logprobs [N * E])`."""
        log_pi = torch.log_softmax(self.actor(self._by_agent(obs)), dim=-1)
        actions = inverse_cdf_sample(log_pi.exp(), uniforms.reshape(self.n, -1))
        logprobs = log_pi.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return actions.reshape(-1), logprobs.reshape(-1)

    @torch.no_grad()
    def predict(self, obs: np.ndarray) -> np.ndarray:
        """The most probable action for flat `[N * E, obs_dim]` observations (deterministic evaluation)."""
        x = torch.as_tensor(np.asarray(obs), dtype=torch.float32)
        return self.actor(self._by_agent(x)).argmax(-1).reshape(-1).numpy()

    def agent(self, k: int) -> MLPActorCritic:
        """Agent k as a plain `MLPActorCritic` (to save, load, evaluate or watch)."""
        single = MLPActorCritic(self.obs_dim, self.n_actions, self.hidden)
        for stacked, mlp in ((self.actor, single.actor), (self.critic, single.critic)):
            linears = [m for m in mlp if isinstance(m, nn.Linear)]
            with torch.no_grad():
                for lin, w, b in zip(linears, stacked.weights, stacked.biases):
                    lin.weight.copy_(w[k])
                    lin.bias.copy_(b[k, 0])
        return single.eval()


def by_agent(x: Tensor, n: int) -> Tensor:
    """Time-major `[T, N * E, ...]` -> `[N, T * E, ...]`, each agent's steps in a single run's order."""
    T, NE = x.shape[:2]
    return x.reshape(T, n, NE // n, *x.shape[2:]).transpose(0, 1).reshape(n, T * (NE // n), *x.shape[2:])


def evaluate_population(policy: PopulationMLPActorCritic, env_id: str, n_episodes: int, seed: int,
                        max_steps: int = 100_000) -> np.ndarray:
    """Deterministic returns `[N, n_episodes]`: every agent's episodes in one vector env, one forward a step."""
    envs = make_vec_env(env_id, policy.n * n_episodes)
    return play_first_episodes(envs, policy.predict, seed, max_steps).reshape(policy.n, n_episodes)


def build_population(seeds: list[int], obs_dim: int, n_actions: int, hidden: int,
                     threads: int) -> tuple[PopulationMLPActorCritic, list[torch.Generator]]:
    """Agent k and its generator exactly as a single run with seed k builds them."""
    agents, generators = [], []
    for seed in seeds:
        generators.append(seed_everything(seed, threads))
        agents.append(MLPActorCritic(obs_dim, n_actions, hidden))
    return PopulationMLPActorCritic(agents), generators


def distribution(values: list[float | None]) -> dict[str, float | None]:
    """Median and interquartile range of the values that exist (None where no seed has one)."""
    xs = np.array([v for v in values if v is not None], dtype=float)
    if len(xs) == 0:
        return {"median": None, "q25": None, "q75": None}
    q25, med, q75 = np.percentile(xs, [25, 50, 75])
    return {"median": float(med), "q25": float(q25), "q75": float(q75)}


def train_population(cfg: TrainConfig, seeds: list[int], ppo: PPOConfig) -> dict[str, Any]:
    """Train one agent per seed; write `seed_K/final.pt` per agent and `summary.json`. With `cfg.workers` > 1,
    the seeds are split into that many contiguous shares, each trained as its own population in its own process
    (one torch thread each; its metrics in `part_I/`)."""
    iterations = count_iterations(cfg, ppo)
    with output_lock(cfg.out, "CartPole run"):
        t0 = time.perf_counter()
        shares = [list(map(int, s)) for s in np.array_split(seeds, min(cfg.workers, len(seeds)))]
        if len(shares) == 1:
            parts = [_train_population(cfg, seeds, ppo, iterations, Path(cfg.out))]
        else:
            parts = _train_in_processes(cfg, shares, ppo, iterations)
        summary = population_summary(cfg, seeds, [row for part in parts for row in part["per_seed"]],
                                     parts[0]["env_steps_per_seed"], time.perf_counter() - t0)
        atomic_write_json(Path(cfg.out) / "summary.json", summary)
    agents = [agent for part in parts for agent in part["agents"]]
    policy = parts[0]["policy"] if len(parts) == 1 else PopulationMLPActorCritic(agents)
    return {"summary": summary, "policy": policy, "trackers": [t for part in parts for t in part["trackers"]]}


def _train_in_processes(cfg: TrainConfig, shares: list[list[int]], ppo: PPOConfig,
                        iterations: int) -> list[dict[str, Any]]:
    """Each share of the seeds as a population in its own process, with one torch thread. Forked where the OS
    allows it (Linux), so that a worker starts with everything imported; spawned elsewhere."""
    ctx = get_context("fork" if sys.platform == "linux" else "spawn")
    with ProcessPoolExecutor(len(shares), mp_context=ctx) as pool:
        futures = [pool.submit(_train_share, cfg, share, ppo, iterations, Path(cfg.out) / f"part_{i}")
                   for i, share in enumerate(shares)]
        return [f.result() for f in futures]


def _train_share(cfg: TrainConfig, seeds: list[int], ppo: PPOConfig, iterations: int,
                 log_dir: Path) -> dict[str, Any]:
    # One torch thread (TrainConfig refuses --threads > 1 with --workers; `seed_everything` sets it): two busy
    # processes with two threads each would thrash two cores.
    part = _train_population(cfg, seeds, ppo, iterations, log_dir)
    del part["policy"]  # its agents travel back instead (plain modules, rebuilt into one population)
    return part


def _train_population(cfg: TrainConfig, seeds: list[int], ppo: PPOConfig, iterations: int,
                      log_dir: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    N = len(seeds)
    envs = make_vec_env(cfg.env_id, N * cfg.num_envs)
    obs_dim, n_actions = envs.single_observation_space.shape[0], int(envs.single_action_space.n)
    policy, generators = build_population(seeds, obs_dim, n_actions, cfg.hidden, cfg.threads)
    optimizer = make_optimizer(policy.parameters(), ppo)
    collector = RolloutCollector(envs, seeds[0])
    out = Path(cfg.out)
    logger = MetricLogger(log_dir, tensorboard=cfg.tensorboard)
    threshold = reward_threshold(cfg.env_id)
    trackers = [SolvedTracker(threshold, cfg.solved_window, t0) for _ in seeds]
    try:
        for it in range(iterations):
            r = collector.collect(policy, cfg.n_steps, generators)
            for ep in r.episodes:  # sub-envs are grouped by agent; each agent's steps are 1/N of the total
                trackers[ep.env // cfg.num_envs].add([replace(ep, env_step=ep.env_step // N)])
            advantages, returns = gae(r.rewards, r.values, r.next_values, r.terminated, r.truncated,
                                      gamma=ppo.gamma, lam=ppo.gae_lambda, mask=r.mask)
            batch = RolloutBatch(by_agent(r.observations, N), by_agent(r.actions, N), by_agent(r.logprobs, N),
                                 by_agent(r.values, N), by_agent(advantages, N), by_agent(returns, N),
                                 by_agent(r.mask, N))
            stats = population_ppo_update(policy, optimizer, batch, ppo, generators=generators,
                                          progress=it / iterations)
            means = [t.mean() for t in trackers]
            row = {f"losses/{k}": float(v.nanmedian()) for k, v in stats.items()}
            row.update({"charts/episodic_return_median": distribution(means)["median"],
                        "charts/solved_fraction": sum(t.solved_step is not None for t in trackers) / N,
                        "charts/SPS": collector.env_steps / (time.perf_counter() - t0)})
            logger.log(collector.env_steps // N, row)
    finally:
        envs.close()
        logger.close()
    evals = evaluate_population(policy, cfg.env_id, cfg.eval_episodes, seeds[0] + 10_000)
    per_seed, agents = [], []
    for k, (seed, tracker) in enumerate(zip(seeds, trackers)):
        meta = {"env_id": cfg.env_id, "train": asdict(cfg), "ppo": ppo.to_dict(), "seed": seed,
                "population": seeds, "env_steps": collector.env_steps // N, "eval_mean": float(evals[k].mean())}
        agents.append(policy.agent(k))
        save_agent(out / f"seed_{seed}" / "final.pt", agents[-1], meta)
        per_seed.append({"seed": seed, "solved_step": tracker.solved_step,
                         "solved_s": None if tracker.solved_s is None else round(tracker.solved_s, 3),
                         "last20_mean": None if not tracker.all_returns else float(np.mean(tracker.all_returns[-20:])),
                         "eval_mean": float(evals[k].mean()), "episodes": len(tracker.all_returns)})
    return {"per_seed": per_seed, "env_steps_per_seed": collector.env_steps // N, "policy": policy,
            "agents": agents, "trackers": trackers}


def population_summary(cfg: TrainConfig, seeds: list[int], per_seed: list[dict[str, Any]], env_steps_per_seed: int,
                       wall_s: float) -> dict[str, Any]:
    """`summary.json`: each seed's figures, and their distribution over the seeds."""
    N = len(seeds)
    return {
        "env_id": cfg.env_id, "seeds": seeds, "env_steps_per_seed": env_steps_per_seed, "workers": cfg.workers,
        "wall_s": round(wall_s, 3),
        "fraction_solved": sum(s["solved_step"] is not None for s in per_seed) / N,
        "solved_s": distribution([s["solved_s"] for s in per_seed]),
        "solved_step": distribution([s["solved_step"] for s in per_seed]),
        "last20_mean": distribution([s["last20_mean"] for s in per_seed]),
        "eval_mean": distribution([s["eval_mean"] for s in per_seed]),
        "per_seed": per_seed,
    }
