#!/usr/bin/env python
"""Each state's move probabilities of a FrozenLake agent run's SFT model and trained model, beside the optimal
move, how much the policy depends on the state, and how far apart the states' hidden states are where the reply
starts (`rlhf_toy.lm.agents.policy_map`). A run with `--constrain_actions`: the moves' probabilities renormalized
over the four, as that run draws them.

    python scripts/agent_policy_map.py runs/slip
"""

import argparse
import sys
from pathlib import Path

from rlhf_toy.errors import UserError, run_cli
from rlhf_toy.io import read_json
from rlhf_toy.lm.agents.envs import FrozenLakeText
from rlhf_toy.lm.agents.policy_map import hidden_spread, policy_map, state_dependence
from rlhf_toy.lm.agents.registry import get_env
from rlhf_toy.lm.models.checkpoints import load_causal_lm
from rlhf_toy.lm.pipeline.run import quiet_libraries
from rlhf_toy.logging import markdown_table


def table(run: Path, name: str, env: FrozenLakeText, constrained: bool) -> str:
    model, tok = load_causal_lm(run / name, f"agent {name}")
    rows = policy_map(model, tok, env, constrained)
    moves = list(env.actions)
    body = [
        [str(r["state"]), r["optimal"], *(f"{r['probs'][m]:.2f}" for m in moves), f"{r['other']:.2f}"] for r in rows
    ]
    head = ["state", "optimal", *moves, "other"]
    spread = hidden_spread(rows)
    title = f"## {name}: state dependence {state_dependence(rows):.3f}, hidden-state spread {spread:.3f}"
    return f"{title}\n\n{markdown_table(head, body)}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="an `rlhf-toy agent --env frozenlake[-slippery]` run directory")
    args = parser.parse_args(argv)
    quiet_libraries()
    run = Path(args.run_dir)
    if not (run / "agent.json").is_file():
        raise UserError(f"{run} holds no agent run (no agent.json); pass an rlhf-toy agent --run_dir")
    settings = read_json(run / "agent.json", "run rlhf-toy agent first")["settings"]
    env = get_env(settings["env"]).make()
    if not isinstance(env, FrozenLakeText):
        raise UserError(f"{run} is a run on {settings['env']}; the policy map reads FrozenLake runs")
    for name in ("sft_model", "model"):
        if (run / name).is_dir():
            print(table(run, name, env, bool(settings.get("agent", {}).get("constrain_actions"))))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
