"""Checkable tasks: generated problems whose replies a program marks right or wrong (RL from verifiable rewards).

- `arithmetic`: "What is 347 + 589?" -> "Answer: 936". Difficulty is a setting: `digits` per operand and the
  `operations` (+, -, *).
- `countdown`: "Make 46 from 3, 7, 25 with + - * /, each number once." -> "Answer: 25 + 3 * 7". The checker parses
  the expression (Python's `ast`, never `eval`) and accepts only the given numbers, each exactly once, with
  + - * / and parentheses.

Each problem carries its columns (`answer`; `numbers` and `target`), and the reward functions below have TRL's
signature, `f(prompts, completions, **columns) -> list[float]`, so the built-in tasks and a user's prompt file with
a function written for TRL go through the same path (`rewards.py`). The checkers are strict about the answer (the
exact integer, the exact numbers) and forgiving about whitespace.
"""

from __future__ import annotations

import ast
import functools
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from fractions import Fraction
from typing import Any

from rlhf_toy.config import non_default
from rlhf_toy.errors import UserError

from .phrasings import ARITHMETIC_CORES, COUNTDOWN_CORES, WORDS_SHARE, render, split_templates

ANSWER = re.compile(r"Answer:\s*(.+?)\s*$", re.S)  # the text after the last "Answer:" (see `final_answer`)
INTEGER = re.compile(r"-?\d+")
FORMAT = re.compile(r"\s*Answer:\s*\S(.*\S)?\s*", re.S)  # the whole reply is one "Answer: ..." line


@dataclass
class Problem:
    prompt: str
    solution: str  # a right reply, for SFT ("Answer: 936")
    columns: dict[str, Any] = field(default_factory=dict)  # what the checker reads (TRL's extra dataset columns)
    fields: dict[str, Any] = field(default_factory=dict)  # what a phrasing template shows (`phrasings.py`)


def final_answer(completion: str) -> str | None:
    """What follows the last "Answer:" of a reply, stripped; None without one."""
    at = completion.rfind("Answer:")
    if at < 0:
        return None
    m = ANSWER.match(completion[at:])
    return m.group(1) if m else None


# Arithmetic -------------------------------------------------------------------------------------------------

OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def parse_operations(text: str) -> list[str]:
    ops = [c for c in text if not c.isspace() and c != ","]
    if not ops or any(c not in OPERATIONS for c in ops):
        raise UserError(f"operations must be some of + - * (got {text!r}); pass e.g. --operations +-")
    return list(dict.fromkeys(ops))


def operand(rng: random.Random, digits: int) -> int:
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


def arithmetic_problem(rng: random.Random, digits: int, operations: list[str]) -> Problem:
    a, b, op = operand(rng, digits), operand(rng, digits), rng.choice(operations)
    if op == "-" and b > a:  # keep answers non-negative: the same difficulty without a sign to learn
        a, b = b, a
    answer = str(OPERATIONS[op](a, b))
    return Problem(f"What is {a} {op} {b}?", f"Answer: {answer}", {"answer": answer}, {"a": a, "b": b, "op": op})


def arithmetic_prose(p: Problem) -> str:
    """An arithmetic demonstration as prose ("75 + 80 = 155."): right, but not in the checked form."""
    f = p.fields
    return f"{f['a']} {f['op']} {f['b']} = {p.columns['answer']}."


def with_prose(train: list[Problem], share: float, seed: int, prose: Callable[[Problem], str]) -> list[Problem]:
    """Training problems whose demonstrations (`solution`, what SFT imitates) are written as `prose` in `share` of
    them, right but not in the "Answer: N" form the checker reads. Demonstrations in two styles leave room for RL
    with a checker: the SFT model's most likely reply may be the unchecked style while the checked one is in its
    distribution (DeepSeek-R1's format reward teaches the same thing)."""
    rng = random.Random(f"prose-{seed}")
    return [replace(p, solution=prose(p)) if rng.random() < share else p for p in train]


def arithmetic_correct(completion: str, answer: str) -> bool:
    """The reply's final "Answer:" is exactly the integer `answer` (no other digits after it, whitespace free)."""
    got = final_answer(completion)
    return got is not None and INTEGER.fullmatch(got) is not None and int(got) == int(answer)


def correctness(prompts: list[str], completions: list[str], answer: list[str], **columns: Any) -> list[float]:
    """TRL-style reward: 1.0 where the reply's final "Answer:" is the exact integer answer, else 0.0."""
    return [float(arithmetic_correct(c, a)) for c, a in zip(completions, answer)]


def format_reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
    """TRL-style reward: 1.0 where the whole reply is one "Answer: ..." line, else 0.0."""
    return [float(FORMAT.fullmatch(c) is not None) for c in completions]


# Countdown --------------------------------------------------------------------------------------------------

MAX_EXPRESSION = 100  # characters: a longer reply is wrong without parsing it
BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


def evaluate_expression(text: str) -> tuple[Fraction, list[int]] | None:
    """`(value, numbers used)` of an expression of integers, + - * / and parentheses; None for anything else
    (names, calls, powers, unary minus, a division by zero, a syntax error). Exact: fractions, not floats."""
    if len(text) > MAX_EXPRESSION:
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    used: list[int] = []

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Div):
                if right == 0:
                    raise ZeroDivisionError
                return left / right
            if type(node.op) in BINARY:
                return BINARY[type(node.op)](left, right)
        raise ValueError(type(node).__name__)

    try:
        return value(tree), used
    except (ValueError, ZeroDivisionError):
        return None


def countdown_correct(completion: str, numbers: list[int], target: int) -> bool:
    got = final_answer(completion)
    result = None if got is None else evaluate_expression(got)
    return result is not None and result[0] == target and sorted(result[1]) == sorted(numbers)


def countdown_correctness(
    prompts: list[str], completions: list[str], numbers: list[list[int]], target: list[int], **columns: Any
) -> list[float]:
    """TRL-style reward: 1.0 where the final "Answer:" is an expression of exactly the given numbers that equals
    the target, else 0.0."""
    return [float(countdown_correct(c, n, t)) for c, n, t in zip(completions, numbers, target)]


def countdown_problem(rng: random.Random, count: int, largest: int) -> Problem:
    """Numbers 1..`largest` and a target reached by a random expression of all of them (integer, >= 0)."""
    while True:
        numbers = [rng.randint(1, largest) for _ in range(count)]
        order = numbers[:]
        rng.shuffle(order)
        text = str(order[0])
        for n in order[1:]:
            op = rng.choice("+-*/")
            text = f"({text}) {op} {n}" if rng.random() < 0.5 else f"{n} {op} ({text})"
        result = evaluate_expression(text)
        if result is not None and result[0].denominator == 1 and 0 <= result[0] <= 1000:
            target = int(result[0])
            shown = ", ".join(map(str, numbers))
            prompt = f"Make {target} from {shown} with + - * /, each number once."
            columns = {"numbers": numbers, "target": target}
            return Problem(prompt, f"Answer: {tidy(text)}", columns, {"target": target, "numbers": numbers})


def tidy(expression: str) -> str:
    """An expression with its redundant parentheses removed (`ast.unparse` keeps only the needed ones)."""
    return ast.unparse(ast.parse(expression, mode="eval"))


# Problem sets -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckableSettings:
    """How a checkable task's problems are drawn."""

    digits: int = 2  # arithmetic: digits per operand
    operations: str = "+-"  # arithmetic: some of + - *
    numbers: int = 3  # countdown: how many numbers
    largest: int = 20  # countdown: the largest number
    n_train: int = 20_000
    n_eval: int = 1_000
    prose: float = 0.0  # arithmetic: share of SFT demonstrations written as prose, not "Answer: N" (`with_prose`)
    instruction: str = ""  # appended to every prompt (a chat model is told the form the checker reads)
    phrasings: str = "many"  # many: the task's templates, a quarter held out; one: the canonical template only

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 6:
            raise UserError(f"digits must be 1 to 6 (got {self.digits}); pass e.g. --digits 2")
        parse_operations(self.operations)
        if not 2 <= self.numbers <= 6:
            raise UserError(f"countdown numbers must be 2 to 6 (got {self.numbers}); pass e.g. --numbers 3")
        if not 0 <= self.prose < 1:
            raise UserError(f"prose must be a share in [0, 1) (got {self.prose}); pass e.g. --prose 0.6")
        if self.phrasings not in ("many", "one"):
            raise UserError(f"phrasings must be many or one (got {self.phrasings!r}); pass --phrasings many")


Check = Callable[..., list[float]]  # TRL's reward signature: (prompts, completions, **columns) -> [B]


@dataclass(frozen=True)
class CheckableTask:
    """One checkable task: how a problem is drawn, the reward functions (TRL's signature) and their weights, the
    first being correctness (the gold judge), which `CheckableSettings` it reads, and its help line. `--task`'s
    choices and help, the run's settings and the reference page come from `CHECKABLE_TASKS`: adding a task is one
    record and its functions (docs/contributing.md)."""

    name: str
    help: str
    draw: Callable[[random.Random, CheckableSettings], Problem]  # one problem (its prompt, solution, columns)
    rewards: tuple[tuple[Check, float], ...]  # (function, weight); the first is correctness
    reads: tuple[str, ...] = ()  # the `CheckableSettings` of its problems (n_train, n_eval, instruction: all)
    prose: Callable[[Problem], str] | None = None  # a right demonstration not in the checked form (`--prose`)
    templates: Callable[[Problem], tuple[str, ...]] | None = None  # question forms (`phrasings.py`), canonical 1st
    words: float = WORDS_SHARE  # share of problems asked with their numbers in words (0: always digits)

    @property
    def checker(self) -> Check:
        """Correctness: the gold judge of the task (1 right, 0 wrong)."""
        return self.rewards[0][0]


# Settings every checkable task reads; the others are each task's own (`CheckableTask.reads`).
COMMON_SETTINGS = ("n_train", "n_eval", "instruction")

CHECKABLE_TASKS: dict[str, CheckableTask] = {
    t.name: t
    for t in (
        CheckableTask(
            "arithmetic",
            '"What is 47 + 38?" -> "Answer: 85"; --digits per operand, --operations some of + - *',
            lambda rng, s: arithmetic_problem(rng, s.digits, parse_operations(s.operations)),
            ((correctness, 1.0), (format_reward, 0.1)),
            reads=("digits", "operations", "prose", "phrasings"),
            prose=arithmetic_prose,
            templates=lambda p: ARITHMETIC_CORES[p.fields["op"]],
        ),
        CheckableTask(
            "countdown",
            '"Make 46 from 3, 7, 25 with + - * /, each number once." -> "Answer: 25 + 3 * 7"; --numbers to combine, '
            "each from 1 to --largest",
            lambda rng, s: countdown_problem(rng, s.numbers, s.largest),
            ((countdown_correctness, 1.0), (format_reward, 0.1)),
            reads=("numbers", "largest", "phrasings"),
            templates=lambda p: COUNTDOWN_CORES,
            words=0.0,  # four numbers in words would not fit the tiny model's 64-token context
        ),
    )
}


def get_checkable(name: str) -> CheckableTask:
    if name not in CHECKABLE_TASKS:
        raise UserError(f"unknown checkable task {name!r}; choose one of {', '.join(CHECKABLE_TASKS)}")
    return CHECKABLE_TASKS[name]


def check_reads(task: CheckableTask, s: CheckableSettings) -> None:
    """Refuse a setting the task does not read, set away from its default (`--digits` for countdown, say)."""
    unread = [f.name for f in fields(CheckableSettings) if f.name not in task.reads + COMMON_SETTINGS]
    for name in non_default(s, unread):
        readers = [t.name for t in CHECKABLE_TASKS.values() if name in t.reads]
        raise UserError(
            f"--{name} is not read by the {task.name} task (only by {', '.join(readers) or 'no task'}); drop it"
        )


def problems(task: str, s: CheckableSettings, seed: int) -> tuple[list[Problem], list[Problem]]:
    """Train and held-out problems of a checkable task; no held-out problem is a training problem, and with
    `phrasings="many"` every held-out problem is asked in a phrasing no training problem used. Callers must not
    change the lists (they are cached)."""
    train, held, _ = problem_sets(task, s, seed)
    return train, held


@functools.lru_cache(maxsize=4)  # every stage of a run (and a compare's many) draws the same set: draw it once
def problem_sets(task: str, s: CheckableSettings, seed: int) -> tuple[list[Problem], list[Problem], list[Problem]]:
    """(train, held out in held-out phrasings, the same held-out problems in training phrasings). With one phrasing
    (or a task without templates) the last two are the same problems in the canonical phrasing."""
    record = get_checkable(task)
    check_reads(record, s)
    rng = random.Random(f"{task}-{seed}")
    pool = [record.draw(rng, s) for _ in range(s.n_eval + s.n_train)]
    distinct = list(dict.fromkeys(p.prompt for p in pool))  # in order of appearance: seeded
    # A small problem space (1-digit operands) is held out a fifth at most, so that some remains to train on.
    held_prompts = set(distinct[: min(s.n_eval, len(distinct) // 5)])
    held = list({p.prompt: p for p in pool if p.prompt in held_prompts}.values())
    train = [p for p in pool if p.prompt not in held_prompts]
    if not held or not train:
        raise UserError(f"{task} with these settings has too few distinct problems to hold some out; raise --digits")
    if s.prose > 0 and record.prose is not None:  # (check_reads refused --prose for a task without prose)
        train = with_prose(train, s.prose, seed, record.prose)
    held_in = held
    if s.phrasings == "many" and record.templates is not None:
        train, held, held_in = rephrase(record, train, held, seed)
    if s.instruction:
        train, held, held_in = (
            [replace(p, prompt=f"{p.prompt} {s.instruction}") for p in ps] for ps in (train, held, held_in)
        )
    return train, held, held_in


def rephrase(
    record: CheckableTask, train: list[Problem], held: list[Problem], seed: int
) -> tuple[list[Problem], list[Problem], list[Problem]]:
    """Each training problem asked in a training phrasing, each held-out problem in a held-out phrasing and (the
    in-template figure) in a training phrasing; the numbers in words for the record's share of the problems."""
    assert record.templates is not None
    rng = random.Random(f"phrase-{record.name}-{seed}")

    def ask(p: Problem, held_out: bool) -> Problem:
        trained, unseen = split_templates(record.templates(p), seed)  # type: ignore[misc]
        prompt = render(rng.choice(unseen if held_out else trained), rng, record.words, **p.fields)
        return replace(p, prompt=prompt)

    return [ask(p, False) for p in train], [ask(p, True) for p in held], [ask(p, False) for p in held]
