"""LoRA adapters (peft, an optional extra) on every linear layer; the frozen reference is the same network with
the adapters disabled, so there is no second copy of the model in memory."""

from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlhf_toy.config import check, option
from rlhf_toy.errors import UserError


@dataclass
class LoraConfig:
    """LoRA adapters (peft): rank 0 trains every weight instead."""

    lora_r: int = option("LoRA rank (0: no LoRA, train every weight). Needs the 'lora' extra (peft).", 0)
    lora_alpha: float = option("LoRA scale numerator (the update is alpha / r * B A).", 16.0)
    lora_targets: str = option(
        "Modules given adapters: all-linear (every linear layer but the output layer), "
        "comma-separated module names, or both (all-linear,lm_head adds the output layer).",
        "all-linear",
    )

    def __post_init__(self) -> None:
        check(self.lora_r >= 0, "lora_r", self.lora_r, ">= 0 (0: no LoRA)")
        check(self.lora_alpha > 0, "lora_alpha", self.lora_alpha, "> 0, e.g. 16")

    @property
    def enabled(self) -> bool:
        return self.lora_r > 0


def require_peft() -> None:
    if importlib.util.find_spec("peft") is None:
        raise UserError("LoRA (--lora_r > 0) needs peft: pip install -e '.[lora]' (or pip install peft)")


def lora_settings(lora: LoraConfig | None) -> LoraConfig:
    """`lora`, or no LoRA; a stage calls it first, so LoRA without peft fails before any model loads."""
    lora = lora or LoraConfig()
    if lora.enabled:
        require_peft()
    return lora


def add_lora(model, cfg: LoraConfig, task_type: str, seed: int | None = None):
    """`model` wrapped with fresh trainable adapters (peft `get_peft_model`); `task_type` CAUSAL_LM or SEQ_CLS
    (a sequence classifier's score head trains in full beside the adapters). peft draws the adapters' initial
    weights from torch's global generator: `seed` draws them from a generator of their own instead (the same
    adapters on every run, the global stream untouched); None draws from the global stream, as the stages do
    after seeding it."""
    require_peft()
    import peft  # an optional extra ('lora'): imported only when LoRA is asked for

    targets: Any = target_modules(model, cfg.lora_targets)
    lora = peft.LoraConfig(
        r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, target_modules=targets, task_type=task_type
    )
    try:
        if seed is None:
            return peft.get_peft_model(model, lora)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return peft.get_peft_model(model, lora)
    except ValueError as exc:
        raise UserError(
            f"cannot add LoRA adapters ({str(exc).splitlines()[0][:160]}); pass --lora_targets with "
            "module names of this model"
        ) from None


def target_modules(model, spec: str) -> str | list[str]:
    """peft's `target_modules` for `--lora_targets`: "all-linear" as peft reads it (every linear layer except the
    output layer), or module names; "all-linear" among names is expanded to the model's linear layers' names (so
    "all-linear,lm_head" also adapts the output layer, which a small model with near-uniform outputs needs)."""
    names = [t.strip() for t in spec.split(",") if t.strip()]
    if names == ["all-linear"]:
        return "all-linear"
    if "all-linear" in names:
        output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        linear = {
            n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not output
        }
        names = sorted(linear | set(names) - {"all-linear"})
    return names


def is_lora(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "merge_and_unload")


def load_lora(base, adapter_dir: Path):
    """`base` with the trainable adapters saved in `adapter_dir` (for --resume)."""
    require_peft()
    import peft  # an optional extra ('lora'): imported only when LoRA is asked for

    return peft.PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True)


def merged_copy(model):
    """A plain transformers model with the adapters folded into its weights (the LoRA model is untouched)."""
    return copy.deepcopy(model).merge_and_unload().eval() if is_lora(model) else model


def reference_mode(model):
    """A context in which a LoRA model computes the reference's log-probs (adapters off)."""
    return model.disable_adapter()


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]
