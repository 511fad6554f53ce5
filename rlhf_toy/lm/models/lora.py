"""LoRA adapters (peft, an optional extra) on every linear layer; the frozen reference is the same network with
the adapters disabled, so there is no second copy of the model in memory."""

from __future__ import annotations

import copy
import importlib.util
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers.pytorch_utils import Conv1D

from rlhf_toy.config import check, option
from rlhf_toy.errors import UserError, first_line


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
    check_rank(model, cfg.lora_r, targets)
    conv1d = any(isinstance(m, Conv1D) for m in model.modules())  # GPT-2 stores its weights [in, out]: say so
    lora = peft.LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=0.0,
        target_modules=targets,
        task_type=task_type,
        fan_in_fan_out=conv1d,
    )
    try:
        with warnings.catch_warnings(), torch.random.fork_rng(devices=[], enabled=seed is not None):
            # peft asks transformers' deprecated `is_gradient_checkpointing`: a FutureWarning on every LoRA run
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            if seed is not None:
                torch.manual_seed(seed)
            return peft.get_peft_model(model, lora)
    except ValueError as exc:
        raise UserError(
            f"cannot add LoRA adapters ({first_line(exc)}); pass --lora_targets with module names of this model"
        ) from None


HEADS = ("lm_head", "score", "classifier")  # output layers: peft's all-linear adapts none of them


def linear_widths(m: torch.nn.Module) -> tuple[int, int] | None:
    """(in, out) features of a linear layer as peft adapts them: `nn.Linear`, or transformers' `Conv1D` (GPT-2's
    linear layers, weight `[in, out]`); None for any other module."""
    if isinstance(m, torch.nn.Linear):
        return m.in_features, m.out_features
    if isinstance(m, Conv1D):
        return m.weight.shape[0], m.nf
    return None


def check_rank(model, r: int, targets: str | list[str]) -> None:
    """A rank above a targeted layer's width adds parameters without adding rank: refuse it, naming the limit."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None

    def targeted(name: str, m: torch.nn.Module) -> bool:
        if targets != "all-linear":
            return name.rsplit(".", 1)[-1] in targets
        return m is not output and name.rsplit(".", 1)[-1] not in HEADS  # peft leaves heads out of all-linear

    widths = [min(shape) for name, m in model.named_modules() if (shape := linear_widths(m)) and targeted(name, m)]
    if widths and r > min(widths):
        raise UserError(
            f"--lora_r {r} is above the narrowest targeted layer's width ({min(widths)}): the update could not "
            f"use that rank; pass --lora_r {min(widths)} or less"
        )


def target_modules(model, spec: str) -> str | list[str]:
    """peft's `target_modules` for `--lora_targets`: "all-linear" as peft reads it (every linear layer except the
    output layer), or module names; "all-linear" among names is expanded to the model's linear layers' names (so
    "all-linear,lm_head" also adapts the output layer, which a small model with near-uniform outputs needs)."""
    names = [t.strip() for t in spec.split(",") if t.strip()]
    if names == ["all-linear"]:
        return "all-linear"
    if "all-linear" in names:
        output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        linear = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if linear_widths(m) and m is not output}
        names = sorted(linear | set(names) - {"all-linear"})
    return names


def is_lora(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "merge_and_unload")


def load_lora(base, adapter_dir: Path):
    """`base` with the trainable adapters saved in `adapter_dir` (for --resume)."""
    require_peft()
    import peft  # an optional extra ('lora'): imported only when LoRA is asked for

    try:
        return peft.PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True)
    except Exception as exc:  # a truncated adapter_model.safetensors, a config of other modules
        first = first_line(exc)
        raise UserError(
            f"cannot load the LoRA adapters in {adapter_dir} ({type(exc).__name__}: {first}); delete that "
            "checkpoint and start without --resume"
        ) from None


def merged_copy(model):
    """A plain transformers model with the adapters folded into its weights (the LoRA model is untouched)."""
    return copy.deepcopy(model).merge_and_unload().eval() if is_lora(model) else model


def reference_mode(model):
    """A context in which a LoRA model computes the reference's log-probs (adapters off)."""
    return model.disable_adapter()


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]
