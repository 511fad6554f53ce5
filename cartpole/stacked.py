"""A population of MLP actor-critics as one batched network: N agents' weights stacked on a leading dimension,
each layer one batched matrix product (`StackedMLP`, one autograd node with a hand-written backward), so that
N agents cost about one agent's Python overhead. The training loop that uses it is `cartpole.population`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from rlhf_toy.seeding import seed_everything

from .agent import MLPActorCritic, inverse_cdf_sample, tanh_


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
            [nn.Parameter(torch.stack([ls[i].weight.detach() for ls in linears])) for i in range(len(linears[0]))]
        )
        self.biases = nn.ParameterList(
            [
                nn.Parameter(torch.stack([ls[i].bias.detach() for ls in linears]).unsqueeze(1))
                for i in range(len(linears[0]))
            ]
        )
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


def build_population(
    seeds: list[int], obs_dim: int, n_actions: int, hidden: int, threads: int
) -> tuple[PopulationMLPActorCritic, list[torch.Generator]]:
    """Agent k and its generator exactly as a single run with seed k builds them."""
    agents, generators = [], []
    for seed in seeds:
        generators.append(seed_everything(seed, threads))
        agents.append(MLPActorCritic(obs_dim, n_actions, hidden))
    return PopulationMLPActorCritic(agents), generators
