"""Supervised fine-tuning of a chat model on (prompt, response) pairs, loss on response tokens (EOS included)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from rlhf_toy.config import check, option
from rlhf_toy.distributed import data_parallel, rank_and_world, shard
from rlhf_toy.errors import UserError

from ..models.chat import encode_prompts, encode_responses, pad_sequences
from ..models.devices import model_device

# (prompt ids, response ids + EOS) per pair; a third list, where given, marks the response tokens that are trained
# (1) and those that are only read (0): an agent's whole demonstrated episode in one row, its replies trained and
# the environment's turns between them read (`agents.rollout.demo_pairs`)
PairIds = list[tuple[list[int], list[int]] | tuple[list[int], list[int], list[int]]]
# The full weights of a pretrained model (SmolLM2-135M) take small steps: the default 2e-3 is the fresh tiny model's,
# and on SmolLM2 it collapsed every reply of an agent's SFT into one repeated word (measured, 2026-12-06).
PRETRAINED_LEARNING_RATE = 5e-5


@dataclass
class SFTConfig:
    """SFT hyperparameters."""

    epochs: int = option("Passes over the SFT pairs (0: no SFT, the --base_model itself is the reference).", 2)
    batch_size: int = option("Sequences per gradient step.", 64)
    learning_rate: float = option("Peak AdamW learning rate (cosine decay).", 2e-3)
    weight_decay: float = option("AdamW weight decay.", 0.01)
    sample_prompts: int = option("Held-out prompts sampled after training, for the report's gold score.", 200)
    sample_tokens: int = option("Longest sampled reply for that report (at most half the context).", 32)

    def __post_init__(self) -> None:
        check(self.epochs >= 0, "epochs", self.epochs, ">= 0 (0: no SFT, needs --base_model)")
        check(self.sample_prompts >= 1, "sample_prompts", self.sample_prompts, ">= 1")
        check(self.sample_tokens >= 1, "sample_tokens", self.sample_tokens, ">= 1")
        check(self.batch_size >= 1, "batch_size", self.batch_size, ">= 1")
        check(self.learning_rate > 0, "learning_rate", self.learning_rate, "> 0, e.g. 2e-3")
        check(self.weight_decay >= 0, "weight_decay", self.weight_decay, ">= 0")


def encode_pairs(tok, pairs: list[tuple[str, str]], n_positions: int) -> tuple[PairIds, int]:
    """Token ids of each pair that fits the context; returns `(pairs_ids, n_dropped)`."""
    p_ids = encode_prompts(tok, [p for p, _ in pairs])
    r_ids = encode_responses(tok, [r for _, r in pairs])
    kept = [(p, r) for p, r in zip(p_ids, r_ids) if len(p) + len(r) <= n_positions]
    return kept, len(pairs) - len(kept)


def trained_turns(pair: tuple[list[int], ...]) -> int:
    """The replies a pair trains: 1, or the runs of trained tokens its third list marks (a packed episode's turns)."""
    if len(pair) < 3:
        return 1
    marks = pair[2]
    return sum(1 for i, m in enumerate(marks) if m and (i == 0 or not marks[i - 1]))


def batch_indices(
    pairs_ids: PairIds, batch_size: int, generator: torch.Generator | None, shuffle: bool = True
) -> list[list[int]]:
    """Each batch's pair indices, in shuffled order: as many pairs as train `batch_size` replies (a plain pair one,
    a packed episode each of its turns), so packing changes the cost of an epoch and not its number of steps. With
    plain pairs: consecutive runs of `batch_size`, the last one shorter."""
    order = torch.randperm(len(pairs_ids), generator=generator).tolist() if shuffle else list(range(len(pairs_ids)))
    batches: list[list[int]] = []
    current: list[int] = []
    replies = 0
    for i in order:
        current.append(i)
        replies += trained_turns(pairs_ids[i])
        if replies >= batch_size:
            batches.append(current)
            current, replies = [], 0
    return batches + [current] if current else batches


def collate(pairs_ids: PairIds, chunk: list[int], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """`(ids, mask, labels)` of the pairs `chunk`, right-padded `[b, L]`; labels are -100 on the prompt, on padding
    and on the response tokens a pair marks as read only."""
    pairs = [pairs_ids[i] for i in chunk]
    ids, mask = pad_sequences([pair[0] + pair[1] for pair in pairs], pad_id, "right")
    labels = torch.full_like(ids, -100)
    for i, pair in enumerate(pairs):
        p, r = pair[0], torch.tensor(pair[1])
        if len(pair) > 2:
            r = r.masked_fill(torch.tensor(pair[2]) == 0, -100)  # type: ignore[misc]
        labels[i, len(p) : len(p) + len(r)] = r
    return ids, mask, labels


def sft_batches(
    pairs_ids: PairIds, batch_size: int, pad_id: int, generator: torch.Generator | None, shuffle: bool = True
) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """Yield `(ids, mask, labels)` batches (`batch_indices`, `collate`)."""
    for chunk in batch_indices(pairs_ids, batch_size, generator, shuffle):
        yield collate(pairs_ids, chunk, pad_id)


def lm_loss(model, ids: Tensor, mask: Tensor, labels: Tensor) -> tuple[Tensor, int]:
    """Summed next-token cross-entropy over labelled tokens, and their count (on the model's device)."""
    device = model_device(model)
    ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    target = labels[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100, reduction="sum")
    return loss, int((target != -100).sum())


@torch.no_grad()
def mean_response_loss(model, pairs_ids: PairIds, pad_id: int, batch_size: int = 256) -> float:
    """Mean loss per response token (nats), EOS included; NaN for no pairs (nothing to measure)."""
    total, count = 0.0, 0
    for ids, mask, labels in sft_batches(pairs_ids, batch_size, pad_id, None, shuffle=False):
        loss, n = lm_loss(model, ids, mask, labels)
        total, count = total + loss.item(), count + n
    return total / count if count else float("nan")


def cosine_lr(step: int, total: int, base: float, warmup: int) -> float:
    """Linear warmup over `warmup` steps, then cosine decay to 0 at `total`."""
    if step < warmup:
        return base * (step + 1) / warmup
    return base * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def train_sft(
    model, tok, train_ids: PairIds, eval_ids: PairIds, cfg: SFTConfig, seed: int, progress: bool = True
) -> dict:
    """Train in place; returns the loss history (mean per response token)."""
    if not train_ids:
        raise UserError("no SFT pair fits the context; raise --n_positions or use shorter texts")
    generator = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and p.requires_grad]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 and p.requires_grad]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.learning_rate,
        betas=(0.9, 0.98),
    )
    # Under torchrun each rank takes its share of every epoch's batches (batch_size is per rank) and DDP averages
    # the gradients; in one process `data_parallel` and `shard` change nothing.
    trained = data_parallel(model)
    # Every epoch's batches drawn first (the shuffles in the same order as drawn epoch by epoch): a packed episode
    # counts its turns, so the epochs' step counts can differ and the schedule needs them all.
    epochs = [batch_indices(train_ids, cfg.batch_size, generator) for _ in range(cfg.epochs)]
    total = sum(max(1, len(batches) // rank_and_world()[1]) for batches in epochs)
    history = {"eval_loss": [mean_response_loss(model, eval_ids, tok.pad_token_id)], "train_loss": []}
    t0, step = time.perf_counter(), 0
    bar = tqdm(total=total, desc="sft", disable=not progress, leave=False)
    model.train()
    for batches in epochs:
        running, count = 0.0, 0
        for ids, mask, labels in shard([collate(train_ids, chunk, tok.pad_token_id) for chunk in batches]):
            for g in opt.param_groups:
                g["lr"] = cosine_lr(step, total, cfg.learning_rate, warmup=max(1, total // 20))
            loss_sum, n = lm_loss(trained, ids, mask, labels)
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
