"""Reward functions as programs, with TRL's signature: `f(prompts, completions, **columns) -> list[float]`.

The other columns of the prompt file (`answer`, say) arrive as keyword lists, one item per completion, so a
function written for TRL's `GRPOTrainer` runs unchanged. Several functions are summed with weights. Every function
is checked before any sampling (importable, callable, takes the columns it needs, returns one finite number per
completion on a probe) and every call after that is checked again; a bad one is one `UserError` naming it.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlhf_toy.errors import UserError, first_line

from .scores import check_scores

RewardFn = Callable[..., Sequence[float]]


def function_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"


@dataclass
class RewardFunctions:
    """A weighted sum of reward functions over one table of prompts: called as `(prompts, texts) -> [B]` floats,
    the interface of every reward in the trainer. `columns` maps each prompt to its row's other columns."""

    fns: list[RewardFn]
    weights: list[float]
    columns: dict[str, dict[str, Any]]
    first_is_checker: bool = False  # the first function returned booleans on the probe: it marks right and wrong

    @property
    def column_names(self) -> list[str]:
        first = next(iter(self.columns.values()), {})
        return list(first)

    def keyword_columns(self, prompts: list[str]) -> dict[str, list[Any]]:
        missing = [p for p in prompts if p not in self.columns]
        if missing:
            raise UserError(f"no row of the prompt table has the prompt {missing[0][:60]!r}; score the table's prompts")
        return {c: [self.columns[p][c] for p in prompts] for c in self.column_names}

    def parts(self, prompts: list[str], completions: list[str]) -> list[list[float]]:
        """Each function's rewards (unweighted), checked."""
        kw = self.keyword_columns(prompts)
        return [call(fn, prompts, completions, kw) for fn in self.fns]

    def __call__(self, prompts: list[str], completions: list[str]) -> list[float]:
        parts = self.parts(prompts, completions)
        return [sum(w * p[i] for w, p in zip(self.weights, parts)) for i in range(len(completions))]


def invoke(fn: RewardFn, prompts: list[str], completions: list[str], columns: dict[str, list[Any]]) -> Any:
    """`fn` on one batch, as TRL calls it (keywords): what it returned, unchecked; a raise is one `UserError`."""
    try:
        return fn(prompts=prompts, completions=completions, **columns)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(
            f"reward function {function_name(fn)} raised {type(exc).__name__}: {exc}; fix the function"
        ) from None


def checked(fn: RewardFn, out: Any, n: int) -> list[float]:
    """`fn`'s output on `n` completions, checked: one finite number per completion (float64: the values themselves;
    a weighted sum of parts follows)."""
    return check_scores(out, n, f"reward function {function_name(fn)}", "completion", torch.float64).tolist()


def call(fn: RewardFn, prompts: list[str], completions: list[str], columns: dict[str, list[Any]]) -> list[float]:
    """`fn` on one batch, its output checked."""
    return checked(fn, invoke(fn, prompts, completions, columns), len(completions))


def import_callable(spec: str, what: str, example: str, takes: str = "") -> Callable[..., Any]:
    """`module:function` -> the function, or one `UserError` naming `what` it was meant to be (a reward function,
    a judge) and the fix."""
    if ":" not in spec:
        raise UserError(f"{what} {spec!r} must look like module:function (e.g. {example})")
    module, name = spec.split(":", 1)
    if not module or module.startswith(".") or not name:
        raise UserError(f"{what} {spec!r} must name a module and a function, module:function (e.g. {example})")
    try:
        fn = getattr(importlib.import_module(module), name)
    except Exception as exc:  # anything the module's own code raises at import: a SyntaxError, a ValueError, ...
        raise UserError(
            f"cannot import {what} {spec!r} ({type(exc).__name__}: {first_line(exc)}); check the module is on "
            "PYTHONPATH, runs when imported, and has that function"
        ) from None
    if not callable(fn):
        raise UserError(f"{what} {spec!r} is a {type(fn).__name__}, not a function{takes}")
    return fn


def import_function(spec: str) -> RewardFn:
    return import_callable(spec, "reward function", "mypkg.rewards:accuracy")


def check_signature(fn: RewardFn, columns: list[str]) -> None:
    """`fn` must take `prompts=`, `completions=` and the table's columns as keywords (TRL's calling convention)."""
    name = function_name(fn)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin: the probe call decides
    params = sig.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    needed = [
        n
        for n, p in params.items()
        if n not in ("prompts", "completions")
        and p.default is p.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    lacking = [n for n in needed if n not in columns]
    if lacking:
        raise UserError(
            f"reward function {name} needs the column {lacking[0]!r}, which the prompts do not have (columns: "
            f"{', '.join(columns) or 'none'}); add it to the prompt file or pick another function"
        )
    try:
        sig.bind(prompts=[], completions=[], **({c: [] for c in columns} if takes_any else {}))
    except TypeError:
        raise UserError(
            f"reward function {name} takes {tuple(params)}; it must take (prompts, completions, **columns), "
            "as TRL's reward functions do"
        ) from None


def parse_weights(text: str | None, n: int) -> list[float]:
    if text is None or not text.strip():
        return [1.0] * n
    try:
        weights = [float(w) for w in text.split(",")]
    except ValueError:
        weights = []
    if len(weights) != n or not all(math.isfinite(w) for w in weights):
        raise UserError(
            f"reward_weights must be {n} comma-separated numbers, one per reward function (got {text!r}); pass e.g. "
            f"--reward_weights {','.join(['1'] * n)}"
        )
    return weights


def reward_functions(
    fns: list[RewardFn], weights: list[float], columns: dict[str, dict[str, Any]], probe: list[tuple[str, str]]
) -> RewardFunctions:
    """Checked reward functions: signatures against the columns, then one probe call on `probe` (prompt, reply)
    pairs, so that a bad function fails before any sampling."""
    rf = RewardFunctions(fns, weights, columns)
    for fn in fns:
        check_signature(fn, rf.column_names)
    prompts, replies = [p for p, _ in probe], [r for _, r in probe]
    kw = rf.keyword_columns(prompts)
    raw = []  # each function called once on the probe, and checked before the next is called
    for fn in fns:
        raw.append(invoke(fn, prompts, replies, kw))
        checked(fn, raw[-1], len(replies))
    rf.first_is_checker = isinstance(raw[0], (list, tuple)) and all(isinstance(v, (bool, np.bool_)) for v in raw[0])
    return rf


def correctness_judge(rf: RewardFunctions, correct_at: float) -> Callable[[list[str], list[str]], list[float]]:
    """A gold checker from the first reward function: a reply is right (1.0) where its value is >= `correct_at`,
    else wrong (0.0); what accuracy, pass@1 and pass@k count."""
    first = rf.fns[0]

    def judge(prompts: list[str], completions: list[str]) -> list[float]:
        values = call(first, prompts, completions, rf.keyword_columns(prompts))
        return [float(v >= correct_at) for v in values]

    return judge


def load_reward_functions(
    specs: str, weights: str | None, columns: dict[str, dict[str, Any]], probe: list[tuple[str, str]]
) -> RewardFunctions:
    """`--reward_fn mod:f[,mod:g]` and `--reward_weights 1,0.1`, checked (`reward_functions`)."""
    fns = [import_function(s.strip()) for s in specs.split(",") if s.strip()]
    if not fns:
        raise UserError("reward_fn is empty; pass --reward_fn module:function")
    return reward_functions(fns, parse_weights(weights, len(fns)), columns, probe)
