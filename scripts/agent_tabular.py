#!/usr/bin/env python
"""A FrozenLake agent record's PPO with a table in place of the language model: one logit per state and move, one
value per state, trained by the core's `gae` and `ppo_update` on the record's budget (steps, episodes a step, PPO's
epochs, minibatches of episodes, gamma, GAE lambda, the value head's learning-rate scale, the turn limit). What the
environment's reward gives when reading the state is free: a reference line for the language model's run.

    python scripts/agent_tabular.py --env frozenlake-slippery --learning_rate 0.03 --seeds 0 1 2
    python scripts/agent_tabular.py --env frozenlake-slippery --learning_rate 0.03 --value_lr_scale 0   # no critic

Prints one JSON line per seed (greedy success computed exactly over the turn limit, the last 10 steps' sampled
success, the first step whose 5-step moving average came within 0.05 of the optimal policy, as `compare.first_at`
reads it) and one with their means.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor, nn

from rlhf_toy.advantages import gae
from rlhf_toy.cli import none_or, one_line_error
from rlhf_toy.errors import UserError, run_cli
from rlhf_toy.lm.agents.compare import first_at
from rlhf_toy.lm.agents.envs import FrozenLakeText, action_values
from rlhf_toy.lm.agents.registry import ENVIRONMENTS
from rlhf_toy.lm.agents.trainer import agent_settings
from rlhf_toy.lm.algorithms.online import get_algorithm
from rlhf_toy.ppo import RolloutBatch, make_optimizer, ppo_update


class TabularActorCritic(nn.Module):
    """Logits `[n_states, n_actions]` and values `[n_states]`, all zero at the start (the uniform policy)."""

    def __init__(self, n_states: int, n_actions: int) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(n_states, n_actions))
        self.values = nn.Parameter(torch.zeros(n_states))

    def evaluate(self, states: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`states [B]`, `actions [B]` -> `(log pi(a|s) [B], entropy [B], V(s) [B])`."""
        logp = torch.log_softmax(self.logits[states], -1)
        return logp.gather(-1, actions[:, None])[:, 0], -(logp.exp() * logp).sum(-1), self.values[states]


@dataclass
class Episodes:
    """A batch of episodes, time-major and padded: `[T, B]` each."""

    states: Tensor
    actions: Tensor
    rewards: Tensor
    next_states: Tensor
    terminated: Tensor
    truncated: Tensor
    mask: Tensor
    success: float


def play(env: FrozenLakeText, probs: np.ndarray, n: int, max_turns: int, rng: np.random.Generator) -> Episodes:
    """`n` episodes of the table's policy `probs [n_states, n_actions]` in gymnasium's FrozenLake (`env.env`)."""
    episodes = []
    for _ in range(n):
        s, _ = env.env.reset(seed=int(rng.integers(2**31)))
        steps = []
        for turn in range(max_turns):
            a = int(rng.choice(probs.shape[1], p=probs[s]))
            s2, r, terminated, _, _ = env.env.step(a)
            steps.append((s, a, float(r), s2, terminated, not terminated and turn + 1 == max_turns))
            s = s2
            if terminated:
                break
        episodes.append(steps)
    T = max(len(e) for e in episodes)
    cols = np.zeros((6, T, n))
    mask = np.zeros((T, n))
    for b, e in enumerate(episodes):
        cols[:, : len(e), b] = np.array(e, dtype=float).T
        mask[: len(e), b] = 1
    states, actions, rewards, nxt, term, trunc = (torch.tensor(c) for c in cols)
    success = float(np.mean([e[-1][2] > 0 for e in episodes]))
    return Episodes(
        states.long(),
        actions.long(),
        rewards.float(),
        nxt.long(),
        term.bool(),
        trunc.bool(),
        torch.tensor(mask) > 0,
        success,
    )


def real_steps(x: Tensor, real: Tensor) -> Tensor:
    """`[T, B]` -> `[n]`: the real steps, batch-major (each episode's steps consecutive, as `ppo_update`'s
    `episodes` wants them)."""
    return x.T.flatten()[real]


def greedy_success(env: FrozenLakeText, logits: np.ndarray, horizon: int) -> float:
    """The greedy table's exact success probability from the start within `horizon` steps (policy evaluation over
    gymnasium's transition table)."""
    P, greedy = env.env.unwrapped.P, logits.argmax(-1)
    value = np.zeros(len(P))
    for _ in range(horizon):
        value = np.array([action_values(P, s, value, 1.0)[greedy[s]] for s in range(len(P))])
    return float(value[0])


def train(env_name: str, seed: int, learning_rate: float, value_lr_scale: float | None = None, **ppo_fields) -> dict:
    """One seed of the table on `env_name`'s agent record: PPO's settings as `rlhf-toy agent --env ENV` gets them,
    the table's `learning_rate`, and `ppo_fields` (PPOConfig's, and `steps`) on top."""
    record = ENVIRONMENTS[env_name]
    rl, ppo = agent_settings(record, get_algorithm("ppo"), None, None)
    if "steps" in ppo_fields:
        rl = replace(rl, steps=ppo_fields.pop("steps"))
    ppo = replace(ppo, learning_rate=learning_rate, **ppo_fields)
    scale = rl.value_lr_scale if value_lr_scale is None else value_lr_scale
    env = record.make()
    assert isinstance(env, FrozenLakeText)
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    table = TabularActorCritic(env.size**2, len(env.actions))
    optimizer = make_optimizer([{"params": [table.logits]}, {"params": [table.values]}], ppo)
    sampled = []
    for step in range(rl.steps):
        with torch.no_grad():
            probs = torch.softmax(table.logits, -1).numpy().astype(np.float64)
            ep = play(env, probs / probs.sum(-1, keepdims=True), rl.batch_size, record.max_turns, rng)
            logp, _, values = table.evaluate(ep.states.flatten(), ep.actions.flatten())
            values, logp = values.view_as(ep.rewards), logp.view_as(ep.rewards)
            next_values = table.values[ep.next_states] * ~ep.terminated
        adv, ret = gae(
            ep.rewards,
            values,
            next_values,
            ep.terminated,
            ep.truncated,
            gamma=ppo.gamma,
            lam=ppo.gae_lambda,
            mask=ep.mask,
        )
        real = ep.mask.T.flatten()
        episodes = real_steps(torch.arange(rl.batch_size).expand(ep.mask.shape[0], -1), real)  # each step's episode
        batch = RolloutBatch(*(real_steps(x, real) for x in (ep.states, ep.actions, logp, values, adv, ret)))
        ppo_update(
            table,
            optimizer,
            batch,
            ppo,
            progress=step / rl.steps,
            generator=gen,
            lr_scales=[1.0, scale],
            episodes=episodes,
        )
        sampled.append(ep.success)
    target = record.optimal() - 0.05 if record.optimal else 1.0
    within = first_at({"success": np.array(sampled), "episodes": np.arange(1, rl.steps + 1)}, target)  # a step
    return {
        "seed": seed,
        "greedy_success": round(greedy_success(env, table.logits.detach().numpy(), record.max_turns), 4),
        "sampled_last_10": round(float(np.mean(sampled[-10:])), 4),
        "step_within_0.05": None if np.isnan(within) else int(within),
        "episodes": rl.steps * rl.batch_size,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.error = lambda message: one_line_error("agent_tabular.py", message)  # type: ignore[method-assign]
    parser.add_argument("--env", default="frozenlake-slippery", help="frozenlake or frozenlake-slippery")
    parser.add_argument("--learning_rate", type=float, default=0.03, help="Adam's on the table (default 0.03)")
    parser.add_argument("--value_lr_scale", type=float, default=None, help="the values' (default: the record's)")
    parser.add_argument("--vf_coef", type=float, default=None, help="the value loss's weight (default: the record's)")
    parser.add_argument(
        "--clip_range_vf",
        type=none_or(float),
        default=argparse.SUPPRESS,
        help="value clipping (None: none; default: the record's)",
    )
    parser.add_argument("--steps", type=int, default=None, help="RL steps (default: the record's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    if args.env not in ("frozenlake", "frozenlake-slippery"):
        raise UserError(f"--env {args.env}: a table needs a FrozenLake record (frozenlake or frozenlake-slippery)")
    if args.learning_rate <= 0 or (args.value_lr_scale is not None and args.value_lr_scale < 0):
        raise UserError("--learning_rate must be > 0 and --value_lr_scale >= 0 (0: no critic)")
    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be >= 1, not {args.steps}")
    torch.set_num_threads(1)
    given = {"vf_coef": args.vf_coef, "steps": args.steps}
    fields = {k: v for k, v in given.items() if v is not None}
    if "clip_range_vf" in vars(args):
        fields["clip_range_vf"] = args.clip_range_vf
    rows = [train(args.env, seed, args.learning_rate, args.value_lr_scale, **fields) for seed in args.seeds]
    for row in rows:
        print(json.dumps(row), flush=True)
    keys = ("greedy_success", "sampled_last_10")
    print(json.dumps({"mean": {k: round(float(np.mean([r[k] for r in rows])), 4) for k in keys}, "args": vars(args)}))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
