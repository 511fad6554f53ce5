"""Statistics of a set of replies' text: how varied (distinct-2) and how repetitive they are. The evaluation's
table and the trainer's per-step log (`policy/distinct_2`, the report's repetition alarm) share them."""

from __future__ import annotations

import numpy as np


def distinct_2(texts: list[str]) -> float:
    """Unique word bigrams / all word bigrams across the responses; NaN (undefined: shown as n/a) when no response
    has two words, for then the replies are neither varied nor repetitive by this measure."""
    bigrams = [tuple(w[i : i + 2]) for t in texts for w in [t.split()] for i in range(len(w) - 1)]
    return len(set(bigrams)) / len(bigrams) if bigrams else float("nan")


def repetition_rate(texts: list[str]) -> float:
    """Mean share of words in a response that repeat an earlier word of the same response."""
    rates = [1 - len(set(w)) / len(w) for t in texts for w in [t.lower().split()] if w]
    return float(np.mean(rates)) if rates else 0.0
