"""FrozenLake 4x4 (not slippery) played through a tool, for the agent benchmark against TRL's environment GRPO.

Benchmark harness, not product code; imported by both sides, so it needs only gymnasium and transformers (no
rlhf_toy, which TRL's venv does not have):

* `FrozenLakeTools` is TRL 1.16's `environment_factory` protocol: `reset(**row)` returns the first observation
  (appended to the prompt), the public method `move` is the tool, `get_reward()` scores the finished rollout.
* `FrozenLakeToolText` is rlhf-toy's `TextEnv` protocol around the same game (`--env frozenlake_tools:make`):
  the action is the model's reply text; each `<tool_call>` in it runs the tool, and the results come back as the
  next observation in the form the Qwen 2.5 chat template gives a tool message (`<tool_response>` blocks in a
  user turn), so that both sides read the same tokens; a reply without a tool call ends the episode, as TRL's
  tool loop ends a rollout. A failed call's result is `{'error': ...}`, as TRL writes it.

The reward, on both sides: 1 on reaching G, -0.1 for each move that fails (an unknown direction, a move after the
game is over; a call of an unknown tool never reaches the game, so it costs nothing, as in TRL). The demonstrator
(`random_action`) is a noisy walker: the shortest-path move half of the time, a random one otherwise, and "Done."
once the game is over."""

from __future__ import annotations

import json
import re
from collections import deque

import gymnasium
import numpy as np
from transformers.utils import get_json_schema

DIRECTIONS = ("left", "down", "right", "up")  # gymnasium's actions 0-3
FAILED_CALL = -0.1
INSTRUCTIONS = (
    "Walk from S to G on the frozen lake; H is a hole. Call move once a turn; when the game is over, say Done."
)
TOOL_CALL = re.compile(r"<tool_call>\s*(.+?)\s*</tool_call>", re.DOTALL)  # as TRL's Qwen response parser finds them


def shortest_moves(P: dict, n_states: int, goal: int) -> dict[int, int]:
    """For each state from which G can be reached, the action of a shortest path (breadth-first from G over the
    reverse of gymnasium's deterministic transition table `P[s][a] = [(1.0, s', r, done)]`)."""
    into: dict[int, list[tuple[int, int]]] = {s: [] for s in range(n_states)}
    for s in range(n_states):
        for a, [(_, s2, _, done)] in P[s].items():
            if s2 != s and (not done or s2 == goal):
                into[s2].append((s, a))
    best, queue = {}, deque([goal])
    seen = {goal}
    while queue:
        s2 = queue.popleft()
        for s, a in into[s2]:
            if s not in seen:
                seen.add(s)
                best[s] = a
                queue.append(s)
    return best


class FrozenLakeTools:
    """The game, as TRL's `environment_factory` wants it: one instance per rollout."""

    def __init__(self) -> None:
        self.env = gymnasium.make("FrozenLake-v1", map_name="4x4", is_slippery=False)
        self.desc = [[c.decode() for c in row] for row in self.env.unwrapped.desc]
        self.state, self.reward, self.done, self.success = 0, 0.0, False, False

    def reset(self, seed: int | None = None, **row) -> str:
        self.state, _ = self.env.reset(seed=seed)
        self.reward, self.done, self.success = 0.0, False, False
        return self._board()

    def _board(self) -> str:
        rows = [list(r) for r in self.desc]
        r, c = divmod(self.state, len(rows))
        rows[r][c] = "P"
        return "\n".join("".join(row) for row in rows) + f"\nrow {r} col {c}"

    def move(self, direction: str) -> str:
        """Move one square on the frozen lake.

        Args:
            direction: Where to move: left, down, right or up.
        """
        if self.done:
            self.reward += FAILED_CALL
            raise ValueError("the game is over; answer without a tool call")
        if direction not in DIRECTIONS:
            self.reward += FAILED_CALL
            raise ValueError(f"unknown direction {direction!r}; use left, down, right or up")
        self.state, reward, terminated, _, _ = self.env.step(DIRECTIONS.index(direction))
        self.reward += float(reward)
        self.done, self.success = bool(terminated), reward > 0
        end = " You reached the goal." if self.success else " You fell in a hole." if self.done else ""
        return self._board() + end

    def get_reward(self) -> float:
        return self.reward


def tool_call_text(direction: str) -> str:
    """A call of `move` as the Qwen 2.5 chat template renders an assistant's tool call."""
    return f"<tool_call>\n{json.dumps({'name': 'move', 'arguments': {'direction': direction}})}\n</tool_call>"


def tool_response(results: list[str]) -> str:
    """Tool results as the Qwen 2.5 template renders consecutive tool messages inside their user turn."""
    return "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)


def parse_calls(text: str) -> list[tuple[str, dict]]:
    """The (name, arguments) of each tool call in a reply; none when any is malformed (TRL's parser then reads the
    whole reply as plain text, which ends the rollout)."""
    calls = []
    for raw in TOOL_CALL.findall(text):
        try:
            call = json.loads(raw)
        except ValueError:
            return []
        named = isinstance(call, dict) and isinstance(call.get("name"), str)
        if not (named and isinstance(call.get("arguments"), dict)):
            return []
        calls.append((call["name"], call["arguments"]))
    return calls


class FrozenLakeToolText(gymnasium.Env):
    """rlhf-toy's side: a `TextEnv` (reset/step with text) around `FrozenLakeTools`."""

    instructions = INSTRUCTIONS
    actions = tuple(tool_call_text(d) for d in DIRECTIONS)
    invalid_penalty = FAILED_CALL

    def __init__(self) -> None:
        self.game = FrozenLakeTools()
        self.tools = [get_json_schema(self.game.move)]  # as TRL renders an environment's methods
        self.best = shortest_moves(self.game.env.unwrapped.P, 16, 15)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        return self.game.reset(seed=seed), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        calls = parse_calls(action)
        if not calls:  # an answer: the rollout ends, as TRL's tool loop ends it
            return "", 0.0, True, False, {"success": self.game.success}
        before, results, failed = self.game.reward, [], False
        for name, arguments in calls:
            try:
                if name != "move":
                    raise ValueError(f"Tool {name} not found.")
                results.append(str(self.game.move(**arguments)))
            except Exception as exc:  # what TRL hands back for a failed call
                failed = True
                results.append(str({"error": str(exc)}))
        # success on every step, not only the answer's: an episode cut by the turn limit after reaching G counts, as
        # TRL's side counts it (`self.success` when the rollout is scored)
        info = {"invalid": failed, "success": self.game.success}
        return tool_response(results), self.game.reward - before, False, False, info

    def scripted_action(self) -> str:
        return "Done." if self.game.done else tool_call_text(DIRECTIONS[self.best[self.game.state]])

    def random_action(self, rng: np.random.Generator) -> str:
        """The noisy walker: the shortest-path move half of the time, a random move otherwise; "Done." at the end."""
        if self.game.done:
            return "Done."
        if rng.random() < 0.5:
            return self.scripted_action()
        return tool_call_text(DIRECTIONS[int(rng.integers(4))])


def make() -> FrozenLakeToolText:
    return FrozenLakeToolText()
