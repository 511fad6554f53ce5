"""The chat format, the tokenizer (trained offline with `tokenizers`, saved as a transformers tokenizer), and
turning texts into padded token-id tensors.

Format of one exchange (the special tokens split the text, so prompt and response tokenize independently):

    <|user|>My printer won't start.<|bot|>Sure. Try restarting your printer. Good luck!<|eos|>

PAD (`<|pad|>`) is distinct from EOS, so EOS is never masked as padding and the policy can learn to stop.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

from rlhf_toy.errors import UserError

USER, BOT, EOS, PAD = "<|user|>", "<|bot|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS = [PAD, EOS, USER, BOT]


def prompt_text(prompt: str) -> str:
    """What the model is given to continue: the user turn and the bot marker."""
    return f"{USER}{prompt}{BOT}"


def train_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | os.PathLike[str] | None = None):
    """Byte-level BPE trained on `texts` (prompts and responses), wrapped as a `PreTrainedTokenizerFast`.

    Byte-level means any text can be encoded (no unknown tokens), and decoding restores it exactly.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS,
                                   additional_special_tokens=[USER, BOT])
    fast.padding_side = "left"  # prompts are left-padded for generation
    if out_dir is not None:
        fast.save_pretrained(str(out_dir))
    return fast


def load_tokenizer(path: str | os.PathLike[str]):
    from transformers import AutoTokenizer

    if not (Path(path) / "tokenizer.json").is_file():
        raise UserError(f"no tokenizer in {path}; run the 'tokenizer' stage first (or pass the right --run_dir)")
    tok = AutoTokenizer.from_pretrained(str(path))
    check_tokenizer(tok, str(path))
    return tok


def check_tokenizer(tok, where: str) -> None:
    if tok.pad_token_id is None or tok.eos_token_id is None or tok.pad_token_id == tok.eos_token_id:
        raise UserError(f"tokenizer in {where} needs distinct PAD and EOS tokens; retrain it (stage 'tokenizer')")


def check_tokenizer_matches(tok, model, what: str) -> None:
    """A model can only read ids from a tokenizer of its own vocabulary and special tokens."""
    cfg = model.config
    if cfg.vocab_size != len(tok) or getattr(cfg, "pad_token_id", None) not in (None, tok.pad_token_id) or \
            getattr(cfg, "eos_token_id", None) not in (None, tok.eos_token_id):
        raise UserError(f"the tokenizer does not match the {what} (vocab {len(tok)} vs {cfg.vocab_size}, or other "
                        f"PAD/EOS ids); use the tokenizer saved with that model")


def encode_prompts(tok, prompts: list[str]) -> list[list[int]]:
    """Token ids of each prompt in the chat format (ending with the bot marker)."""
    return [tok.encode(prompt_text(p)) for p in prompts]


def encode_responses(tok, responses: list[str]) -> list[list[int]]:
    """Token ids of each response, EOS appended."""
    return [tok.encode(r) + [tok.eos_token_id] for r in responses]


def pad_sequences(seqs: list[list[int]], pad_id: int, side: str = "left") -> tuple[Tensor, Tensor]:
    """Token lists -> `(ids [B, L], mask [B, L])`, padded on the `side` given ("left" for prompts, which
    generation continues; "right" for training sequences)."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', not {side!r}")
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        real = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        ids[i, real] = torch.tensor(s, dtype=torch.long)
        mask[i, real] = 1
    return ids, mask


def widen(x: Tensor, width: int, value: int, side: str) -> Tensor:
    """`[B, L] -> [B, width]`, filling the new columns with `value` on the `side` given."""
    extra = width - x.shape[1]
    return torch.nn.functional.pad(x, (extra, 0) if side == "left" else (0, extra), value=value)


def check_fits(prompt_ids: list[list[int]], n_positions: int, min_response: int, what: str) -> None:
    """Every prompt must leave room for a `min_response`-token reply in the context."""
    longest = max(len(p) for p in prompt_ids)
    if longest + min_response > n_positions:
        raise UserError(f"a {what} prompt is {longest} tokens, too long for the context of {n_positions} with room "
                        f"for a {min_response}-token response; shorten it, lower --max_new_tokens or raise "
                        "--n_positions")
