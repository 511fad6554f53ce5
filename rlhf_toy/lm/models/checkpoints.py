"""Loading and saving models as Hugging Face directories (`save_pretrained` / `from_pretrained`), atomically.

A model directory holds the model and its tokenizer; it is written to a temporary directory beside the target
and renamed into place, so a crash leaves the previous one (or none), never half a model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from transformers import AutoModelForCausalLM

from rlhf_toy.errors import UserError, first_line
from rlhf_toy.io import atomic_dir

from .chat import check_tokenizer_matches, load_tokenizer
from .lora import merged_copy


def save_model(path: str | os.PathLike[str], model, tok, merge: bool = True) -> None:
    """Write `model` and `tok` to the directory `path` in one atomic step. A LoRA model is saved with its
    adapters merged into a plain transformers model (`merge=False`: the adapters alone, for peft)."""
    with atomic_dir(path) as tmp:
        (merged_copy(model) if merge else model).save_pretrained(tmp)
        tok.save_pretrained(tmp)


def load_causal_lm(path: str | os.PathLike[str], what: str):
    """`(model in eval mode, tokenizer)` from a directory written by `save_model`; `what` names it in errors."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise UserError(f"no {what} model in {path}; run the earlier stage first (or pass the right --run_dir)")
    architectures = read_config(path).get("architectures") or []
    if architectures and not any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        raise UserError(
            f"{path} holds a {'/'.join(architectures)}, not a causal language model; pass a chat model's "
            "directory (e.g. run_dir/sft or run_dir/ppo/policy)"
        )
    tok = load_tokenizer(path)
    model = from_pretrained(AutoModelForCausalLM, path, what, strict=True)
    check_tokenizer_matches(tok, model, what)
    return model, tok


def read_config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text())
    except ValueError as exc:
        raise UserError(f"{path / 'config.json'} is not valid JSON ({exc}); re-run the stage that wrote it") from None


def from_pretrained(auto_class, path: Path, what: str, strict: bool = False, **kwargs):
    """`auto_class.from_pretrained(path)` in eval mode; a damaged directory is a one-line `UserError`. `strict`:
    weights the model needs but the directory lacks (a trunk saved without its LM head) are an error too, not
    a randomly initialized layer and a log line."""
    try:
        model, info = auto_class.from_pretrained(str(path), output_loading_info=True, **kwargs)
    except Exception as exc:  # a truncated model.safetensors, a config of an unknown architecture, ...
        first = first_line(exc)
        raise UserError(
            f"cannot load the {what} model in {path} ({type(exc).__name__}: {first}); re-run the stage that wrote it"
        ) from None
    if strict and info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        raise UserError(
            f"the {what} model in {path} lacks trained weights for {', '.join(missing[:3])}"
            f"{' ...' if len(missing) > 3 else ''} ({len(missing)} tensors); pass a model saved with every weight"
        )
    return model.eval()
