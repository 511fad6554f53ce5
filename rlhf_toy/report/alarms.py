"""Alarms: what a bad run looks like, found in its logged rows (one dict per step, CleanRL/TRL key names).

Each alarm is one record of `ALARMS`: a name (the anchor of its section in docs/explanations/reading-a-run.md), a
title, a plain explanation, and a detector over the run's rows. Detectors compare trailing moving averages over a
window of `window(n)` steps (5% of the run, at least 5) with the run's own start, so a noisy step does not fire
one; they return the first step at which the alarm holds, with the figures that made it fire. A metric that the
run did not log (CartPole has no gold, PPO has no groups) raises nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlhf_toy.logging import moving_average

Rows = Sequence[dict[str, Any]]

ENTROPY = ("policy/entropy", "losses/entropy")
CLIP_FRACTION = ("ppo/clip_fraction", "losses/clip_fraction")
APPROX_KL = ("ppo/approx_kl", "losses/approx_kl")
VALUE_LOSS = ("ppo/value_loss", "losses/value_loss")
# NaN there means "not applicable", not a broken run: no clipping configured; returns that do not vary (every
# reply of the batch scored the same: the equal-groups alarm's business).
NOT_APPLICABLE_NAN = ("ppo/clip_range", "losses/clip_range", "ppo/explained_variance", "losses/explained_variance")


@dataclass(frozen=True)
class Finding:
    step: int
    detail: str


@dataclass(frozen=True)
class Alarm:
    """One kind of trouble: `detect(rows)` is the first step where it shows, or None."""

    name: str
    title: str
    explanation: str
    detect: Callable[[Rows], Finding | None]


@dataclass(frozen=True)
class Raised:
    """An alarm that fired on a run."""

    name: str
    title: str
    explanation: str
    step: int
    detail: str


def window(n: int) -> int:
    """The moving-average window for a run of `n` logged steps: 5% of it, at least 5."""
    return max(5, n // 20)


def series(rows: Rows, keys: str | Sequence[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """`(steps [n], values [n])` of the first of `keys` the rows log (rows without it, or with a non-finite value,
    are left out), or None."""
    for key in (keys,) if isinstance(keys, str) else keys:
        pts = [(r["step"], float(r[key])) for r in rows if isinstance(r.get(key), (int, float))]
        pts = [(s, v) for s, v in pts if math.isfinite(v)]
        if pts:
            steps, values = zip(*pts)
            return np.asarray(steps), np.asarray(values)
    return None


def noise(values: np.ndarray) -> float:
    """The per-step noise of a curve, robustly: the median absolute step-to-step change / 0.954 (for Gaussian
    noise of standard deviation s, the median |x_t - x_(t-1)| is 0.954 s)."""
    return float(np.median(np.abs(np.diff(values)))) / 0.954 if len(values) > 1 else 0.0


def first(mask: np.ndarray, start: int) -> int | None:
    """The index of the first True of `mask` from index `start` on, or None."""
    hits = np.flatnonzero(mask[start:])
    return start + int(hits[0]) if len(hits) else None


def below_start(keys: Sequence[str], fraction: float, what: str) -> Callable[[Rows], Finding | None]:
    """Fires when the moving average falls below `fraction` of its first window's mean (a positive curve)."""

    def detect(rows: Rows) -> Finding | None:
        s = series(rows, keys)
        if s is None or len(s[1]) < 2 * window(len(rows)):
            return None
        steps, v = s
        w = window(len(rows))
        base, ma = float(v[:w].mean()), moving_average(v, w)
        if base <= 0:
            return None
        i = first(ma < fraction * base, w)
        if i is None:
            return None
        return Finding(
            int(steps[i]), f"{what} fell to {ma[i]:.3g} from {base:.3g} at the start (below {fraction:.0%} of it)"
        )

    return detect


def crossing(
    keys: str | Sequence[str],
    fires: Callable[[np.ndarray], np.ndarray],
    says: Callable[[float], str],
    of: Callable[[np.ndarray], np.ndarray] = lambda v: v,
) -> Callable[[Rows], Finding | None]:
    """Fires at the first step (once a window is full) where `fires` holds for the moving average of `of(values)`;
    `says` words the average there."""

    def detect(rows: Rows) -> Finding | None:
        s = series(rows, keys)
        if s is None:
            return None
        steps, v = s
        w = window(len(rows))
        ma = moving_average(of(v), w)
        i = first(fires(ma), w - 1)
        return None if i is None else Finding(int(steps[i]), says(float(ma[i])))

    return detect


def overoptimization(rows: Rows) -> Finding | None:
    """Gold's moving average has fallen clearly below its peak while the proxy's is above where it stood at gold's
    peak. Clearly: by 3 noise standard errors of a window's mean and by a fifth of gold's rise from the start to its
    peak, so that a plateau's wobble does not fire it."""
    gold, proxy = series(rows, "objective/gold"), series(rows, "objective/score")
    if gold is None or proxy is None or len(gold[1]) != len(proxy[1]):
        return None
    steps, g = gold
    w = window(len(rows))
    gm, pm = moving_average(g, w), moving_average(proxy[1], w)
    se = 3 * noise(g) / math.sqrt(w)
    peak = w - 1
    for t in range(w - 1, len(gm)):
        if gm[t] > gm[peak]:
            peak = t
        margin = max(se, 0.2 * (gm[peak] - gm[w - 1]))
        if gm[t] < gm[peak] - margin and pm[t] > pm[peak]:
            return Finding(
                int(steps[t]),
                f"gold's moving average fell from {gm[peak]:.3f} (step {steps[peak]}) to {gm[t]:.3f} while the "
                f"reward model's rose from {pm[peak]:.3f} to {pm[t]:.3f}",
            )
    return None


def length_exploitation(rows: Rows) -> Finding | None:
    """Replies 25% longer than at the start while gold's moving average is no higher than at the start (within
    2 noise standard errors). Where the length limit (`policy/length_limit`) leaves less room than 25%, half the
    way from the start to the limit counts: replies that start at 26 tokens under a 32-token cap can never grow
    by 25%, and growing into the cap is the symptom."""
    length, gold = series(rows, "policy/response_length"), series(rows, "objective/gold")
    if length is None or gold is None or len(length[1]) != len(gold[1]):
        return None
    steps, n = length
    w = window(len(rows))
    if len(n) < 2 * w:
        return None
    g = gold[1]
    nm, gm = moving_average(n, w), moving_average(g, w)
    base_n, base_g = float(n[:w].mean()), float(g[:w].mean())
    margin = 2 * noise(g) / math.sqrt(w)
    grown = 1.25 * base_n
    limit = series(rows, "policy/length_limit")
    if limit is not None and len(limit[1]) == len(n):
        grown = min(grown, base_n + 0.5 * (float(limit[1].min()) - base_n))
    i = first((nm > grown) & (gm <= base_g + margin), w)
    if i is None:
        return None
    return Finding(
        int(steps[i]), f"replies grew from {base_n:.1f} to {nm[i]:.1f} tokens; gold {base_g:.3f} -> {gm[i]:.3f}"
    )


def update_spike(rows: Rows) -> Finding | None:
    """A step whose clip fraction is over 0.3 or approx KL over 0.1, and 10x the run's median."""
    for keys, limit, what in ((CLIP_FRACTION, 0.3, "clip fraction"), (APPROX_KL, 0.1, "approx KL")):
        s = series(rows, keys)
        if s is None:
            continue
        steps, v = s
        i = first(v > max(limit, 10 * float(np.median(v))), 0)
        if i is not None:
            return Finding(int(steps[i]), f"{what} {v[i]:.3g} in one update (median {np.median(v):.3g})")
    return None


def value_divergence(rows: Rows) -> Finding | None:
    """The value loss's moving average 10x its lowest so far, and the explained variance's below zero (the critic
    predicts the returns worse than their mean does)."""
    loss, ev = series(rows, VALUE_LOSS), series(rows, ("ppo/explained_variance", "losses/explained_variance"))
    if loss is None or ev is None or len(loss[1]) != len(ev[1]):
        return None
    steps, v = loss
    w = window(len(rows))
    lm, em = moving_average(v, w), moving_average(ev[1], w)
    low = np.minimum.accumulate(lm)
    i = first((lm > 10 * low) & (em < 0), 2 * w)
    if i is None:
        return None
    return Finding(int(steps[i]), f"value loss {lm[i]:.3g} (lowest {low[i]:.3g}), explained variance {em[i]:.2f}")


def non_finite(rows: Rows) -> Finding | None:
    for r in rows:
        bad = [
            k
            for k, v in r.items()
            if isinstance(v, float) and not math.isfinite(v) and k not in NOT_APPLICABLE_NAN and not _no_update(r, k)
        ]
        if bad:
            return Finding(int(r["step"]), f"{', '.join(sorted(bad))} = {', '.join(str(r[k]) for k in sorted(bad))}")
    return None


def _no_update(row: dict[str, Any], key: str) -> bool:
    """An update diagnostic of a step that made no gradient step (early stop on its first minibatch): NaN there
    means "none measured"."""
    ns = key.split("/")[0]
    return ns in ("ppo", "losses") and row.get(f"{ns}/gradient_steps") == 0


ALARMS: tuple[Alarm, ...] = (
    Alarm(
        "non-finite",
        "NaN or inf in the logs",
        "A logged figure is not a number: something overflowed or divided by zero. The trainer refuses to step on "
        "a non-finite loss, so look at the reward's scale and the learning rate.",
        non_finite,
    ),
    Alarm(
        "negative-kl",
        "The KL estimate is below zero",
        "KL divergence is never negative, but its per-sample estimate log p/p_ref can be. A mean that stays below "
        "zero means the samples are not drawn from the policy the estimate assumes: a sampling temperature or "
        "top-k/top-p that the log-probs ignore, padding counted as reply, or a reference that is not the model "
        "training started from.",
        crossing("objective/kl", lambda m: m < -0.01, lambda x: f"the KL estimate's moving average is {x:.3g} nats"),
    ),
    Alarm(
        "entropy-collapse",
        "The policy's entropy collapsed",
        "The policy now puts almost all its probability on one choice per step: it stops exploring, and its "
        "replies (or actions) become the same. Lower the learning rate, raise the KL penalty, or add an entropy "
        "bonus.",
        below_start(ENTROPY, 0.25, "entropy's moving average"),
    ),
    Alarm(
        "overoptimization",
        "The reward model rises while gold falls (over-optimization)",
        "The policy has found what the reward model scores highly but the gold judge does not: Goodhart's law. "
        "Stop at gold's peak, raise beta, or use a remedy (an ensemble, WARM).",
        overoptimization,
    ),
    Alarm(
        "length-exploitation",
        "Replies grow longer while gold does not",
        "Longer replies score higher with the reward model but are not better: a length bias learned from the "
        "preference data. Try --length_penalty, or check the reward model's correlation with length.",
        length_exploitation,
    ),
    Alarm(
        "equal-groups",
        "Most groups have equal rewards",
        "A group whose replies all get the same reward has zero advantage: GRPO, RLOO and their kin learn nothing "
        "from it. The task is too easy or too hard for the policy; use larger groups, a finer reward, or dynamic "
        "sampling.",
        crossing("sampling/equal_groups", lambda m: m > 0.5, lambda x: f"{x:.0%} of the groups had equal rewards"),
    ),
    Alarm(
        "truncation",
        "Replies are cut off at the length limit",
        "More than a fifth of the replies reach --max_new_tokens without an end-of-sequence token: their reward "
        "judges half a reply, and the policy may learn to ramble. Raise the limit, or penalize overlong replies.",
        crossing(
            "policy/eos_rate",
            lambda m: m > 0.2,
            lambda x: f"{x:.0%} of the replies hit the length limit",
            lambda v: 1 - v,
        ),
    ),
    Alarm(
        "update-spike",
        "An update moved the policy too far",
        "The clip fraction or the approximate KL of one update spiked: the learning rate or the number of epochs "
        "is too large for this batch, and the trust region PPO relies on no longer holds.",
        update_spike,
    ),
    Alarm(
        "value-divergence",
        "The value loss is diverging",
        "The critic's error grew tenfold and it now predicts the returns worse than their mean: its advantages are "
        "noise. Lower the learning rate, clip the value loss, or normalize the rewards.",
        value_divergence,
    ),
    Alarm(
        "repetition",
        "Replies grow repetitive",
        "Distinct word pairs across the batch's replies fell below half their start: the policy repeats itself, "
        "a common way to please a reward model. Raise beta or check the reward for a repetition bias.",
        below_start(("policy/distinct_2",), 0.5, "distinct-2's moving average"),
    ),
)


def raised(rows: Rows) -> list[Raised]:
    """Every alarm that fires on `rows`, in the table's order."""
    out = []
    for a in ALARMS:
        f = a.detect(rows)
        if f is not None:
            out.append(Raised(a.name, a.title, a.explanation, f.step, f.detail))
    return out
