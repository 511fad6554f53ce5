"""Tasks: where prompts, SFT pairs and the gold judge come from.

- `helpdesk` (default): generated (see `helpdesk.py`); gold = VADER compound, -1 when the reply drops the topic.
- `helpdesk-chat`: the same prompts for a pretrained chat model (SmolLM2); gold rewards a reply that names the
  device, is friendly and concise (`helpdesk_chat_judge`).
- `chatterbot`: the English conversations shipped by the PyPI package `chatterbot-corpus`, as consecutive
  (prompt, response) pairs; gold = VADER compound of the reply.
- `arithmetic`, `countdown`: checkable problems (`checkable.py`): the reward is a program (correctness plus a
  little for the format), the gold is correctness.
- files: your own prompts / SFT pairs (JSONL, CSV, parquet through `datasets`; columns `prompt` and
  `response`, or TRL's `prompt`/`chosen`/`rejected`) and a gold judge `module:function` taking `text` or
  `(prompt, response)` and returning a number. With `--reward_fn` a prompt file needs no response column; its
  other columns reach the reward functions as keyword lists (TRL's convention).
"""

from __future__ import annotations

import codecs
import inspect
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlhf_toy.errors import UserError, first_line

from . import helpdesk
from .checkable import CHECKABLE_TASKS, CheckableSettings, get_checkable, problem_sets
from .rewards import (
    RewardFn,
    RewardFunctions,
    correctness_judge,
    import_callable,
    load_reward_functions,
    parse_weights,
    reward_functions,
)
from .scores import check_scores

Judge = Callable[[list[str], list[str]], list[float]]  # (prompts, responses) -> gold scores


@dataclass
class Task:
    """Everything the pipeline needs from a task."""

    name: str
    train: list[tuple[str, str]]  # (prompt, response) pairs for SFT
    eval: list[tuple[str, str]]  # held-out pairs (their prompts are the evaluation prompts)
    judge: Judge
    has_topic: bool = False  # whether on-topic rate means something for this task
    topic_rule: Callable[[str, str], bool] | None = None  # (prompt, response) -> on topic; None: `on_topic`
    entropy_floor_nats: float | None = None  # H(response | prompt) per response, if known
    reward: RewardFunctions | None = None  # a program reward (checkable tasks, --reward_fn): no reward model
    checkable: bool = False  # the gold judge marks replies right (1) or wrong (0): accuracy metrics apply
    # Other held-out prompt sets, evaluated beside `eval` (a checkable task's held-out problems in its training
    # phrasings: the in-template figure beside the held-out phrasings'), by name
    extra_evals: dict[str, list[str]] = field(default_factory=dict)
    eval_name: str = "held-out"  # what `eval` is, as the evaluation's table names it

    def is_on_topic(self, prompt: str, response: str) -> bool:
        return (self.topic_rule or on_topic)(prompt, response)

    @property
    def train_prompts(self) -> list[str]:
        return list(dict.fromkeys(p for p, _ in self.train))

    @property
    def eval_prompts(self) -> list[str]:
        return list(dict.fromkeys(p for p, _ in self.eval))


def _vader():
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


def vader_judge() -> Judge:
    analyzer = _vader()
    return lambda prompts, responses: [analyzer.polarity_scores(r)["compound"] for r in responses]


def on_topic(prompt: str, response: str) -> bool:
    topic = helpdesk.topic_of(prompt)
    return topic is not None and topic in response.lower().replace(".", " ").replace("!", " ").split()


CONCISE_WORDS = 25  # helpdesk-chat: a reply longer than this loses 0.02 per extra word


def names_topic(prompt: str, response: str) -> bool:
    """Whether a free-form reply names the prompt's device (as a word start: "printer's" and "printers" count)."""
    topic = helpdesk.topic_of(prompt)
    return topic is not None and re.search(rf"\b{re.escape(topic)}", response.lower()) is not None


def helpdesk_chat_judge() -> Judge:
    """What a user wants from a real chat model's help-desk reply: on topic (it names the device, else -1),
    friendly (VADER compound, in [-1, 1]) and concise (-0.02 per word beyond 25), floored at -1."""
    analyzer = _vader()

    def judge(prompts: list[str], responses: list[str]) -> list[float]:
        return [
            max(-1.0, analyzer.polarity_scores(r)["compound"] - 0.02 * max(0, len(r.split()) - CONCISE_WORDS))
            if names_topic(p, r)
            else -1.0
            for p, r in zip(prompts, responses)
        ]

    return judge


def helpdesk_judge() -> Judge:
    analyzer = _vader()

    def judge(prompts: list[str], responses: list[str]) -> list[float]:
        return [analyzer.polarity_scores(r)["compound"] if on_topic(p, r) else -1.0 for p, r in zip(prompts, responses)]

    return judge


def helpdesk_task(n_train: int = 20_000, n_eval: int = 1_000, seed: int = 0) -> Task:
    train = [(d.prompt, d.response) for d in helpdesk.generate(n_train, seed, "train")]
    evals = [(d.prompt, d.response) for d in helpdesk.generate(n_eval, seed, "eval")]
    return Task(
        "helpdesk", train, evals, helpdesk_judge(), has_topic=True, entropy_floor_nats=helpdesk.response_entropy_nats()
    )


def chatterbot_pairs() -> list[tuple[str, str]]:
    """Consecutive (prompt, response) pairs of the English conversations that `chatterbot-corpus` ships."""
    import yaml

    try:
        import chatterbot_corpus
    except ImportError as exc:
        raise UserError("the chatterbot task needs chatterbot-corpus; pip install chatterbot-corpus") from exc
    root = Path(chatterbot_corpus.__file__).parent / "data" / "english"
    pairs = []
    for path in sorted(root.glob("*.yml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for conv in data.get("conversations", []):
            turns = [str(t).strip() for t in conv if t is not None and str(t).strip()]
            pairs.extend(zip(turns[:-1], turns[1:]))
    return pairs


def chatterbot_task(seed: int = 0, eval_fraction: float = 0.1) -> Task:
    pairs = chatterbot_pairs()
    prompts = sorted(set(p for p, _ in pairs))
    random.Random(seed).shuffle(prompts)
    held = set(prompts[: max(1, int(len(prompts) * eval_fraction))])
    train = [pr for pr in pairs if pr[0] not in held]
    evals = [pr for pr in pairs if pr[0] in held]
    return Task("chatterbot", train, evals, vader_judge())


def load_judge(spec: str) -> Judge:
    """`module:function` -> a batch judge. The function takes `text` or `(prompt, response)` -> float."""
    takes = "; name a function that takes text or (prompt, response) and returns a number"
    fn = import_callable(spec, "judge", "mypkg.scores:politeness", takes)
    pair = _judge_arity(fn, spec) == 2

    def judge(prompts: list[str], responses: list[str]) -> list[float]:
        out = []
        for p, r in zip(prompts, responses):
            try:
                v = fn(p, r) if pair else fn(r)
            except Exception as exc:
                raise UserError(
                    f"judge '{spec}' failed on a reply ({type(exc).__name__}: {exc}); fix the judge"
                ) from None
            out.append(v)
        return check_scores(out, len(responses), f"the judge {spec}", "reply", torch.float64).tolist()

    judge(["My printer won't start."], ["Try restarting your printer."])  # fail now, not after sampling
    return judge


def _judge_arity(fn: Callable[..., Any], spec: str) -> int:
    """1 if `fn` takes `(text)`, 2 if it takes `(prompt, response)`; anything else is a `UserError`."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 1  # a builtin without a signature: the probe call in `load_judge` decides
    for n in (2, 1):
        try:
            sig.bind(*["x"] * n)
            return n
        except TypeError:
            continue
    raise UserError(
        f"judge '{spec}' takes {len(sig.parameters)} argument(s) {tuple(sig.parameters)}; it must take "
        "text, or prompt and response"
    )


Pairs = list[tuple[str, str]]


def load_pairs(
    path: str, eval_fraction: float = 0.1, seed: int = 0, prompts_only: bool = False
) -> tuple[Pairs, Pairs, dict[str, dict[str, Any]]]:
    """(prompt, response) pairs from a JSONL/CSV/parquet file (`prompt` + `response`, or `prompt` + `chosen`), split
    into train and held-out by prompt (a seeded `eval_fraction` of the prompts; 0: all train, none held out), and
    each prompt's other columns. `prompts_only` (a reward program needs no replies): a file without a response
    column gives empty responses."""
    ds = load_table(path)
    cols = set(ds.column_names)
    resp_col = "response" if "response" in cols else "chosen" if "chosen" in cols else None
    if "prompt" not in cols or (resp_col is None and not prompts_only):
        raise UserError(f"{path} needs a 'prompt' column and a 'response' (or 'chosen') column; it has {sorted(cols)}")
    others = [c for c in ds.column_names if c not in ("prompt", resp_col)]
    responses = ds[resp_col] if resp_col else [""] * len(ds)
    pairs: Pairs = []
    columns: dict[str, dict[str, Any]] = {}
    for i, (p, r) in enumerate(zip(ds["prompt"], responses)):
        if p and (r or resp_col is None):
            pairs.append((str(p), str(r)))
            row = {c: ds[i][c] for c in others}
            first = columns.setdefault(str(p), row)
            if first != row:  # a problem is known by its prompt: two answers to one prompt cannot both be checked
                raise UserError(
                    f"{path}: row {i + 1} repeats an earlier row's prompt {str(p)[:60]!r} with other columns "
                    f"({', '.join(c for c in others if first[c] != row[c])}); a prompt's columns must be the same in "
                    "every row: merge them (e.g. a list of accepted answers) or make the prompts differ"
                )
    if not pairs:
        raise UserError(f"{path} holds no non-empty (prompt, response) rows")
    prompts = sorted(set(p for p, _ in pairs))
    random.Random(seed).shuffle(prompts)
    if eval_fraction == 0:
        return pairs, [], columns
    held = set(prompts[: max(1, int(len(prompts) * eval_fraction))]) if len(prompts) > 1 else set()
    return [x for x in pairs if x[0] not in held], [x for x in pairs if x[0] in held] or pairs[:1], columns


def check_utf8(path: Path) -> None:
    """A text file must be UTF-8 throughout: pyarrow reads other bytes silently and fails later, deep in a stage."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    line = 1
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as exc:
                at = line + chunk[: exc.start].count(b"\n")
                raise UserError(
                    f"{path} is not UTF-8 text (byte 0x{chunk[exc.start]:02x} on line {at}); save it as UTF-8"
                ) from None
            line += chunk.count(b"\n")


def load_table(path: str):
    """A local JSONL/JSON, CSV or parquet file as a `datasets.Dataset`, with one-line errors."""
    from datasets import load_dataset

    p = Path(path)
    if not p.is_file():
        raise UserError(f"no file at {path}; pass a JSONL, CSV or parquet file")
    if p.stat().st_size == 0:
        raise UserError(f"{path} is empty; it needs at least one row")
    kind = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}.get(p.suffix.lower())
    if kind is None:
        raise UserError(f"{path}: unknown file type '{p.suffix}'; use .jsonl, .json, .csv or .parquet")
    if kind != "parquet":
        check_utf8(p)
    try:
        ds = load_dataset(kind, data_files=str(p), split="train")
    except Exception as exc:
        root = exc  # datasets wraps the parser's error ("An error occurred while generating the dataset"): name it
        while root.__cause__ is not None or root.__context__ is not None:
            root = root.__cause__ or root.__context__  # type: ignore[assignment]
        raise UserError(f"cannot read {path} as {kind} ({type(root).__name__}: {first_line(root, 200)})") from None
    if len(ds) == 0:
        raise UserError(f"{path} is empty; it needs at least one row")
    return ds


def checkable_task(name: str, settings: CheckableSettings, seed: int) -> Task:
    """A checkable task from its record (`checkable.CHECKABLE_TASKS`): generated problems, its reward functions
    and weights, and correctness as the gold judge."""
    record = get_checkable(name)
    train, held, held_in = problem_sets(name, settings, seed)
    columns = {p.prompt: p.columns for p in train + held + held_in}
    fns: list[RewardFn] = [fn for fn, _ in record.rewards]
    weights = [w for _, w in record.rewards]
    reward = reward_functions(fns, weights, columns, [(train[0].prompt, train[0].solution)])
    checker: RewardFn = record.checker

    def judge(prompts: list[str], responses: list[str]) -> list[float]:
        return list(checker(prompts, responses, **reward.keyword_columns(prompts)))

    pairs = lambda ps: [(p.prompt, p.solution) for p in ps]  # noqa: E731
    many = held_in is not held
    extra = {"training phrasings": [p.prompt for p in held_in]} if many else {}
    return Task(
        name, pairs(train), pairs(held), judge, reward=reward, checkable=True, extra_evals=extra,
        eval_name="held-out phrasings" if many else "held-out",
    )  # fmt: skip


TASKS = ("helpdesk", "helpdesk-chat", "chatterbot", *CHECKABLE_TASKS)


def check_data_flags(
    data: str | None,
    reward_fn: str | None,
    judge: str | None,
    eval_data: str | None,
    heldout_fraction: float,
    correct_at: float | None,
) -> None:
    """The settings of a user's prompt file are refused where they would be ignored."""
    if data is not None and not eval_data and not 0 < heldout_fraction < 1:
        raise UserError(
            f"heldout_fraction must be in (0, 1) (got {heldout_fraction}) for a --data file; pass e.g. "
            "--heldout_fraction 0.1, or --eval_data FILE to hold out a file of its own"
        )
    if data is None and eval_data:
        raise UserError("--eval_data is the held-out set of a --data file; pass --data too (or drop it)")
    if eval_data and heldout_fraction != 0.1:
        raise UserError("--eval_data is the held-out set, so nothing of --data is held out; drop --heldout_fraction")
    if correct_at is not None and (data is None or reward_fn is None or judge is not None):
        raise UserError(
            "--correct_at marks a reply right by the first --reward_fn of a --data file (with no --judge, which "
            "would be the gold); pass --data and --reward_fn, or drop it"
        )
    if correct_at is not None and not math.isfinite(correct_at):
        raise UserError(f"correct_at must be a finite number (got {correct_at}); pass e.g. --correct_at 1.0")


def get_task(
    name: str,
    data: str | None = None,
    judge: str | None = None,
    seed: int = 0,
    reward_fn: str | None = None,
    reward_weights: str | None = None,
    checkable: CheckableSettings | None = None,
    eval_data: str | None = None,
    heldout_fraction: float = 0.1,
    correct_at: float | None = None,
) -> Task:
    """The task by name (`TASKS`) or, with `data`, your own pairs (and `judge`); `reward_fn` (TRL-style functions,
    `rewards.py`) makes the reward a program instead of a reward model. With `data`: `eval_data` is a separate file
    of held-out prompts (else a seeded `heldout_fraction` of the file's prompts is held out), and `correct_at` (or a
    first reward function that returns booleans) marks replies right, so the evaluation reports accuracy, pass@1
    and pass@k."""
    if reward_weights and not reward_fn and name not in CHECKABLE_TASKS:
        raise UserError("--reward_weights weighs --reward_fn functions; pass --reward_fn too")
    check_data_flags(data, reward_fn, judge, eval_data, heldout_fraction, correct_at)
    if data is not None:
        only = reward_fn is not None
        train, evals, columns = load_pairs(data, 0.0 if eval_data else heldout_fraction, seed, only)
        if eval_data:
            evals, _, held_columns = load_pairs(eval_data, 0.0, seed, only)
            shared = sorted({p for p, _ in evals} & {p for p, _ in train})
            if shared:
                raise UserError(
                    f"{eval_data} shares {len(shared)} prompt(s) with {data} (e.g. {shared[0][:60]!r}); held-out "
                    "prompts must not be trained on: remove them from one file"
                )
            columns = {**columns, **held_columns}
        task = Task(Path(data).stem, train, evals, load_judge(judge) if judge else vader_judge())
    elif name == "helpdesk":
        task = helpdesk_task(seed=seed)
    elif name == "helpdesk-chat":  # the help-desk prompts, judged as a real chat model's replies
        task = helpdesk_task(seed=seed)
        task.name, task.judge, task.entropy_floor_nats = name, helpdesk_chat_judge(), None
        task.topic_rule = names_topic
    elif name == "chatterbot":
        task = chatterbot_task(seed=seed)
    elif name in CHECKABLE_TASKS:
        task = checkable_task(name, checkable or CheckableSettings(), seed)
    else:
        raise UserError(f"unknown task '{name}'; choose {', '.join(TASKS)}, or pass --data FILE")
    if judge and data is None:
        task.judge = load_judge(judge)
    if reward_fn:
        if task.reward is not None:  # a checkable task's columns (answer; numbers, target)
            columns = task.reward.columns
        elif data is None:  # a built-in task without columns
            columns = {p: {} for p, _ in task.train + task.eval}
        probe = task.train[:2]
        task.reward = load_reward_functions(reward_fn, reward_weights, columns, probe)
        if data is not None and not judge:  # the program is the only judge there is
            task.judge = task.reward
            if correct_at is not None or task.reward.first_is_checker:  # it says what is right: accuracy applies
                task.judge = correctness_judge(task.reward, 0.5 if correct_at is None else correct_at)
                task.checkable = True
    elif reward_weights and task.reward is not None:
        task.reward.weights = parse_weights(reward_weights, len(task.reward.fns))
    return task
