"""The CartPole agent: separate actor and critic MLPs that implement the PPO core's `ActorCritic`."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlhf_toy.errors import UserError
from rlhf_toy.io import atomic_torch_save


def _tanh_from_doubled_(y: Tensor) -> Tensor:
    """tanh(x) as 2 sigmoid(2x) - 1, in place on `y` = 2x (a tensor nothing else reads)."""
    return y.sigmoid_().mul_(2).sub_(1)


def _tanh_values(x: Tensor) -> Tensor:
    return _tanh_from_doubled_(x * 2)


class _Tanh(torch.autograd.Function):
    """tanh forward as 2 sigmoid(2x) - 1, backward as tanh's own: grad * (1 - y^2)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        y = _tanh_values(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


SMALL = 4096  # elements: below this, per-call overhead dominates and torch.tanh (one op) is the faster


def tanh(x: Tensor) -> Tensor:
    """The agent's activation: tanh; on tensors of more than `SMALL` elements computed as 2 sigmoid(2x) - 1
    (within 2e-7 of it).

    Why: torch's CPU tanh is not vectorized like its sigmoid; on this machine (torch 2.13, AVX-512) tanh of a
    population's `[32, 256, 64]` activations takes 1.1 ms and this 0.2 ms, and a population's update spends
    most of its elementwise time here. On a few rows (one env step's forward pass) one torch.tanh call is
    quicker than the three ops. The choice depends on the size only, so a population of one and a single run
    take the same path."""
    if x.numel() <= SMALL:
        return torch.tanh(x)
    return _Tanh.apply(x) if x.requires_grad and torch.is_grad_enabled() else _tanh_values(x)


def inverse_cdf_sample(probs: Tensor, uniforms: Tensor) -> Tensor:
    """A categorical sample per row from one uniform number in [0, 1) each: `probs [..., A]`, `uniforms [...]`
    -> actions `[...]` (the number of cumulative probabilities below u). The uniforms are drawn ahead, a whole
    rollout at a time, so that sampling costs one tensor op a step for one agent or a population alike, where
    `torch.multinomial` took a call per generator."""
    return (uniforms.unsqueeze(-1) >= probs.cumsum(-1)[..., :-1]).sum(-1)


def draw_uniforms(generator: torch.Generator | list[torch.Generator], n_steps: int, num_envs: int) -> Tensor:
    """The uniform numbers `[n_steps, num_envs]` that a rollout samples its actions with. A list of generators is a
    population's: agent k draws the numbers of its own sub-envs (columns k*E ... (k+1)*E - 1, E = num_envs / N)
    exactly as a single run with that generator and E envs would."""
    if isinstance(generator, torch.Generator):
        return torch.rand((n_steps, num_envs), generator=generator)
    per_agent = num_envs // len(generator)
    return torch.cat([torch.rand((n_steps, per_agent), generator=g) for g in generator], dim=1)


def tanh_(x: Tensor) -> Tensor:
    """`tanh` in place on a tensor nothing else reads (a fresh layer output): the same numbers, no new tensor."""
    return x.tanh_() if x.numel() <= SMALL else _tanh_from_doubled_(x.mul_(2))


class Tanh(nn.Module):
    """`tanh` as a module, for the `nn.Sequential` stacks (same numbers as `run_mlp`)."""

    def forward(self, x: Tensor) -> Tensor:
        return tanh(x)


def _layer(n_in: int, n_out: int, gain: float) -> nn.Linear:
    # Orthogonal weights with a per-layer gain and zero biases (PPO implementation detail 2).
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def mlp(n_in: int, n_out: int, hidden: int, out_gain: float) -> nn.Sequential:
    """n_in -> hidden -> hidden -> n_out with tanh, hidden gains sqrt(2), output gain `out_gain`."""
    return nn.Sequential(
        _layer(n_in, hidden, math.sqrt(2)),
        Tanh(),
        _layer(hidden, hidden, math.sqrt(2)),
        Tanh(),
        _layer(hidden, n_out, out_gain),
    )


def run_mlp(layers: nn.Sequential, x: Tensor) -> Tensor:
    """`layers(x)` for a stack built by `mlp`, as plain function calls: the same numbers without nn.Module's
    per-call overhead (six modules a step, paid at every env step of a rollout)."""
    first, _, middle, _, last = layers
    x = tanh(F.linear(x, first.weight, first.bias))
    x = tanh(F.linear(x, middle.weight, middle.bias))
    return F.linear(x, last.weight, last.bias)


class MLPActorCritic(nn.Module):
    """Categorical policy and state-value critic for a flat observation and a discrete action space.

    Actor and critic share nothing: on classic control a shared trunk learns worse (PPO detail 11).
    The policy head starts at gain 0.01, so the first policy is close to uniform.
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.obs_dim, self.n_actions, self.hidden = obs_dim, n_actions, hidden
        self.actor = mlp(obs_dim, n_actions, hidden, out_gain=0.01)
        self.critic = mlp(obs_dim, 1, hidden, out_gain=1.0)

    def value(self, obs: Tensor) -> Tensor:
        """V(s): `[..., obs_dim] -> [...]`."""
        return run_mlp(self.critic, obs).squeeze(-1)

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`obs [B, obs_dim]`, `actions [B]` -> `(log pi(a|s) [B], entropy [B], V(s) [B])`."""
        log_pi = torch.log_softmax(run_mlp(self.actor, obs), dim=-1)
        logprobs = log_pi.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(log_pi.exp() * log_pi).sum(-1)
        return logprobs, entropy, self.value(obs)

    @torch.no_grad()
    def act(self, obs: Tensor, uniforms: Tensor) -> tuple[Tensor, Tensor]:
        """Sample actions for a batch of observations, one uniform number each (`draw_uniforms`):
        `obs [B, obs_dim]`, `uniforms [B]` -> `(actions [B], logprobs [B])`. The critic is not run here: a
        rollout asks `value` for all its observations at once."""
        log_pi = torch.log_softmax(run_mlp(self.actor, obs), dim=-1)
        actions = inverse_cdf_sample(log_pi.exp(), uniforms)
        return actions, log_pi.gather(-1, actions.unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def predict(
        self, obs: np.ndarray | Tensor, deterministic: bool = True, generator: torch.Generator | None = None
    ) -> np.ndarray:
        """Actions for observations `[obs_dim]` or `[B, obs_dim]` (numpy in, numpy out).

        Deterministic = the most probable action; otherwise a sample from the policy.
        """
        x = torch.as_tensor(np.asarray(obs), dtype=torch.float32)
        single = x.dim() == 1
        logits = self.actor(x.unsqueeze(0) if single else x)
        if deterministic:
            actions = logits.argmax(-1)
        else:
            actions = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1)
        out = actions.numpy()
        return out[0] if single else out


def save_agent(path: str | os.PathLike[str], agent: MLPActorCritic, meta: dict[str, Any]) -> None:
    """Write a checkpoint atomically: weights plus plain-Python metadata (weights-only loadable)."""
    payload = {
        "format": "rlhf-toy/mlp-actor-critic/1",
        "obs_dim": agent.obs_dim,
        "n_actions": agent.n_actions,
        "hidden": agent.hidden,
        "state_dict": agent.state_dict(),
        "meta": meta,
    }
    atomic_torch_save(payload, path)


def load_agent(path: str | os.PathLike[str]) -> tuple[MLPActorCritic, dict[str, Any]]:
    """Load a checkpoint written by `save_agent`. Returns `(agent in eval mode, metadata)`."""
    path = Path(path)
    if path.is_dir():
        path = path / "final.pt"
    if not path.is_file():
        raise UserError(f"no checkpoint at {path}; pass a .pt file or a run directory written by 'cartpole train'")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        agent = MLPActorCritic(payload["obs_dim"], payload["n_actions"], payload["hidden"])
        agent.load_state_dict(payload["state_dict"])
    except Exception as exc:  # a truncated, foreign or corrupted file: one clear line, not a traceback
        raise UserError(f"{path} is not a readable cartpole checkpoint ({type(exc).__name__}: {exc})") from exc
    return agent.eval(), payload.get("meta", {})
