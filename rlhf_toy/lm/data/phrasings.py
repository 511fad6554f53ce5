"""Many ways to ask one checkable problem, and a split of them: a model trained on some phrasings is evaluated on
phrasings it never saw in SFT or RL (a template-level held-out split), beside the ones it trained on.

A template is a format string over the problem's numbers: `{a}` and `{b}` for arithmetic, `{target}` and
`{numbers}` for countdown. Instructions come before and after the question, and in `words_share` of the problems
the numbers are written in words ("forty-seven", by num2words). `split_templates` holds out a seeded quarter of
each operation's question forms with every framing of them, never the canonical first one (the form of the
single-phrasing task and of the chat recipes' prompts).
"""

from __future__ import annotations

import functools
import random
from typing import Any

from num2words import num2words

# A phrasing is a question (its core) with an optional instruction before it and another after it: 4 x 4 ways to
# frame each core, so that a model cannot tie a problem to a few fixed strings. The first core of each list is the
# canonical one ("What is 47 + 38?"), always trained on.
ARITHMETIC_CORES: dict[str, tuple[str, ...]] = {
    "+": (
        "What is {a} + {b}?",
        "What is {a} plus {b}?",
        "What do you get when you add {a} and {b}?",
        "Add {a} to {b}.",
        "Compute {a} + {b}.",
        "{a} + {b} = ?",
        "Calculate the sum of {a} and {b}.",
        "How much is {a} plus {b}?",
        "Find the total of {a} and {b}.",
        "I have {a} apples and get {b} more. How many apples do I have?",
        "Please add {a} and {b}.",
        "Sum {a} and {b}.",
    ),
    "-": (
        "What is {a} - {b}?",
        "What is {a} minus {b}?",
        "Subtract {b} from {a}.",
        "What do you get when you take {b} away from {a}?",
        "Compute {a} - {b}.",
        "{a} - {b} = ?",
        "How much is {a} minus {b}?",
        "Calculate the difference {a} - {b}.",
        "I have {a} apples and give away {b}. How many are left?",
        "Please subtract {b} from {a}.",
        "What's {a} take away {b}?",
    ),
    "*": (
        "What is {a} * {b}?",
        "What is {a} times {b}?",
        "Multiply {a} by {b}.",
        "What is the product of {a} and {b}?",
        "Compute {a} * {b}.",
        "{a} * {b} = ?",
        "How much is {a} multiplied by {b}?",
        "Please multiply {a} and {b}.",
    ),
}

COUNTDOWN_CORES: tuple[str, ...] = (
    "Make {target} from {numbers} with + - * /, each number once.",
    "Using {numbers} once each, reach {target} with + - * /.",
    "Combine {numbers} with + - * / (each exactly once) to get {target}.",
    "Target: {target}. Numbers: {numbers}. Use each number once with + - * /.",
    "Use {numbers}, each once, and + - * / to make {target}.",
    "Can you get {target} from {numbers}? Use + - * / and every number once.",
    "Write an expression equal to {target} that uses each of {numbers} once (+ - * / allowed).",
    "With the numbers {numbers} and the operations + - * /, make {target}. Each number once.",
)

BEFORE = ("", "Reply with just the answer. ", "Quick question: ", "Math time! ")
AFTER = ("", " Reply with the answer.", " Keep it short.", " Thanks!")

HELD_OUT_SHARE = 0.25  # of each list's cores, the canonical one excepted: all their framings are held out
WORDS_SHARE = 0.25  # of the problems, asked with their numbers in words


def framed(cores: tuple[str, ...] | list[str]) -> list[str]:
    """Every core in every framing (an instruction before, one after, either, both or neither)."""
    return [f"{b}{c}{a}" for c in cores for b in BEFORE for a in AFTER]


@functools.lru_cache(maxsize=64)
def split_templates(cores: tuple[str, ...], seed: int) -> tuple[list[str], list[str]]:
    """(training phrasings, held-out phrasings): a seeded `HELD_OUT_SHARE` of the cores (at least one; never the
    canonical first) is held out with all its framings, so a held-out phrasing asks its question in words no
    training prompt used; the rest, in every framing, trains."""
    rest = list(cores[1:])
    random.Random(f"phrasings-{seed}-{cores[0]}").shuffle(rest)
    held = rest[: max(1, round(HELD_OUT_SHARE * len(cores)))]
    return framed([c for c in cores if c not in held]), framed(held)


def in_words(n: int) -> str:
    """An integer in English words ("forty-seven"; num2words's "and" dropped: "one hundred twenty")."""
    return num2words(n).replace(" and ", " ").replace(",", "")


def render(template: str, rng: random.Random, words_share: float, **numbers: Any) -> str:
    """`template` with its numbers, in words for `words_share` of the problems (all of one problem's numbers
    alike; only where every number is below 1000, so that a prompt stays short), else in digits."""
    ints = [x for v in numbers.values() for x in (v if isinstance(v, list) else [v]) if isinstance(x, int)]
    words = rng.random() < words_share and all(abs(x) < 1000 for x in ints)

    def show(n: int) -> str:
        return in_words(n) if words else str(n)

    def shown(v: Any) -> Any:
        if isinstance(v, list):
            return ", ".join(show(x) for x in v)
        return show(v) if isinstance(v, int) else v  # an operation's sign stays as it is

    return template.format(**{k: shown(v) for k, v in numbers.items()})
