"""Environments a user might write (`--env tests.agent_envs:NAME`): one that can be learned in a few steps, and
broken ones, each broken in one way."""

import math

from rlhf_toy.lm.agents.envs import TextEnv, read_word


class SayYes(TextEnv):
    """Three turns; "yes" earns 1 a turn, "no" nothing. A random demonstrator says yes half the time."""

    actions = ("yes", "no")
    instructions = "Say yes or no."

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        return "Turn 1.", {}

    def step(self, action):
        word = read_word(action, self.actions)
        if word is None:
            return f"Turn {self.turn + 1}. Invalid.", -0.1, False, False, {"invalid": True}
        self.turn += 1
        done = self.turn == 3
        return f"Turn {self.turn + 1}.", float(word == "yes"), done, False, {"success": done}


class Raises(SayYes):
    def step(self, action):
        if self.turn == 1:
            raise RuntimeError("the board fell over")
        return super().step(action)


class NotText(SayYes):
    def step(self, action):
        obs, *rest = super().step(action)
        return 42, *rest


class NanReward(SayYes):
    def step(self, action):
        obs, _, *rest = super().step(action)
        return obs, math.nan, *rest


class Forever(SayYes):
    """Never terminates: the turn limit ends it."""

    def step(self, action):
        obs, reward, _, _, info = super().step(action)
        return obs, reward, False, False, info


class LongObservation(SayYes):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "word " * 5000, {}


class NeverValid(SayYes):
    """No reply is ever a valid action; an episode ends after three of them."""

    def step(self, action):
        self.turn += 1
        return "Turn 1. Invalid.", -0.1, self.turn == 3, False, {"invalid": True}


not_callable = 3


class ThreeTurns(SayYes):
    """Ends after three turns, whatever was said."""

    def step(self, action):
        obs, reward, _, truncated, info = super().step(action)
        self.taken = getattr(self, "taken", 0) + 1
        return obs, reward, self.taken == 3, truncated, info

    def reset(self, *, seed=None, options=None):
        self.taken = 0
        return super().reset(seed=seed)


def say(word: str) -> str:
    """Say a word.

    Args:
        word: yes or no.
    """
    return word


class WithTools(SayYes):
    """SayYes that declares a tool (a chat template that shows tools renders it)."""

    def __init__(self):
        from transformers.utils import get_json_schema

        self.tools = [get_json_schema(say)]
