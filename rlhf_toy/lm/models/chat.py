"""The chat format, the tokenizer (trained offline with `tokenizers`, saved as a transformers tokenizer), and
turning texts into padded token-id tensors.

Format of one exchange with this project's own tokenizer (the special tokens split the text, so prompt and
response tokenize independently):

    <|user|>My printer won't start.<|bot|>Sure. Try restarting your printer. Good luck!<|eos|>

A pretrained model's tokenizer brings its own chat template: the prompt is `apply_chat_template` of one user
turn with the generation prompt (the assistant header), and a reply ends with the tokenizer's EOS (SmolLM2's
`<|im_end|>`). A tokenizer without a chat template (GPT-2, Pythia) gets this project's format as plain text.
Masks never compare ids with PAD (they come from lengths and the first EOS), so a tokenizer whose PAD is its
EOS works too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import Tensor
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from rlhf_toy.errors import UserError

USER, BOT, EOS, PAD = "<|user|>", "<|bot|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS = [PAD, EOS, USER, BOT]


def prompt_text(prompt: str) -> str:
    """What the model is given to continue: the user turn and the bot marker."""
    return f"{USER}{prompt}{BOT}"


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, out_dir: str | os.PathLike[str] | None = None, split_digits: bool = False
):
    """Byte-level BPE trained on `texts` (prompts and responses), wrapped as a `PreTrainedTokenizerFast`.

    Byte-level means any text can be encoded (no unknown tokens), and decoding restores it exactly. `split_digits`
    keeps every digit its own token (as Llama's and Qwen's tokenizers do): arithmetic then works digit by digit
    instead of on merged number tokens.
    """
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split_digits:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, additional_special_tokens=[USER, BOT]
    )
    fast.padding_side = "left"  # prompts are left-padded for generation
    if out_dir is not None:
        fast.save_pretrained(str(out_dir))
    return fast


def load_tokenizer(path: str | os.PathLike[str]):
    if not any((Path(path) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise UserError(f"no tokenizer in {path}; run the 'tokenizer' stage first (or pass the right --run_dir)")
    tok = AutoTokenizer.from_pretrained(str(path))
    if own_format(tok) and tok.pad_token_id == tok.eos_token_id:
        raise UserError(f"tokenizer in {path} needs distinct PAD and EOS tokens; retrain it (stage 'tokenizer')")
    prepare_tokenizer(tok)
    return tok


def own_format(tok) -> bool:
    """Whether `tok` is this project's own tokenizer (trained with the chat markers as special tokens)."""
    return USER in tok.get_vocab() and BOT in tok.get_vocab()


def check_tokenizer_matches(tok, model, what: str) -> None:
    """A model can only read ids from a tokenizer of its own vocabulary.

    This project's tokenizers fill the model's vocabulary exactly; a pretrained model's may be padded beyond
    the tokenizer's (Qwen2's is), so there the tokenizer must only fit inside it.
    """
    vocab = model.config.vocab_size
    fits = vocab == len(tok) if own_format(tok) else len(tok) <= vocab
    if not fits:
        raise UserError(
            f"the tokenizer does not match the {what} (vocab {len(tok)} vs {vocab}); use the tokenizer "
            "saved with that model"
        )


def encode_prompts(tok, prompts: list[str]) -> list[list[int]]:
    """Token ids of each prompt, ending where the reply begins: the model's chat template with the generation
    prompt if it has one, this project's format (user turn + bot marker) otherwise."""
    if getattr(tok, "chat_template", None):
        texts = [
            tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in prompts
        ]
        return [tok.encode(t, add_special_tokens=False) for t in texts]
    return [tok.encode(prompt_text(p)) for p in prompts]


def encode_responses(tok, responses: list[str]) -> list[list[int]]:
    """Token ids of each response, EOS appended (no BOS: a reply continues its prompt)."""
    return [tok.encode(r, add_special_tokens=False) + [tok.eos_token_id] for r in responses]


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
        raise UserError(
            f"a {what} prompt is {longest} tokens, too long for the context of {n_positions} with room "
            f"for a {min_response}-token response; shorten it, lower --max_new_tokens or raise "
            "--n_positions"
        )


def check_pairs_fit(tok, pairs: dict[str, list], n_positions: int, where: str) -> None:
    """Every preference pair (prompt + chosen or rejected reply + EOS) must fit the context: past it GPT-2's
    position table has no entry and a rotary model reads positions it never trained on. Checked once, before
    any training, with the longest pair named."""
    prompts = encode_prompts(tok, pairs["prompt"])
    longest, which = 0, 0
    for side in ("chosen", "rejected"):
        for i, (p, r) in enumerate(zip(prompts, encode_responses(tok, pairs[side]))):
            if len(p) + len(r) > longest:
                longest, which = len(p) + len(r), i
    if longest > n_positions:
        raise UserError(
            f"preference pair {which} of {where} is {longest} tokens (prompt + reply + EOS), longer than the context "
            f"of {n_positions}; shorten its replies or drop the pairs longer than {n_positions} tokens"
        )


def prepare_tokenizer(tok) -> None:
    """Give a tokenizer without a PAD token one, for filling tensors only.

    Llama-style tokenizers have no PAD; PAD = EOS here is only a fill value: every mask in this project comes
    from sequence lengths (and the first EOS of a reply), never from comparing ids with PAD, so EOS stays a
    learnable end of reply.
    """
    if tok.eos_token_id is None:
        raise UserError(
            "the tokenizer has no EOS token, so replies cannot end; pass a chat or language model's "
            "tokenizer with an EOS token"
        )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
