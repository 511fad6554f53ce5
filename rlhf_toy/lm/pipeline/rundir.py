"""The run directory: its layout, and every load and save the stages make in it.

run_dir/tokenizer/                 1. the BPE tokenizer (transformers format; none with --base_model)
run_dir/base_model/                2. a --base_model .gguf file de-quantized into an HF directory (once)
run_dir/sft/, sft.json             2. SFT model + tokenizer; losses, entropy floor, samples
run_dir/preferences/               3. `datasets.Dataset` of prompt/chosen/rejected (+ gold scores, label)
run_dir/preferences.json           3. pair counts; preferences_eval.json: held-out groups with gold scores;
                                      reference_samples.json: one SFT sample per prompt (for normalization)
run_dir/reward_model/, reward.json 4. scalar-head model + tokenizer; held-out accuracy, correlation (--reward_dir
                                      NAME: run_dir/NAME/ and NAME.json; an --ensemble's directory holds
                                      ensemble.json and member_0/ ... member_K-1/)
run_dir/ALGORITHM/                 5. one policy run (ppo/, grpo/, dpo/, ... or --policy_dir): checkpoint/
                                      (policy/ + trainer_state.pt, one atomic unit: for --resume), policy/ (the
                                      finished policy), adapter/ (LoRA runs: the adapters alone), metrics.jsonl,
                                      curves.png, samples.json, summary.json (ppo.json before 0.2: still read)
run_dir/eval.md, eval.json         6. SFT vs best-of-n vs PPO on held-out prompts (the first evaluation, and its
                                      re-runs); an evaluation with other settings: eval-POLICIES_REWARD_DATA.md/.json
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path
from typing import Any

import torch
from datasets import load_from_disk

from rlhf_toy.distributed import is_main
from rlhf_toy.errors import UserError, first_line
from rlhf_toy.io import (
    atomic_dir,
    atomic_write_json,
    atomic_write_text,
    check_no_readers,
    folder_kind,
    output_lock,
    read_json,
    reader_lock,
)
from rlhf_toy.logging import read_jsonl

from ..data.preferences import check_preferences
from ..data.tasks import load_table
from ..labeling.store import is_label_log, log_pairs
from ..models.chat import load_tokenizer
from ..models.checkpoints import load_causal_lm, save_model
from ..models.lora import is_lora, load_lora
from ..models.reward_ensemble import ScoredReward, is_reward_dir, load_scored_reward


def main_only(save):
    """A save that only rank 0 makes under torchrun (every rank holds the same weights and figures)."""

    @functools.wraps(save)
    def guarded(*args: Any, **kwargs: Any) -> None:
        if is_main():
            save(*args, **kwargs)

    return guarded


def rows_upto(path: Path, upto: int) -> list[dict[str, Any]]:
    """The rows of a step log (JSONL, appended each step) up to step `upto`; none if the file is missing. A kill may
    have cut the last line short: it is dropped."""
    if not path.is_file():
        return []
    return [r for r in read_jsonl(path, partial_last_line_ok=True, steps=True) if r.get("step", 0) <= upto]


class PolicyDir:
    """One policy run's output directory, whatever trained it (PPO, REINFORCE, RLOO, GRPO, DPO): run_dir/ALGORITHM
    by default.

    `checkpoint/` is one atomic unit: the policy (`checkpoint/policy/`, a Hugging Face directory, or for a LoRA
    run its adapters) and the rest of the trainer's state (`checkpoint/trainer_state.pt`: value head, optimizer,
    beta, RNG states, settings) are renamed into place together, so a kill at any moment leaves a consistent
    checkpoint. `policy/` is the finished policy, written at the end of the run, adapters merged
    (`AutoModelForCausalLM.from_pretrained` loads it); a LoRA run also writes `adapter/` (peft loads it).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = root = Path(path)
        self.checkpoint, self.policy, self.adapter = root / "checkpoint", root / "policy", root / "adapter"
        self.metrics, self.curves, self.samples, self.summary = (
            root / "metrics.jsonl",
            root / "curves.png",
            root / "samples.json",
            root / "summary.json",
        )
        self.sample_log = root / "samples.jsonl"  # replies of a few steps, with their figures (report.html's table)

    def lock(self):
        """Only one process writes a policy directory at a time (a second one gets a one-line error); under torchrun
        rank 0 holds it for all ranks."""
        return output_lock(self.path, "policy run") if is_main() else contextlib.nullcontext()

    def has_checkpoint(self) -> bool:
        return (self.checkpoint / "trainer_state.pt").is_file() and (self.checkpoint / "policy").is_dir()

    @main_only
    def save_checkpoint(self, model, tok, state: dict[str, Any]) -> None:
        """Policy and trainer state, renamed into place as one directory."""
        with atomic_dir(self.checkpoint) as tmp:
            model.save_pretrained(tmp / "policy")
            tok.save_pretrained(tmp / "policy")
            torch.save(state, tmp / "trainer_state.pt")

    @main_only
    def save_policy(self, model, tok) -> None:
        """The finished policy as a plain HF directory; for a LoRA model also its adapters alone."""
        if is_lora(model):
            save_model(self.adapter, model, tok, merge=False)
        save_model(self.policy, model, tok)

    def load_checkpoint(self, sft_loader=None):
        """`(policy model, tokenizer, trainer state)` of the last checkpoint, for --resume; a LoRA checkpoint's
        adapters are put back on the model `sft_loader()` returns.

        The state is read with `weights_only=True`: tensors and plain Python types only, so a crafted file in
        the directory cannot run code.
        """
        if not self.has_checkpoint():
            raise UserError(
                f"nothing to resume in {self.path}: no checkpoint ({self.checkpoint.name}/ with policy/ "
                "and trainer_state.pt); run without --resume first"
            )
        path = self.checkpoint / "trainer_state.pt"
        try:
            state = torch.load(path, weights_only=True)
        except Exception as exc:  # a truncated file, or one that wants to unpickle code
            first = first_line(exc)
            raise UserError(
                f"{path} is not a readable trainer state ({type(exc).__name__}: {first}); delete "
                f"{self.checkpoint} and start without --resume"
            ) from None
        policy = self.checkpoint / "policy"
        if (policy / "adapter_config.json").is_file():
            loaded = sft_loader() if sft_loader is not None else None
            if loaded is None:
                raise UserError(f"{policy} holds LoRA adapters; resume with the same --lora_r as the saved run")
            base, tok = loaded
            return load_lora(base, policy), tok, state
        model, tok = load_causal_lm(policy, "checkpointed policy")
        return model, tok, state

    def load_metrics(self, upto: int) -> list[dict[str, Any]]:
        """The logged rows up to step `upto` (a kill may have cut the last line short: it is dropped)."""
        return rows_upto(self.metrics, upto)

    def load_samples(self, upto: int) -> list[dict[str, Any]]:
        """The report's sampled replies up to step `upto` (a resumed run keeps those of its checkpoint)."""
        return rows_upto(self.sample_log, upto)

    def load_policy(self, name: str):
        """`(policy model, tokenizer)` for evaluation; `name` names it in errors."""
        return load_causal_lm(self.policy, f"policy '{name}'")

    def check_kind(self, algorithm: str) -> None:
        """An output directory holds one kind of run: refuse to write `algorithm`'s run over another's."""
        held = self.load_summary().get("algorithm")
        if held is not None and held != algorithm:
            raise UserError(
                f"{self.path} holds a finished {held} run; pass another --policy_dir for {algorithm} (or delete "
                "that directory)"
            )

    def load_summary(self) -> dict[str, Any]:
        """The run's summary (`summary.json`; a directory written before 0.2 has it as `ppo.json`), or {}."""
        for path in (self.summary, self.path / "ppo.json"):
            if path.is_file():
                return read_json(path, f"delete it (the run in {self.path} then counts as unfinished)")
        return {}


class RunDir:
    """Where each stage reads and writes; the layout is the module docstring's."""

    def __init__(self, path: str | os.PathLike[str], reward_dir: str = "reward_model") -> None:
        self.path = root = Path(path)
        # Directories (Hugging Face model or dataset directories) and the JSON files the stages share.
        self.tokenizer, self.sft, self.preferences = root / "tokenizer", root / "sft", root / "preferences"
        self.reward_model = self.under_run(reward_dir)
        # reward.json for the default reward model; NAME.json beside any other (an ensemble's, WARM's)
        self.reward_report = (
            root / "reward.json"
            if self.reward_model == root / "reward_model"
            else self.reward_model.with_name(self.reward_model.name + ".json")
        )
        self.base_model = root / "base_model"
        self.preferences_eval, self.reference_samples = root / "preferences_eval.json", root / "reference_samples.json"

    def under_run(self, name_or_path: str) -> Path:
        """run_dir/NAME for a bare name, else the path itself."""
        p = Path(name_or_path)
        return p if p.is_absolute() or len(p.parts) > 1 else self.path / p

    def policy_dir(self, name_or_path: str) -> PolicyDir:
        """A policy run's output directory: run_dir/NAME (a bare name, e.g. the algorithm's), or a path."""
        return PolicyDir(self.under_run(name_or_path))

    def lock(self):
        """Only one process writes the run directory's own files at a time (policy directories have their own);
        under torchrun rank 0 holds it for all ranks."""
        return output_lock(self.path, "run") if is_main() else contextlib.nullcontext()

    def outside(self, path: Path) -> bool:
        """Whether `path` lies outside the run directory (a --reward_dir given as a path elsewhere)."""
        return not path.resolve().is_relative_to(self.path.resolve())

    def check_reward_target(self) -> None:
        """The reward stage writes `--reward_dir` whole: refuse a folder that holds something else (the run's
        SFT model, a policy run, the run itself), and one that a running stage of another run reads."""
        target = self.reward_model
        own = {
            self.path: "the run directory",
            self.sft: "the run's SFT model",
            self.tokenizer: "the tokenizer",
            self.preferences: "the preference data",
            self.base_model: "the base model",
        }
        for path, what in own.items():
            if target.resolve() == path.resolve():
                raise UserError(
                    f"--reward_dir {target} is {what}, which a reward model would replace; pass "
                    "another name, e.g. --reward_dir reward_model"
                )
        kind = folder_kind(target)
        if kind not in (None, "model") or (kind == "model" and not is_reward_dir(target)):
            raise UserError(
                f"--reward_dir {target} holds a {'model that is not a reward model' if kind == 'model' else kind}, "
                "which a reward model would replace; pass another directory"
            )
        if self.outside(target):
            check_no_readers(target)  # a policy stage of another run may be scoring with it

    def reading(self):
        """A policy stage reads the run's models for the block: writers of the run directory refuse meanwhile
        (under torchrun each rank registers; rank 0 alone holds the write lock)."""
        stack = contextlib.ExitStack()
        stack.enter_context(reader_lock(self.path, "run's models"))
        if self.reward_model.is_dir() and self.outside(self.reward_model):  # a --reward_dir elsewhere
            stack.enter_context(reader_lock(self.reward_model, "reward model"))
        return stack

    def report(self, name: str) -> Path:
        """A stage's JSON or markdown report: sft.json, reward.json, eval.md, ..."""
        return self.path / name

    # Loads.
    def load_tokenizer(self):
        return load_tokenizer(self.tokenizer)

    def load_sft(self, device=None):
        """`(SFT model, its tokenizer)`: the starting policy and the frozen reference (on `device` if given)."""
        model, tok = load_causal_lm(self.sft, "SFT")
        return (model if device is None else model.to(device)), tok

    def load_sft_tokenizer(self):
        if not (self.sft / "config.json").is_file():
            raise UserError(f"no SFT model in {self.sft}; run the 'sft' stage first (or pass the right --run_dir)")
        return load_tokenizer(self.sft)

    def load_reward_model(
        self,
        tok,
        reads: str = "auto",
        device=None,
        objective: str = "mean",
        coef: float = 0.0,
        length_penalty: float = 0.0,
    ) -> ScoredReward:
        """The reward model or ensemble under its objective (`ScoredReward`: reading the policy's token ids or the
        text, see `reads`)."""
        if not self.reward_model.is_dir():
            raise UserError(
                f"no reward model in {self.reward_model}; run the 'reward' stage first (or pass the right "
                "--run_dir or --reward_dir)"
            )
        rm = load_scored_reward(self.reward_model, tok, reads, objective, coef, length_penalty)
        return rm if device is None else rm.to(device)

    def load_preferences(self, preferences_file: str | None = None) -> dict[str, list]:
        """The preference pairs: the user's file if given, else the 'preferences' stage's dataset."""
        if preferences_file and is_label_log(preferences_file):  # written by `label`: retractions applied
            return log_pairs(preferences_file)
        if preferences_file:
            ds, where = load_table(preferences_file), preferences_file
        else:
            if not self.preferences.is_dir():
                raise UserError(
                    f"no preferences in {self.preferences}; run the 'preferences' stage first or pass "
                    "--preferences_file"
                )
            ds, where = load_from_disk(str(self.preferences)), str(self.preferences)
        check_preferences(ds, where)
        return {c: ds[c] for c in ds.column_names if c in ("prompt", "chosen", "rejected", "label")}

    def load_json(self, path: Path) -> dict[str, Any] | None:
        """A JSON file of the run, or None if that stage did not write it."""
        return read_json(path, "re-run the stage that wrote it") if path.is_file() else None

    # Saves (all atomic).
    @main_only
    def save_tokenizer(self, tok) -> None:
        with atomic_dir(self.tokenizer) as tmp:
            tok.save_pretrained(str(tmp))

    @main_only
    def save_model(self, path: Path, model, tok) -> None:
        save_model(path, model, tok)

    @main_only
    def save_preferences(self, ds) -> None:
        with atomic_dir(self.preferences) as tmp:
            ds.save_to_disk(str(tmp))

    @main_only
    def save_json(self, path: Path, obj: Any) -> None:
        atomic_write_json(path, obj)

    @main_only
    def save_text(self, path: Path, text: str) -> None:
        atomic_write_text(path, text)
