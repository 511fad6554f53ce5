"""Loading and saving models as Hugging Face directories (`save_pretrained` / `from_pretrained`), atomically.

A model directory holds the model and its tokenizer; it is written to a temporary directory beside the target
and renamed into place, so a crash leaves the previous one (or none), never half a model.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlhf_toy.errors import UserError
from rlhf_toy.io import atomic_dir

from .chat import check_tokenizer_matches, load_tokenizer


def save_model(path: str | os.PathLike[str], model, tok) -> None:
    """Write `model` and `tok` to the directory `path` in one atomic step."""
    with atomic_dir(path) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)


def load_causal_lm(path: str | os.PathLike[str], what: str):
    """`(model in eval mode, tokenizer)` from a directory written by `save_model`; `what` names it in errors."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        raise UserError(f"no {what} model in {path}; run the earlier stage first (or pass the right --run_dir)")
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    check_tokenizer_matches(tok, model, what)
    return model, tok


def load_reward_model(path: str | os.PathLike[str], tok):
    """The scalar-head reward model in `path`; it must read the policy tokenizer's ids (`tok`)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise UserError(f"no reward model in {path}; run the 'reward' stage first (or pass the right --run_dir)")
    rm_tok = AutoTokenizer.from_pretrained(str(path))
    if rm_tok.get_vocab() != tok.get_vocab() or rm_tok.pad_token_id != tok.pad_token_id:
        raise UserError(f"the reward model's tokenizer in {path} does not match the policy's; train the reward model "
                        "from this run's SFT model")
    return AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
