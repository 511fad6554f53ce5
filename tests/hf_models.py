"""Tiny random pretrained-style models of each architecture the project supports, built offline.

Each has a tokenizer of its own kind: byte-level BPE with BOS/EOS and no special chat markers; Llama and Qwen2
get a chat template and no PAD token (as Llama-style tokenizers ship); the model vocabularies are padded past
the tokenizer's (as Qwen2's is).
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlhf_toy.lm.data import helpdesk

ARCHS = ("gpt2", "llama", "gpt_neox", "qwen2")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VOCAB = 360
MODEL_VOCAB = 384  # padded beyond the tokenizer, as real models often are


def tiny_tokenizer(chat_template: bool, pad: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [t for d in helpdesk.generate(400, seed=0) for t in (d.prompt, d.response)]
    specials = ["<s>", "</s>", "<|im_start|>"] + (["<pad>"] if pad else [])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=VOCAB,
            special_tokens=specials,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>" if pad else None
    )
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config(arch: str, tok):
    from transformers import GPT2Config, GPTNeoXConfig, LlamaConfig, Qwen2Config

    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    common = {"vocab_size": MODEL_VOCAB, **ids}
    if arch == "gpt2":
        return GPT2Config(
            n_positions=128, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common
        )
    sizes = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 128,
    }
    if arch == "llama":
        return LlamaConfig(num_key_value_heads=1, **sizes, **common)
    if arch == "gpt_neox":
        return GPTNeoXConfig(hidden_dropout=0.0, attention_dropout=0.0, **sizes, **common)
    if arch == "qwen2":
        return Qwen2Config(num_key_value_heads=1, **sizes, **common)
    raise ValueError(arch)


def tiny_model_dir(arch: str, out: Path, seed: int = 0) -> Path:
    """A saved random model + tokenizer of `arch` (Llama and Qwen2: chat template, no PAD)."""
    from transformers import AutoModelForCausalLM

    chat = arch in ("llama", "qwen2")
    tok = tiny_tokenizer(chat_template=chat, pad=not chat)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, tok))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
