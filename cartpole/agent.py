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


def _tanh_values(x: Tensor) -> Tensor:
    return torch.sigmoid(x * 2).mul_(2).sub_(1)


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


def tanh(x: Tensor) -> Tensor:
    """The agent's activation: tanh, computed as 2 sigmoid(2x) - 1 (absolute error under 2e-7).

    Why: torch's CPU tanh is not vectorized like its sigmoid; on this machine (torch 2.13, AVX-512) tanh of a
    population's `[32, 256, 64]` activations takes 1.1 ms and this 0.2 ms, and a population's update spends
    most of its elementwise time here. Single runs and populations use this same function, so they compute
    the same numbers."""
    return _Tanh.apply(x) if x.requires_grad and torch.is_grad_enabled() else _tanh_values(x)


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
        _layer(n_in, hidden, math.sqrt(2)), Tanh(),
        _layer(hidden, hidden, math.sqrt(2)), Tanh(),
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
        """V(s): `[B, obs_dim] -> [B]`."""
        return run_mlp(self.critic, obs).squeeze(-1)

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`obs [B, obs_dim]`, `actions [B]` -> `(log pi(a|s) [B], entropy [B], V(s) [B])`."""
        log_pi = torch.log_softmax(run_mlp(self.actor, obs), dim=-1)
        logprobs = log_pi.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(log_pi.exp() * log_pi).sum(-1)
        return logprobs, entropy, self.value(obs)

    @torch.no_grad()
    def act(self, obs: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Sample actions for a batch of observations: `[B, obs_dim] -> (actions [B], logprobs [B], values [B])`."""
        log_pi = torch.log_softmax(run_mlp(self.actor, obs), dim=-1)
        actions = torch.multinomial(log_pi.exp(), 1, generator=generator).squeeze(-1)
        return actions, log_pi.gather(-1, actions.unsqueeze(-1)).squeeze(-1), self.value(obs)

    @torch.no_grad()
    def sample(self, obs: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Actions `[B]` for observations `[B, obs_dim]`, drawn as `act` draws them (the same generator use), without
        the critic's forward pass: for REINFORCE, which needs no value while it plays."""
        probs = torch.log_softmax(run_mlp(self.actor, obs), dim=-1).exp()  # exactly `act`'s probabilities
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    @torch.no_grad()
    def predict(self, obs: np.ndarray | Tensor, deterministic: bool = True,
                generator: torch.Generator | None = None) -> np.ndarray:
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
