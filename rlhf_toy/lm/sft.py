"""Supervised fine-tuning of the tiny chat model on (prompt, response) pairs, loss on response tokens."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from rlhf_toy.errors import UserError

from .model import cosine_lr, encode_prompts, encode_responses, lm_loss, mean_response_loss


@dataclass
class SFTConfig:
    """SFT hyperparameters."""

    epochs: int = field(default=2, metadata={"help": "Passes over the SFT pairs."})
    batch_size: int = field(default=64, metadata={"help": "Sequences per gradient step."})
    learning_rate: float = field(default=2e-3, metadata={"help": "Peak AdamW learning rate (cosine decay)."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay."})

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.learning_rate <= 0:
            raise UserError(f"SFT needs epochs >= 1, batch_size >= 1, learning_rate > 0 (got {self.epochs}, "
                            f"{self.batch_size}, {self.learning_rate})")


def encode_pairs(tok, pairs: list[tuple[str, str]], n_positions: int) -> tuple[list[tuple[list[int], list[int]]], int]:
    """Token ids of each pair that fits the context; returns `(pairs_ids, n_dropped)`."""
    p_ids = encode_prompts(tok, [p for p, _ in pairs])
    r_ids = encode_responses(tok, [r for _, r in pairs])
    kept = [(p, r) for p, r in zip(p_ids, r_ids) if len(p) + len(r) <= n_positions]
    return kept, len(pairs) - len(kept)


def train_sft(model, tok, train_ids, eval_ids, cfg: SFTConfig, seed: int, progress: bool = True) -> dict:
    """Train in place; returns the loss history (mean per response token)."""
    if not train_ids:
        raise UserError("no SFT pair fits the context; raise --n_positions or use shorter texts")
    from .model import sft_batches

    generator = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.learning_rate, betas=(0.9, 0.98))
    steps_per_epoch = -(-len(train_ids) // cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    history = {"eval_loss": [mean_response_loss(model, eval_ids, tok.pad_token_id)], "train_loss": []}
    t0, step = time.perf_counter(), 0
    bar = tqdm(total=total, desc="sft", disable=not progress, leave=False)
    model.train()
    for _ in range(cfg.epochs):
        running, count = 0.0, 0
        for ids, mask, labels in sft_batches(train_ids, cfg.batch_size, tok.pad_token_id, generator):
            for g in opt.param_groups:
                g["lr"] = cosine_lr(step, total, cfg.learning_rate, warmup=max(1, total // 20))
            loss_sum, n = lm_loss(model, ids, mask, labels)
            loss = loss_sum / max(n, 1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            running, count, step = running + loss_sum.item(), count + n, step + 1
            bar.update(1)
            bar.set_postfix(loss=f"{running / max(count, 1):.3f}", refresh=False)
        model.eval()
        history["train_loss"].append(running / max(count, 1))
        history["eval_loss"].append(mean_response_loss(model, eval_ids, tok.pad_token_id))
        model.train()
    bar.close()
    model.eval()
    history["wall_s"] = time.perf_counter() - t0
    return history
