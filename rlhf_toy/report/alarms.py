"""Alarms: what a bad run looks like, found in its logged rows (one dict per step, CleanRL/TRL key names).

Each alarm is one record of `ALARMS`: a name (its anchor in docs/reference/alarms.md, generated from this table), a
title and a plain explanation (some worded by the kind of reward the run optimized: a reward model, an ensemble, a
program, a reward model trained on a user's own labels), a longer text (`more`, shown in the page itself), its
severity (an alarm, or a note: something to know that is not a fault), and a detector over the run's rows.
Detectors compare trailing moving averages over a window of `window(n)` steps (5% of the run, at least 5) with the
run's own start, so a noisy step does not fire one; they return the first step at which the alarm holds, with the
figures that made it fire. A metric that the run did not log (CartPole has no gold, PPO has no groups) raises
nothing. `raised` lists what fired by the step it first fired: the earliest alarm is marked as the likely cause,
since a broken run's later alarms are most often its consequences.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
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
# distinct-2 of replies that have no word pairs at all is undefined, not zero.
NOT_APPLICABLE_NAN = (
    "ppo/clip_range",
    "losses/clip_range",
    "ppo/explained_variance",
    "losses/explained_variance",
    "policy/distinct_2",
)
REWARD_KINDS = ("reward model", "ensemble", "program", "labels")  # what a policy run optimized (settings.json)


@dataclass(frozen=True)
class Finding:
    step: int
    detail: str


@dataclass(frozen=True)
class Alarm:
    """One kind of trouble: `detect(rows)` is the first step where it shows, or None. `by_kind` words the title and
    explanation for a kind of reward (`REWARD_KINDS`) where the default's words would blame the wrong thing."""

    name: str
    title: str
    explanation: str
    detect: Callable[[Rows], Finding | None]
    more: str = ""
    severity: str = "alarm"  # or "note": worth knowing, not a fault (a healthy run may raise one)
    by_kind: dict[str, tuple[str, str]] = field(default_factory=dict)

    def words(self, kind: str | None) -> tuple[str, str]:
        """(title, explanation) for a run whose reward is of `kind`."""
        return self.by_kind.get(kind or "", (self.title, self.explanation))


@dataclass(frozen=True)
class Raised:
    """An alarm that fired on a run; `cause`: the earliest alarm of the run (the likely cause of the rest)."""

    name: str
    title: str
    explanation: str
    step: int
    detail: str
    more: str = ""
    severity: str = "alarm"
    cause: bool = False


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


def below_start(
    keys: Sequence[str], fraction: float, what: str, undefined_as: float | None = None
) -> Callable[[Rows], Finding | None]:
    """Fires when the moving average falls below `fraction` of its first window's mean (a positive curve).
    `undefined_as`: the value a NaN of the curve counts as (None: such steps are left out)."""

    def detect(rows: Rows) -> Finding | None:
        if undefined_as is not None:
            # logged as null (the logger writes NaN so) or NaN (NaN != NaN): undefined at that step
            rows = [{**r, **{k: undefined_as for k in keys if k in r and (r[k] is None or r[k] != r[k])}} for r in rows]
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
    peak. The peak counts from the first step (a run that breaks at once peaks at its start); clearly: by 3 noise
    standard errors of the peak's mean and by a fifth of gold's rise from the start to its peak, so that a plateau's
    wobble does not fire it. The detail quotes the peak, where it was, and the fall."""
    gold, proxy = series(rows, "objective/gold"), series(rows, "objective/score")
    if gold is None or proxy is None or len(gold[1]) != len(proxy[1]):
        return None
    steps, g = gold
    w = window(len(rows))
    gm, pm = moving_average(g, w), moving_average(proxy[1], w)
    sigma = noise(g)
    peak = 0
    for t in range(len(gm)):
        if gm[t] > gm[peak]:
            peak = t
        if t < w - 1:  # the window fills before anything fires
            continue
        margin = max(3 * sigma / math.sqrt(min(peak + 1, w)), 0.2 * (gm[peak] - gm[0]))
        if gm[t] < gm[peak] - margin and pm[t] > pm[peak]:
            return Finding(
                int(steps[t]),
                f"gold peaked at {gm[peak]:.3f} (step {steps[peak]}) and fell by {gm[peak] - gm[t]:.3f} to "
                f"{gm[t]:.3f}, while the reward rose from {pm[peak]:.3f} to {pm[t]:.3f}",
            )
    return None


RUNAWAY_KL, RUNAWAY_KL_PER_TOKEN = 30.0, 2.0


def runaway_kl(rows: Rows) -> Finding | None:
    """The KL to the reference past `RUNAWAY_KL_PER_TOKEN` nats per reply token and `RUNAWAY_KL` per reply (moving
    averages): no longer the model it started from. A healthy run of this project's presets stays under 1.2 nats
    per token (the over-optimization preset, beta 0.003, peaks near 1)."""
    kl, length = series(rows, "objective/kl"), series(rows, "policy/response_length")
    if kl is None:
        return None
    steps, v = kl
    w = window(len(rows))
    km = moving_average(v, w)
    tokens = moving_average(length[1], w) if length is not None and len(length[1]) == len(v) else np.ones_like(km)
    per_token = km / np.maximum(tokens, 1.0)
    i = first((km > RUNAWAY_KL) & (per_token > RUNAWAY_KL_PER_TOKEN), w - 1)
    if i is None:
        return None
    return Finding(
        int(steps[i]),
        f"KL's moving average reached {km[i]:.3g} nats per reply ({per_token[i]:.2g} per token; it started at "
        f"{km[0]:.3g}) and peaked at {km.max():.3g}",
    )


def unsolved_equal_groups(rows: Rows) -> Finding | None:
    """More than half the groups equal for a reason other than being all right: all wrong by the gold checker
    (`sampling/failed_groups`), or equal with no checker to tell."""
    eq, solved = series(rows, "sampling/equal_groups"), series(rows, "sampling/solved_groups")
    if eq is None:
        return None
    steps, v = eq
    if solved is not None and len(solved[1]) == len(v):
        v = np.clip(v - solved[1], 0.0, 1.0)
    w = window(len(rows))
    ma = moving_average(v, w)
    i = first(ma > 0.5, w - 1)
    if i is None:
        return None
    failed = series(rows, "sampling/failed_groups")
    said = f"{ma[i]:.0%} of the groups had equal rewards and were not all right"
    if failed is not None and len(failed[1]) == len(v):
        said += f" ({moving_average(failed[1], w)[i]:.0%} all wrong by the gold checker)"
    return Finding(int(steps[i]), said)


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
    """A step whose clip fraction is over 0.3 or approx KL over 0.2, and 10x the run's median. (The healthy runs
    of tests/data/healthy reach at most 0.107 approx KL in one update, the `reasoning` recipe's last step.)"""
    for keys, limit, what in ((CLIP_FRACTION, 0.3, "clip fraction"), (APPROX_KL, 0.2, "approx KL")):
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


def echo_trap(rows: Rows) -> Finding | None:
    """RAGEN's echo trap (Wang et al. 2025) in an agent's run: the spread of episode returns collapsed below a fifth
    of its start, the policy's entropy below a third of its start, and the gradient norm spiked (a step over 3x the
    first window's median) in the trailing window, while the task is not solved (success under 0.9: a solved task's
    returns stop varying for a good reason)."""
    spread, entropy, norm = series(rows, "agent/return_std"), series(rows, ENTROPY), series(rows, "ppo/grad_norm")
    if spread is None or entropy is None or norm is None or not len(spread[1]) == len(entropy[1]) == len(norm[1]):
        return None
    steps, sd = spread
    w = window(len(rows))
    if len(sd) < 2 * w:
        return None
    sdm, em = moving_average(sd, w), moving_average(entropy[1], w)
    base_sd, base_e, base_norm = float(sd[:w].mean()), float(entropy[1][:w].mean()), float(np.median(norm[1][:w]))
    peak = np.array([norm[1][max(0, i - w + 1) : i + 1].max() for i in range(len(sd))])
    success = series(rows, "agent/success")
    unsolved = moving_average(success[1], w) < 0.9 if success is not None and len(success[1]) == len(sd) else True
    i = first((sdm < 0.2 * base_sd) & (em < base_e / 3) & (peak > 3 * base_norm) & unsolved, w)
    if i is None or base_sd <= 0:
        return None
    return Finding(
        int(steps[i]),
        f"the returns' spread fell to {sdm[i]:.3g} from {base_sd:.3g}, entropy to {em[i]:.3g} from {base_e:.3g}, "
        f"and a gradient norm reached {peak[i]:.3g} (the start's median {base_norm:.3g})",
    )


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


GOODHART = (
    "The policy has found what the reward model scores highly but the gold judge does not: Goodhart's law. "
    "Stop at gold's peak, raise beta, or use a remedy (an ensemble, WARM)."
)

ALARMS: tuple[Alarm, ...] = (
    Alarm(
        "non-finite",
        "NaN or inf in the logs",
        "A logged figure is not a number: something overflowed or divided by zero. The trainer refuses to step on "
        "a non-finite loss, so look at the reward's scale and the learning rate.",
        non_finite,
        more="The trainer already refuses to step on a non-finite loss or gradient, so in this project's own runs "
        "this shows up only in logs written by other code. NaN where it means 'not applicable' does not count: no "
        "clip range configured, an explained variance over returns that did not vary, distinct-2 of replies "
        "without word pairs.",
    ),
    Alarm(
        "negative-kl",
        "The KL estimate is below zero",
        "KL divergence is never negative, but its per-sample estimate log p/p_ref can be. A mean that stays below "
        "zero means the samples are not drawn from the policy the estimate assumes: a sampling temperature or "
        "top-k/top-p that the log-probs ignore, padding counted as reply, or a reference that is not the model "
        "training started from.",
        crossing("objective/kl", lambda m: m < -0.01, lambda x: f"the KL estimate's moving average is {x:.3g} nats"),
        more="Its mean over replies drawn from the policy is the KL and cannot stay below zero; a moving average "
        "below -0.01 nats fires it (trl issues 925 and 1161). This project's sampler and estimate share one "
        "temperature and mask, and --resume checks the reference's identity, so it is tested on hand-built logs.",
    ),
    Alarm(
        "runaway-kl",
        "The KL to the reference ran away",
        "The policy moved more than 2 nats per reply token (and 30 per reply) from the model it started from: it "
        "is no longer that model, and its replies are most likely degenerate whatever the reward says. The KL "
        "penalty is not holding it: raise beta (--kl_coef), lower the learning rate, or set --kl_limit.",
        runaway_kl,
        more="A healthy run of this project's presets stays under about 1 nat per token (the default PPO run near "
        "0.15, the over-optimization preset with beta 0.003 near 1). Triggered in the tests by a learning rate "
        "of 1e-2 without a KL penalty, where KL reaches hundreds of nats.",
    ),
    Alarm(
        "entropy-collapse",
        "The policy's entropy collapsed",
        "The policy now puts almost all its probability on one choice per step: it stops exploring, and its "
        "replies (or actions) become the same. Lower the learning rate, raise the KL penalty, or add an entropy "
        "bonus.",
        below_start(ENTROPY, 0.25, "entropy's moving average"),
        more="The entropy's moving average fell below a quarter of its start (trl issue 5584). Lower the learning "
        "rate, raise beta, or add an entropy bonus (--ent_coef). Triggered in the tests by a learning rate of 2e-2 "
        "without a KL penalty.",
    ),
    Alarm(
        "overoptimization",
        "The reward rises while gold falls (over-optimization)",
        GOODHART,
        overoptimization,
        more="Gold's moving average fell clearly below its peak (by three noise standard errors of the peak's mean, "
        "and by a fifth of its rise from the start) while the reward's stood above its value at gold's peak "
        "(Gao et al. 2023). Stop at the peak, raise beta, or try a remedy of the reward-hacking lab "
        "(rlhf-toy remedies).",
        by_kind={
            "ensemble": (
                "The ensemble's reward rises while gold falls (over-optimization)",
                "The policy has found what the reward models' combined objective scores highly and the gold judge "
                "does not: a flaw the members share. Stop at gold's peak, raise beta or --uncertainty_coef, or "
                "train more diverse members (--bootstrap).",
            ),
            "program": (
                "Your reward program rises while gold falls",
                "The policy found a way to score on your reward program that the gold judge does not count: a "
                "loophole in the program, or the program and the judge measure different things. Read the "
                "sampled replies, then tighten the program or add a term for what the judge wants.",
            ),
            "labels": (
                "The gold judge disagrees with your reward",
                "Your reward (a reward model trained on your own labels) rises while the gold judge's score falls. "
                "That is a difference of taste, not necessarily over-optimization: the judge is not you. Read the "
                "sampled replies; only if they got worse by your own standard, stop earlier or raise beta.",
            ),
        },
    ),
    Alarm(
        "length-exploitation",
        "Replies grow longer while gold does not",
        "Longer replies score higher with the reward model but are not better: a length bias learned from the "
        "preference data. Try --length_penalty, or check the reward model's correlation with length.",
        length_exploitation,
        more="Replies 25% longer than at the start (or half the way to the length limit, when that is nearer) "
        "while gold is no higher than at the start. Look at the evaluation's 'gain-length r' column. Triggered in "
        "the tests by a gold judge that likes nothing, with a reward model that learned to like length.",
        by_kind={
            "ensemble": (
                "Replies grow longer while gold does not",
                "Longer replies score higher with the ensemble but are not better: a length bias its members share, "
                "learned from the preference data. Try --length_penalty.",
            ),
            "program": (
                "Replies grow longer while gold does not",
                "Longer replies score higher with your reward program but not with the gold judge: the program "
                "rewards length, or something long replies have. Cap or penalize length in the program.",
            ),
            "labels": (
                "Replies grow longer while the gold judge does not like them more",
                "Your reward model learned from your labels that longer replies are better, and the gold judge "
                "does not agree. If you do want longer replies, this is fine; if not, try --length_penalty or "
                "label more pairs where the shorter reply is the better one.",
            ),
        },
    ),
    Alarm(
        "equal-groups",
        "Most groups have equal rewards and teach nothing",
        "A group whose replies all get the same reward has zero advantage: GRPO, RLOO and their kin learn nothing "
        "from it. Groups that are all wrong mean the task is too hard for the policy (or the reward too coarse); "
        "use larger groups, a finer reward, an easier curriculum, or dynamic sampling.",
        unsolved_equal_groups,
        more="Groups that are all right by a gold checker do not count here (see the next note). Equal groups give "
        "no gradient ('the loss is 0, is it broken?', trl issues 2703 and 3452). Triggered in the tests by a "
        "constant reward function.",
    ),
    Alarm(
        "solved-groups",
        "Most groups are all right: the task is learned",
        "More than half the groups had every reply right by the gold checker. Nothing is broken: those prompts no "
        "longer teach anything. Stop here, or make the task harder (more digits, larger numbers) to keep learning.",
        crossing("sampling/solved_groups", lambda m: m > 0.5, lambda x: f"{x:.0%} of the groups had every reply right"),
        more="Counted where the gold judge is a checker (every value 0 or 1), as on the arithmetic and countdown "
        "tasks: the documented reasoning run reaches it once its accuracy nears 1.",
        severity="note",
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
        more="Penalize with --missing_eos_penalty, --mask_truncated or the overlong shaping. The tests' tiny model "
        "(a 64-token context) raises it on its own.",
    ),
    Alarm(
        "update-spike",
        "An update moved the policy too far",
        "The clip fraction or the approximate KL of one update spiked: the learning rate or the number of epochs "
        "is too large for this batch, and the trust region PPO relies on no longer holds.",
        update_spike,
        more="One update's clip fraction was over 0.3, or its approximate KL over 0.2, and ten times the run's "
        "median. Lower --learning_rate, use fewer --n_epochs, or set --target_kl.",
    ),
    Alarm(
        "value-divergence",
        "The value loss is diverging",
        "The critic's error grew tenfold and it now predicts the returns worse than their mean: its advantages are "
        "noise. Lower the learning rate, clip the value loss, or normalize the rewards.",
        value_divergence,
        more="The value loss's moving average grew to ten times its lowest while the explained variance went below "
        "zero. Lower the learning rate or --value_lr_scale, keep --clip_range_vf, or whiten the rewards. Tested "
        "on hand-built logs.",
    ),
    Alarm(
        "echo-trap",
        "Echo trap: the agent repeats one move and stops learning",
        "The agent's episodes all score alike, its replies have collapsed to a template, and the gradient norm "
        "spikes, while the task is not solved: RAGEN's echo trap. Lower the learning rate, keep a critic (PPO), "
        "filter low-variance groups, or raise the KL weight.",
        echo_trap,
        more="Wang et al. 2025 (RAGEN, arXiv 2504.20073) found multi-turn RL collapse this way: reward variance "
        "falls off a cliff, gradient norms spike, replies become repetitive. Fires when the returns' spread "
        "(agent/return_std) falls below a fifth of its start, the entropy below a third, and a gradient norm "
        "exceeds 3x the start's median in the trailing window, with success under 0.9. Tested on hand-built logs.",
    ),
    Alarm(
        "invalid-actions",
        "The agent's actions are not the game's",
        "More than a fifth of the agent's turns were actions the environment could not read: the policy drifted "
        "out of the action format (an empty reply, two moves in one). Lower the learning rate, raise the penalty of "
        "an invalid action, or SFT longer on demonstrations.",
        crossing(
            "agent/invalid_rate",
            lambda m: m > 0.2,
            lambda x: f"{x:.0%} of the turns were invalid actions",
        ),
        more="Measured on FrozenLake: REINFORCE with a baseline (seed 1) drifted to 98% empty replies at its end, "
        "probability mass leaking to a reply it never sampled. The agent command stops a run whose every action is "
        "invalid for --invalid_patience steps; this alarm sees the drift before that.",
    ),
    Alarm(
        "repetition",
        "Replies grow repetitive",
        "Distinct word pairs across the batch's replies fell below half their start: the policy repeats itself, "
        "a common way to please a reward model. Raise beta or check the reward for a repetition bias.",
        below_start(("policy/distinct_2",), 0.5, "distinct-2's moving average", undefined_as=0.0),
        more="Also the '!!!!' of degenerate LoRA runs (verl issue 3159). A batch whose replies have no word pair at "
        "all (an unbroken 'SureSureSure...') has no distinct-2 (the page shows n/a); for this alarm it counts as no "
        "variety, once the run started with some.",
    ),
)


def raised(rows: Rows, reward_kind: str | None = None) -> list[Raised]:
    """Every alarm that fires on `rows`, by the step it first fired (the table's order among equals), worded for
    the run's kind of reward (`REWARD_KINDS`; None: a reward model's words); the earliest alarm (not a note) is
    marked as the likely cause."""
    out = []
    for a in ALARMS:
        f = a.detect(rows)
        if f is not None:
            title, explanation = a.words(reward_kind)
            out.append(Raised(a.name, title, explanation, f.step, f.detail, a.more, a.severity))
    out.sort(key=lambda r: r.step)  # stable: the table's order among alarms of one step
    for i, r in enumerate(out):
        if r.severity == "alarm":
            out[i] = replace(r, cause=True)
            break
    return out
