"""Text environments through gymnasium's interface: an observation is text, an action is text.

`TextEnv` is a `gymnasium.Env` whose spaces are `gymnasium.spaces.Text`: `reset(seed) -> (observation, info)`,
`step(action) -> (observation, reward, terminated, truncated, info)`. An action the environment cannot read is its
own business, never a crash: it answers with a message, a documented penalty (its `invalid_penalty`:
`INVALID_PENALTY` unless the game says otherwise) and `info["invalid"] = True`, and the state stays as it was.
`info["success"]` at an episode's end says whether the task was done (the report's success rate).

The built-in games are thin wrappers over gymnasium where gymnasium has the game (FrozenLake, CartPole), so their
dynamics are gymnasium's own (tests step both side by side); guess-the-number and the calculator tool are small
games of their own. Each built-in also knows a scripted policy (the demonstrator of the SFT stage, and a reference
line) and a random one (`scripted_action`, `random_action`).
"""

from __future__ import annotations

import functools
import re
import string
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

INVALID_PENALTY = -0.1  # the reward of an action the game cannot read (the state does not change)
TEXT = spaces.Text(max_length=4096, charset=string.printable)


class TextEnv(gymnasium.Env):
    """A gymnasium environment of text. Subclasses set `instructions` (shown once, before the first observation),
    `actions` (the valid action words, if the game has a fixed set: the random policy draws from them), optionally
    `tools` (JSON schemas a chat template shows the agent), and implement `reset` and `step` with strings."""

    observation_space = TEXT
    action_space = TEXT
    instructions: str = ""
    actions: tuple[str, ...] = ()
    invalid_penalty: float = INVALID_PENALTY  # the reward of an action it cannot read
    # Tools the agent may call, as JSON schemas (transformers' `get_json_schema` of a function): a chat template
    # that shows tools (Qwen's, Llama 3.1's, ...) renders them in the context; the calls arrive as the action text.
    tools: list[dict] | None = None

    def scripted_action(self) -> str:
        """A good action in the current state (the SFT stage's demonstrator); games without one raise."""
        raise NotImplementedError(f"{type(self).__name__} has no scripted policy")

    def walker_action(self, rng: np.random.Generator) -> str:
        """A weak demonstrator that reads the state without knowing the answer; games without one raise."""
        raise NotImplementedError(f"{type(self).__name__} has no walker")

    def random_action(self, rng: np.random.Generator) -> str:
        """A uniformly random valid action (from `actions`)."""
        if not self.actions:
            raise NotImplementedError(f"{type(self).__name__} names no actions to draw from")
        return self.actions[int(rng.integers(len(self.actions)))]


def read_word(text: str, words: tuple[str, ...]) -> str | None:
    """The one action word of `words` that `text` names: the whole reply (any case, punctuation around it), or
    the only word of `words` it contains; None when it names none or several (a reply that hedges is invalid)."""
    clean = text.strip().strip(string.punctuation + " ").lower()
    if clean in words:
        return clean
    found = {w for w in re.findall(r"[a-z]+", clean) if w in words}
    return found.pop() if len(found) == 1 else None


class FrozenLakeText(TextEnv):
    """gymnasium's FrozenLake-v1 (4x4) as text: the grid with the agent at P, its row and column, and what lies
    next to it each way; actions left/down/right/up (gymnasium's 0-3). Reward 1 on reaching G (gymnasium's), 0
    otherwise; an unreadable action costs 1 and leaves the agent where it is. Slippery: the move goes sideways 2
    times in 3."""

    actions = ("left", "down", "right", "up")
    instructions = "Walk to G; H is a hole. Moves: left, down, right, up."
    # As much as the goal is worth. Measured: at 0.1, an unreadable reply was a cheap "wait", and trajectory-level
    # credit (RLOO) gave it the success of the episodes it was in: seed 1 went from 0.6% to 100% invalid in 2 steps.
    invalid_penalty = -1.0

    def __init__(self, slippery: bool = False) -> None:
        self.env = gymnasium.make("FrozenLake-v1", map_name="4x4", is_slippery=slippery)
        self.desc = [[c.decode() for c in row] for row in self.env.unwrapped.desc]
        self.size = len(self.desc)
        self.state = 0
        self.slippery = slippery
        self.policy = list(lake_policy(slippery))  # the scripted policy
        self.shortest = list(lake_policy(False))  # the walker's way: the lake's, if it did not slip

    def render_text(self) -> str:
        """The grid with the agent at P, then a line that says where P is: a tiny model reads a position from the
        words just before its reply far more easily than from the shape of a grid (measured: without the line,
        PPO's policy stayed the same in every state for 40 steps)."""
        rows = [list(r) for r in self.desc]
        r, c = divmod(self.state, self.size)
        rows[r][c] = "P"
        near = [self.cell(r + dr, c + dc) for dr, dc in ((0, -1), (1, 0), (0, 1), (-1, 0))]
        around = " ".join(f"{a} {x}" for a, x in zip(self.actions, near))
        return "\n".join("".join(row) for row in rows) + f"\nrow {r} col {c}\n{around}"

    def cell(self, r: int, c: int) -> str:
        """What is at row r, column c: a letter of the map, or "wall" off it."""
        return self.desc[r][c] if 0 <= r < self.size and 0 <= c < self.size else "wall"

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict[str, Any]]:
        self.state, _ = self.env.reset(seed=seed)
        return self.render_text(), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        word = read_word(action, self.actions)
        if word is None:
            return f"{self.render_text()}\nInvalid move.", self.invalid_penalty, False, False, {"invalid": True}
        self.state, reward, terminated, truncated, _ = self.env.step(self.actions.index(word))
        return self.render_text(), float(reward), terminated, truncated, {"success": reward > 0}

    def scripted_action(self) -> str:
        """The optimal action of value iteration over gymnasium's own transition table (`optimal_policy`)."""
        return self.actions[self.policy[self.state]]

    def walker_action(self, rng: np.random.Generator) -> str:
        """The shortest way to G on this map as if it did not slip, a random move half the time: it reads the state
        and it is not the slippery lake's answer (that pushes into the walls; this walker succeeds about 3% there)."""
        return self.random_action(rng) if rng.random() < 0.5 else self.actions[self.shortest[self.state]]


def action_values(P: dict, s: int, later: np.ndarray, gamma: float) -> list[float]:
    """Each action's expected return from state `s` under gymnasium's transition table `P[s][a] = [(prob, s', r,
    done), ...]`, when `later [n_states]` is the value of what follows (0 after a terminal transition)."""
    return [sum(p * (r + (0.0 if done else gamma * later[s2])) for p, s2, r, done in P[s][a]) for a in range(len(P[s]))]


def frozenlake_values(P: dict, n_states: int, horizon: int, gamma: float = 1.0) -> np.ndarray:
    """Finite-horizon value iteration over gymnasium's transition table: `[horizon + 1, n_states]`, row h = the
    best expected return with h steps left. With FrozenLake's 0/1 reward and gamma 1 that is the best success
    probability within h steps."""
    values = np.zeros((horizon + 1, n_states))
    for h in range(1, horizon + 1):
        for s in range(n_states):
            values[h, s] = max(action_values(P, s, values[h - 1], gamma))
    return values


def optimal_policy(P: dict, n_states: int, horizon: int = 100, gamma: float = 0.999) -> list[int]:
    """The greedy action of each state with `horizon` steps left. A discount just under 1 breaks the ties of the
    undiscounted values (with 99 steps left most moves still reach G surely) toward the shorter way."""
    later = frozenlake_values(P, n_states, horizon, gamma)[horizon - 1]
    return [int(np.argmax(action_values(P, s, later, gamma))) for s in range(n_states)]


@functools.cache
def lake_policy(slippery: bool) -> tuple[int, ...]:
    """`optimal_policy` of the 4x4 lake, slippery or not, once per process: every `FrozenLakeText` shares it (a step
    builds one per episode slot, 64, and value iteration is about 5 ms)."""
    env = gymnasium.make("FrozenLake-v1", map_name="4x4", is_slippery=slippery).unwrapped
    return tuple(optimal_policy(env.P, len(env.P)))


def optimal_success(slippery: bool, horizon: int = 100) -> float:
    """The optimal policy's success probability from the start within `horizon` steps (gymnasium's limit)."""
    env = gymnasium.make("FrozenLake-v1", map_name="4x4", is_slippery=slippery).unwrapped
    return float(frozenlake_values(env.P, 16, horizon)[horizon, 0])


class CartPoleText(TextEnv):
    """gymnasium's CartPole-v1 as text: the four numbers rounded to 2 decimals (x position, v velocity, a pole
    angle, w angular velocity), actions left/right. Reward 1 per step (gymnasium's), 500 steps at most. An
    unreadable action is no step at all: `invalid_penalty`, the same numbers back."""

    actions = ("left", "right")
    instructions = "Keep the pole up. Push: left or right."
    # A cost, not 0. Measured (seed 0, 2026-12-06): at 0 an unreadable reply was a free pause, worth more than a
    # push that lets the pole fall, since an episode cut at the turn limit is bootstrapped from the value head;
    # PPO's policy went to 97% unreadable replies in 8 steps. At -1 a pause is worse than any push.
    invalid_penalty = -1.0

    def __init__(self) -> None:
        self.env = gymnasium.make("CartPole-v1")
        self.obs = np.zeros(4)
        self.steps = 0

    def render_text(self) -> str:
        return " ".join(f"{k} {v:.2f}" for k, v in zip("xvaw", self.obs))

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict[str, Any]]:
        self.obs, _ = self.env.reset(seed=seed)
        self.steps = 0
        return self.render_text(), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        word = read_word(action, self.actions)
        if word is None:
            return f"{self.render_text()} invalid", self.invalid_penalty, False, False, {"invalid": True}
        self.obs, reward, terminated, truncated, _ = self.env.step(self.actions.index(word))
        self.steps += 1
        return self.render_text(), float(reward), terminated, truncated, {"success": truncated and not terminated}

    def scripted_action(self) -> str:
        """Push toward where the pole falls (angle plus half its angular velocity): 500 steps from every start of
        the evaluation's seeds (the angle alone: about 40)."""
        _, _, angle, omega = self.obs
        return "right" if angle + 0.5 * omega > 0 else "left"


class GuessNumber(TextEnv):
    """Guess a number from 1 to 100. Each wrong guess is answered "higher" or "lower" and costs 0.1; the right
    one earns 1 and ends the episode. The observation is the last guess with its answer, then the numbers still
    possible ("37 higher" / "38 to 100"): the game's state, since every earlier answer is in that range. Not a
    number from 1 to 100: `INVALID_PENALTY`, and the same observation back.

    Why the range and not the list of every guess (as until 2026-12-07): a context then grew with each turn, an
    episode's turns cost the square of its length (an RL step of 64 episodes, 37 s on one thread, 31 s of it the
    update), and a tiny model had to find the bounds in the list; the range is a few tokens, just before the reply.
    """

    instructions = "Guess my number from 1 to 100. Answer with a number."
    low_bound, high_bound, cost = 1, 100, 0.1
    actions = tuple(str(n) for n in range(low_bound, high_bound + 1))  # what `--constrain_actions` allows

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.target = int(self.np_random.integers(self.low_bound, self.high_bound + 1))
        self.low, self.high, self.last = self.low_bound, self.high_bound, ""
        return self.render_text(), {}

    def render_text(self) -> str:
        """The last answer (none before the first guess), then the range still possible, nearest the reply."""
        return f"{self.last}\n{self.low} to {self.high}" if self.last else f"{self.low} to {self.high}"

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        found = re.findall(r"\d+", action)
        guess = int(found[0]) if len(found) == 1 else None
        if guess is None or not self.low_bound <= guess <= self.high_bound:
            return f"{self.render_text()} invalid", self.invalid_penalty, False, False, {"invalid": True}
        if guess == self.target:
            return f"{guess} yes", 1.0, True, False, {"success": True}
        hint = "higher" if guess < self.target else "lower"
        if hint == "higher":
            self.low = max(self.low, guess + 1)
        else:
            self.high = min(self.high, guess - 1)
        self.last = f"{guess} {hint}"
        return self.render_text(), -self.cost, False, False, {}

    def scripted_action(self) -> str:
        """Binary search: the middle of the numbers still possible."""
        return str((self.low + self.high) // 2)

    def random_action(self, rng: np.random.Generator) -> str:
        """A random number among those still possible (the hints kept, no search)."""
        return str(int(rng.integers(self.low, self.high + 1)))


CALC = re.compile(r"calc\s*(-?\d+)\s*([-+*])\s*(-?\d+)")
ANSWER = re.compile(r"answer\s*(-?\d+)")


class CalculatorTool(TextEnv):
    """A 3-digit multiplication the tiny model cannot do in its head, with a calculator it may call: `calc A*B`
    (also + and -) answers with the result as the next observation; `answer N` ends the episode, reward 1 if N is
    the product, else 0 (read as a number: `answer 099162` is 99162). Anything else: `INVALID_PENALTY` and the
    question again. `tool=False`: the calculator answers "off" (what the model does without it).

    `width`: the display shows the result zero-padded to that many digits, as a fixed-width display does (0: as
    many digits as it has). Why six by default, measured (seed 0, 300 held-out problems): with the variable-width
    display the tiny GPT-2 copied every 6-digit result and none of the 5-digit ones (0 of 55, the 18% of
    products under 100,000): its learned absolute positions copy from fixed places, and a shorter result moves
    the answer one token earlier."""

    instructions = "Use calc A*B, then answer N."

    def __init__(self, tool: bool = True, width: int = 6) -> None:
        if not isinstance(width, int) or width < 0:
            raise ValueError(f"width must be a whole number of digits >= 0 (0: unpadded), not {width!r}")
        self.tool, self.width = tool, width

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.a, self.b = (int(x) for x in self.np_random.integers(100, 1000, size=2))
        self.result: int | None = None
        return self.question(), {}

    def question(self) -> str:
        return f"{self.a}*{self.b}=?"

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        text = action.strip().lower()
        answer = ANSWER.fullmatch(text)
        if answer:
            right = int(answer.group(1)) == self.a * self.b
            return ("right" if right else "wrong"), float(right), True, False, {"success": right}
        call = CALC.fullmatch(text)
        if call:
            if not self.tool:
                return f"{self.question()} calc off", 0.0, False, False, {}
            x, op, y = int(call.group(1)), call.group(2), int(call.group(3))
            self.result = x * y if op == "*" else x + y if op == "+" else x - y
            return f"{self.question()} calc {self.display(self.result)}", 0.0, False, False, {"tool": True}
        return f"{self.question()} invalid", self.invalid_penalty, False, False, {"invalid": True}

    def display(self, value: int) -> str:
        """`value` as the calculator shows it: zero-padded to `width` digits (after a minus sign)."""
        return f"{value:0{self.width + (value < 0)}d}" if self.width else str(value)

    def scripted_action(self) -> str:
        """Call the calculator, then answer with what it showed."""
        return f"answer {self.display(self.result)}" if self.result is not None else f"calc {self.a}*{self.b}"

    def direct_action(self) -> str:
        """The right answer at once, without the calculator (an oracle's demonstration)."""
        return f"answer {self.display(self.a * self.b)}"

    def random_action(self, rng: np.random.Generator) -> str:
        """A guess of the right size, without the calculator (what answering in one's head looks like)."""
        return f"answer {int(rng.integers(10_000, 1_000_000))}"
