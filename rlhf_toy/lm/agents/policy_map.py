"""What a FrozenLake agent would do in each state: the probability of each move as its reply's first token, beside
the optimal move, and whether the hidden state it replies from tells the states apart. A diagnosis: a policy that
ignores the state has the same row everywhere (`state_dependence` 0), which is what SFT on a random walk teaches
(its actions do not depend on the state either); `hidden_spread` near 0 says the network stopped reading the state
altogether, so the value head, which reads the same hidden state, cannot tell the states apart either.

    python scripts/agent_policy_map.py runs/slip        # the SFT model and the trained one, as tables
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ..models.base import context_length
from .envs import FrozenLakeText
from .rollout import env_tools, render_context


def state_contexts(model, tok, env: FrozenLakeText) -> Iterator[tuple[int, torch.Tensor]]:
    """`(state, context ids [1, T])` for each non-terminal state: what the agent reads on a first turn there (`env`
    is put in each state to render it, and back where it was after)."""
    device = next(model.parameters()).device
    was = env.state
    try:
        for s in range(env.size**2):
            r, c = divmod(s, env.size)
            if env.desc[r][c] in "HG":
                continue
            env.state = s
            ids = render_context(tok, env.instructions, [], env.render_text(), 0, env_tools(env))
            yield s, torch.tensor([ids[-context_length(model.config) :]], device=device)
    finally:
        env.state = was


@torch.no_grad()
def policy_map(model, tok, env: FrozenLakeText, constrained: bool = False) -> list[dict[str, Any]]:
    """One row per non-terminal state, from one forward pass there: `state`, `optimal` (value iteration's move),
    `probs` (move -> probability of the move's first token after the state's first-turn context), `other` (the
    rest: unreadable starts) and `hidden` (the last layer's hidden state `[d]` where the reply starts).
    `constrained` (a `--constrain_actions` run): the probabilities renormalized over the moves' first tokens, as
    that run's policy draws them (`other` 0, to float rounding)."""
    model.eval()
    first = {a: tok.encode(a, add_special_tokens=False)[0] for a in env.actions}
    rows = []
    for s, ids in state_contexts(model, tok, env):
        out = model(ids, output_hidden_states=True)
        p = torch.softmax(out.logits[0, -1].float(), -1)
        if constrained:
            p = p / p[list(first.values())].sum()
        probs = {a: float(p[i]) for a, i in first.items()}
        optimal = env.actions[env.policy[s]]
        hidden = out.hidden_states[-1][0, -1].double().cpu()
        rows.append(
            {
                "state": s,
                "optimal": optimal,
                "probs": probs,
                "other": max(0.0, 1 - sum(probs.values())),
                "hidden": hidden,
            }
        )
    return rows


def state_dependence(rows: list[dict[str, Any]]) -> float:
    """The mean total-variation distance between each state's move distribution and their average over states:
    0 when the policy does the same everywhere, up to 1 when each state has its own move."""
    table = torch.tensor([[*row["probs"].values(), row["other"]] for row in rows], dtype=torch.float64)
    return float(0.5 * (table - table.mean(0)).abs().sum(1).mean())


def hidden_spread(rows: list[dict[str, Any]]) -> float:
    """How far apart the states' hidden states at the reply are (`policy_map`'s `hidden`): the mean distance of each
    from their average, over their mean norm (0: the network replies from the same point whatever the state)."""
    h = torch.stack([row["hidden"] for row in rows])
    return float((h - h.mean(0)).norm(dim=1).mean() / h.norm(dim=1).mean())
