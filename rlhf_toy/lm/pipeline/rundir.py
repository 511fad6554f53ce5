"""The run directory: its layout, and every load and save the stages make in it.

    run_dir/tokenizer/                 1. the BPE tokenizer (transformers format)
    run_dir/sft/, sft.json             2. SFT model + tokenizer; losses, entropy floor, samples
    run_dir/preferences/               3. `datasets.Dataset` of prompt/chosen/rejected (+ gold scores, label)
    run_dir/preferences.json           3. pair counts; preferences_eval.json: held-out groups with gold scores;
                                          reference_samples.json: one SFT sample per prompt (for normalization)
    run_dir/reward_model/, reward.json 4. scalar-head model + tokenizer; held-out accuracy, correlation
    run_dir/ppo/                       5. checkpoint/ (policy/ + trainer_state.pt, one atomic unit: for --resume),
                                          policy/ (the finished policy), metrics.jsonl, curves.png, samples.json,
                                          ppo.json
    run_dir/eval.md, eval.json         6. SFT vs best-of-n vs PPO on held-out prompts
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rlhf_toy.errors import UserError
from rlhf_toy.io import atomic_dir, atomic_write_json, atomic_write_text, output_lock
from rlhf_toy.logging import read_jsonl

from ..data.preferences import check_preferences
from ..data.tasks import load_table
from ..models.chat import load_tokenizer
from ..models.checkpoints import load_causal_lm, load_reward_model, save_model


class PPODir:
    """One PPO run's output directory (run_dir/ppo by default).

    `checkpoint/` is one atomic unit: the policy (`checkpoint/policy/`, a Hugging Face directory) and the rest
    of the trainer's state (`checkpoint/trainer_state.pt`: value head, optimizer, beta, RNG states, settings)
    are renamed into place together, so a kill at any moment leaves a consistent checkpoint. `policy/` is the
    finished policy, written at the end of the run (`AutoModelForCausalLM.from_pretrained` loads it).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = root = Path(path)
        self.checkpoint, self.policy = root / "checkpoint", root / "policy"
        self.metrics, self.curves, self.samples, self.summary = (
            root / "metrics.jsonl", root / "curves.png", root / "samples.json", root / "ppo.json")

    def lock(self):
        """Only one process writes a PPO directory at a time (a second one gets a one-line error)."""
        return output_lock(self.path, "PPO run")

    def has_checkpoint(self) -> bool:
        return (self.checkpoint / "trainer_state.pt").is_file() and (self.checkpoint / "policy").is_dir()

    def save_checkpoint(self, model, tok, state: dict[str, Any]) -> None:
        """Policy and trainer state, renamed into place as one directory."""
        import torch

        with atomic_dir(self.checkpoint) as tmp:
            model.save_pretrained(tmp / "policy")
            tok.save_pretrained(tmp / "policy")
            torch.save(state, tmp / "trainer_state.pt")

    def save_policy(self, model, tok) -> None:
        save_model(self.policy, model, tok)

    def load_checkpoint(self):
        """`(policy model, tokenizer, trainer state)` of the last checkpoint, for --resume.

        The state is read with `weights_only=True`: tensors and plain Python types only, so a crafted file in
        the directory cannot run code.
        """
        import torch

        if not self.has_checkpoint():
            raise UserError(f"nothing to resume in {self.path}: no checkpoint ({self.checkpoint.name}/ with policy/ "
                            "and trainer_state.pt); run without --resume first")
        path = self.checkpoint / "trainer_state.pt"
        try:
            state = torch.load(path, weights_only=True)
        except Exception as exc:  # a truncated file, or one that wants to unpickle code
            first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
            raise UserError(f"{path} is not a readable trainer state ({type(exc).__name__}: {first}); delete "
                            f"{self.checkpoint} and start without --resume") from None
        model, tok = load_causal_lm(self.checkpoint / "policy", "checkpointed policy")
        return model, tok, state

    def load_metrics(self, upto: int) -> list[dict[str, Any]]:
        """The logged rows up to step `upto` (a kill may have cut the last line short: it is dropped)."""
        if not self.metrics.is_file():
            return []
        return [r for r in read_jsonl(self.metrics, partial_last_line_ok=True) if r.get("step", 0) <= upto]

    def load_policy(self, name: str):
        """`(policy model, tokenizer)` for evaluation; `name` names it in errors."""
        return load_causal_lm(self.policy, f"PPO policy '{name}'")


class RunDir:
    """Where each stage reads and writes; the layout is the module docstring's."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = root = Path(path)
        # Directories (Hugging Face model or dataset directories) and the JSON files the stages share.
        self.tokenizer, self.sft, self.preferences, self.reward_model = (
            root / "tokenizer", root / "sft", root / "preferences", root / "reward_model")
        self.preferences_eval, self.reference_samples = root / "preferences_eval.json", root / "reference_samples.json"

    def ppo(self, name_or_path: str | None = None) -> PPODir:
        """A PPO output directory: run_dir/ppo, run_dir/NAME, or an explicit path."""
        if name_or_path is None:
            return PPODir(self.path / "ppo")
        p = Path(name_or_path)
        return PPODir(p if p.is_absolute() or len(p.parts) > 1 else self.path / p)

    def lock(self):
        """Only one process writes the run directory's own files at a time (PPO directories have their own)."""
        return output_lock(self.path, "run")

    def report(self, name: str) -> Path:
        """A stage's JSON or markdown report: sft.json, reward.json, eval.md, ..."""
        return self.path / name

    # Loads.
    def load_tokenizer(self):
        return load_tokenizer(self.tokenizer)

    def load_sft(self):
        """`(SFT model, its tokenizer)`: the starting policy and the frozen reference."""
        return load_causal_lm(self.sft, "SFT")

    def load_reward_model(self, tok):
        return load_reward_model(self.reward_model, tok)

    def load_preferences(self, preferences_file: str | None = None) -> dict[str, list]:
        """The preference pairs: the user's file if given, else the 'preferences' stage's dataset."""
        from datasets import load_from_disk

        if preferences_file:
            ds, where = load_table(preferences_file), preferences_file
        else:
            if not self.preferences.is_dir():
                raise UserError(f"no preferences in {self.preferences}; run the 'preferences' stage first or pass "
                                "--preferences_file")
            ds, where = load_from_disk(str(self.preferences)), str(self.preferences)
        check_preferences(ds, where)
        return {c: ds[c] for c in ds.column_names if c in ("prompt", "chosen", "rejected", "label")}

    def load_json(self, path: Path) -> dict[str, Any] | None:
        """A JSON file of the run, or None if that stage did not write it."""
        return json.loads(path.read_text()) if path.is_file() else None

    # Saves (all atomic).
    def save_tokenizer(self, tok) -> None:
        with atomic_dir(self.tokenizer) as tmp:
            tok.save_pretrained(str(tmp))

    def save_model(self, path: Path, model, tok) -> None:
        save_model(path, model, tok)

    def save_preferences(self, ds) -> None:
        with atomic_dir(self.preferences) as tmp:
            ds.save_to_disk(str(tmp))

    def save_json(self, path: Path, obj: Any) -> None:
        atomic_write_json(path, obj)

    def save_text(self, path: Path, text: str) -> None:
        atomic_write_text(path, text)
