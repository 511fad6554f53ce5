"""The reward model: a transformer with a scalar head (`AutoModelForSequenceClassification`, one label).

- The score is read at the last real token of prompt + response + EOS (left or right padding alike).
- Dropout is off (inherited from the SFT config).
- Scores are normalized so that reference (SFT) samples have mean 0 and std 1; the two numbers live in the
  saved config (`reward_mean`, `reward_std`), so a plain `from_pretrained` + `score()` reproduces them.
Training (Bradley-Terry) is in `rlhf_toy.lm.algorithms.reward`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf_toy.masks import last_real_index

from .causal_lm import position_ids
from .chat import encode_prompts, encode_responses, pad_sequences


def reward_model_from_sft(sft_dir: str, tok):
    """A scalar-head model whose trunk is the SFT model's (the head starts untrained)."""
    from pathlib import Path

    from transformers import AutoModelForSequenceClassification

    from .checkpoints import from_pretrained

    rm = from_pretrained(AutoModelForSequenceClassification, Path(sft_dir), "SFT", num_labels=1)
    rm.config.pad_token_id = tok.pad_token_id
    return rm


def raw_scores(rm, ids: Tensor, mask: Tensor) -> Tensor:
    """Unnormalized scalar scores `[B]` read at the last real token."""
    hidden = rm.transformer(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).last_hidden_state
    last = hidden[torch.arange(ids.shape[0]), last_real_index(mask)]
    return rm.score(last).squeeze(-1).float()


def normalize(rm, scores: Tensor) -> Tensor:
    return (scores - getattr(rm.config, "reward_mean", 0.0)) / getattr(rm.config, "reward_std", 1.0)


def encode_texts(tok, prompts: list[str], responses: list[str]) -> tuple[Tensor, Tensor]:
    """prompt + response + EOS, left-padded: `(ids [B, L], mask [B, L])`."""
    seqs = [p + r for p, r in zip(encode_prompts(tok, prompts), encode_responses(tok, responses))]
    return pad_sequences(seqs, tok.pad_token_id, "left")


@torch.no_grad()
def score_texts(rm, tok, prompts: list[str], responses: list[str], batch_size: int = 256) -> Tensor:
    """Normalized reward-model scores of (prompt, response) texts: `[B]`."""
    out = []
    for s in range(0, len(prompts), batch_size):
        ids, mask = encode_texts(tok, prompts[s:s + batch_size], responses[s:s + batch_size])
        out.append(normalize(rm, raw_scores(rm, ids, mask)))
    return torch.cat(out) if out else torch.zeros(0)


@torch.no_grad()
def score_token_ids(rm, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor,
                    eos_id: int, pad_id: int) -> Tensor:
    """Normalized scores `[B]` of generated tokens as they are (no decode/re-encode round trip).

    A response cut at the length limit gets an EOS appended, so the reward model always reads the input shape
    it was trained on.
    """
    seqs = []
    for p, pm, r, rm_ in zip(prompt_ids.tolist(), prompt_mask.tolist(), response_ids.tolist(), response_mask.tolist()):
        resp = [t for t, keep in zip(r, rm_) if keep]
        if not resp or resp[-1] != eos_id:
            resp.append(eos_id)
        seqs.append([t for t, keep in zip(p, pm) if keep] + resp)
    ids, mask = pad_sequences(seqs, pad_id, "left")
    return normalize(rm, raw_scores(rm, ids, mask))


MIN_NORM_STD = 0.05  # below this, scores barely vary: dividing by their std would blow rewards up


@torch.no_grad()
def set_normalization(rm, tok, prompts: list[str], responses: list[str]) -> tuple[float, float]:
    """Make reference samples score mean 0, std 1 (stored in the config, saved with the model).

    If their scores barely vary (std < MIN_NORM_STD) only the mean is removed: the raw scale is kept rather
    than multiplied by up to 1 / std.
    """
    rm.config.reward_mean, rm.config.reward_std = 0.0, 1.0
    s = score_texts(rm, tok, prompts, responses)
    mean, std = float(s.mean()), float(s.std()) if len(s) > 1 else 0.0
    if not std >= MIN_NORM_STD:
        std = 1.0
    rm.config.reward_mean, rm.config.reward_std = mean, std
    return mean, std
