"""The reward model: the SFT transformer with a scalar head, trained with the Bradley-Terry loss.

- The score is read at the last real token of prompt + response + EOS (left or right padding alike).
- Dropout is off (inherited from the SFT config).
- Scores are normalized so that reference (SFT) samples have mean 0 and std 1; the two numbers live in the
  saved config (`reward_mean`, `reward_std`), so a plain `from_pretrained` + `score()` reproduces them.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from rlhf_toy.errors import UserError

from .model import cosine_lr, encode_prompts, encode_responses, left_pad, position_ids


@dataclass
class RewardConfig:
    """Reward-model training."""

    epochs: int = field(default=2, metadata={"help": "Passes over the preference pairs."})
    batch_size: int = field(default=64, metadata={"help": "Pairs per gradient step."})
    learning_rate: float = field(default=5e-4, metadata={"help": "Peak AdamW learning rate (cosine decay)."})

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.learning_rate <= 0:
            raise UserError(f"reward training needs epochs >= 1, batch_size >= 1, learning_rate > 0 (got "
                            f"{self.epochs}, {self.batch_size}, {self.learning_rate})")


def bradley_terry_loss(r_chosen: Tensor, r_rejected: Tensor, label: Tensor | None = None) -> Tensor:
    """-log sigmoid(r_c - r_r), or with soft labels p: -(p log s(d) + (1 - p) log s(-d)). `[B] -> scalar`."""
    d = r_chosen - r_rejected
    if label is None:
        return -F.logsigmoid(d).mean()
    return -(label * F.logsigmoid(d) + (1 - label) * F.logsigmoid(-d)).mean()


def last_token_index(mask: Tensor) -> Tensor:
    """`[B, L]` attention mask -> index of the last real token per row (either padding side)."""
    L = mask.shape[1]
    return L - 1 - mask.long().flip(1).argmax(1)


def raw_scores(rm, ids: Tensor, mask: Tensor) -> Tensor:
    """Unnormalized scalar scores `[B]` read at the last real token."""
    hidden = rm.transformer(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).last_hidden_state
    last = hidden[torch.arange(ids.shape[0]), last_token_index(mask)]
    return rm.score(last).squeeze(-1).float()


def normalize(rm, scores: Tensor) -> Tensor:
    return (scores - getattr(rm.config, "reward_mean", 0.0)) / getattr(rm.config, "reward_std", 1.0)


def encode_texts(tok, prompts: list[str], responses: list[str]) -> tuple[Tensor, Tensor]:
    """prompt + response + EOS, left-padded: `(ids [B, L], mask [B, L])`."""
    seqs = [p + r for p, r in zip(encode_prompts(tok, prompts), encode_responses(tok, responses))]
    return left_pad(seqs, tok.pad_token_id)


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
    ids, mask = left_pad(seqs, pad_id)
    return normalize(rm, raw_scores(rm, ids, mask))


def reward_model_from_sft(sft_dir: str, tok):
    from transformers import AutoModelForSequenceClassification

    rm = AutoModelForSequenceClassification.from_pretrained(sft_dir, num_labels=1)
    rm.config.pad_token_id = tok.pad_token_id
    return rm.eval()


def train_reward_model(rm, tok, pairs: dict[str, list], cfg: RewardConfig, seed: int, progress: bool = True) -> dict:
    """Bradley-Terry training in place on `pairs` (columns prompt, chosen, rejected[, label])."""
    n = len(pairs["prompt"])
    order = list(range(n))
    rng = random.Random(seed)
    opt = torch.optim.AdamW(rm.parameters(), lr=cfg.learning_rate, weight_decay=0.0)
    steps = cfg.epochs * -(-n // cfg.batch_size)
    step, t0, losses = 0, time.perf_counter(), []
    labels = pairs.get("label")
    bar = tqdm(total=steps, desc="reward model", disable=not progress, leave=False)
    rm.train()
    for _ in range(cfg.epochs):
        rng.shuffle(order)
        for s in range(0, n, cfg.batch_size):
            idx = order[s:s + cfg.batch_size]
            prompts = [pairs["prompt"][i] for i in idx]
            ids, mask = encode_texts(tok, prompts + prompts, [pairs["chosen"][i] for i in idx] +
                                     [pairs["rejected"][i] for i in idx])
            r = raw_scores(rm, ids, mask)
            label = None if labels is None else torch.tensor([float(labels[i]) for i in idx])
            loss = bradley_terry_loss(r[: len(idx)], r[len(idx):], label)
            for g in opt.param_groups:
                g["lr"] = cosine_lr(step, steps, cfg.learning_rate, warmup=max(1, steps // 20))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(rm.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            step += 1
            bar.update(1)
    bar.close()
    rm.eval()
    return {"train_loss_first": float(np.mean(losses[:20])), "train_loss_last": float(np.mean(losses[-20:])),
            "wall_s": time.perf_counter() - t0}


@torch.no_grad()
def set_normalization(rm, tok, prompts: list[str], responses: list[str]) -> tuple[float, float]:
    """Make reference samples score mean 0, std 1 (stored in the config, saved with the model)."""
    rm.config.reward_mean, rm.config.reward_std = 0.0, 1.0
    s = score_texts(rm, tok, prompts, responses)
    mean, std = float(s.mean()), float(s.std().clamp(min=1e-6))
    rm.config.reward_mean, rm.config.reward_std = mean, std
    return mean, std


def pairwise_accuracy(rm, tok, prompts: list[str], groups: list[list[str]], gold: list[list[float]]) -> dict:
    """Held-out accuracy on pairs whose gold scores differ, and the correlation of scores with gold."""
    flat_p = [p for p, g in zip(prompts, groups) for _ in g]
    flat_r = [r for g in groups for r in g]
    s = score_texts(rm, tok, flat_p, flat_r).tolist()
    k, correct, total, i = 0, 0, 0, 0
    for g_scores in gold:
        k = len(g_scores)
        block = s[i:i + k]
        for a in range(k):
            for b in range(a + 1, k):
                if g_scores[a] != g_scores[b]:
                    total += 1
                    correct += (block[a] - block[b]) * (g_scores[a] - g_scores[b]) > 0
        i += k
    flat_gold = [x for g in gold for x in g]
    corr = float(np.corrcoef(s, flat_gold)[0, 1]) if len(set(flat_gold)) > 1 else float("nan")
    return {"accuracy": correct / total if total else float("nan"), "pairs": total, "correlation": corr}
