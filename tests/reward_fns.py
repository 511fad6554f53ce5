"""Reward functions with TRL's signature for the --reward_fn tests: good ones and each kind of bad one."""

import math


def exact(prompts, completions, answer, **kwargs):
    """1.0 where the completion is exactly the row's `answer` column (after stripping)."""
    return [float(c.strip() == str(a).strip()) for c, a in zip(completions, answer)]


def short(prompts, completions, **kwargs):
    return [-len(c) / 100 for c in completions]


def needs_label(prompts, completions, label, **kwargs):
    return [0.0 for _ in completions]


def wrong_length(prompts, completions, **kwargs):
    return [1.0]


def not_a_number(prompts, completions, **kwargs):
    return [math.nan for _ in completions]


def raises(prompts, completions, **kwargs):
    raise KeyError("boom")


def one_argument(completions):
    return [0.0 for _ in completions]


NOT_CALLABLE = 3


def constant(prompts, completions, **kwargs):
    """The same reward for every reply: every group's rewards are equal."""
    return [1.0 for _ in completions]


def is_right(prompts, completions, answer, **kwargs):
    """A checker returning booleans (as many TRL users write them): it says itself what counts as right."""
    return [c.strip() == str(a).strip() for c, a in zip(completions, answer)]
