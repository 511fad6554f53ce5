"""Reward-model training: the Bradley-Terry loss on preference pairs, and held-out pairwise accuracy."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from rlhf_toy.config import check, option
from rlhf_toy.distributed import data_parallel, rank_and_world, shard

from ..models.reward_model import Scorer, encode_texts, score_texts
from .sft import cosine_lr


@dataclass
class RewardConfig:
    """Reward-model training."""

    epochs: int = option("Passes over the preference pairs (more if needed to reach --min_steps).", 2)
    batch_size: int = option("Pairs per gradient step.", 64)
    learning_rate: float = option("Peak AdamW learning rate (cosine decay).", 5e-4)
    min_steps: int = option("At least this many gradient steps: a small preference file gets more epochs.", 100)
    reward_base: str | None = option(
        "Train the reward model from this model instead of the SFT model: a directory, a .gguf file or smollm2; "
        "it keeps its own tokenizer and scores the policy's replies as text. A causal LM saved with its head and "
        "tokenizer.",
        None,
    )
    trainable_layers: int = option(
        "Transformer blocks that train, counted from the top (-1: all; 0: the scalar head only). Fewer is faster on "
        "a large model: the backward pass stops below them. LoRA adapters train in every block regardless.",
        -1,
    )
    ensemble: int = option(
        "Train this many reward models (an ensemble, Coste et al. 2024), each from its own seed (the head's "
        "initialization and the data order), saved as one directory that every stage loads; --reward_objective "
        "combines their scores.",
        1,
    )
    warm: int = option(
        "WARM (Rame et al. 2024): fine-tune this many reward models from one initialization (each its own data "
        "order) and save the average of their weights: one model's cost at inference.",
        1,
    )
    shared_init: bool = option(
        "Ensemble members start from one initialization and differ only in data order (and --bootstrap): such an "
        "ensemble can also be averaged (--warm_from).",
        False,
    )
    bootstrap: bool = option(
        "Each ensemble or WARM member trains on a bootstrap resample of the pairs (drawn with replacement).", False
    )
    warm_from: str | None = option(
        "Average the members of this existing ensemble directory (trained with --shared_init) into a WARM model "
        "at --reward_dir, without training.",
        None,
    )

    def __post_init__(self) -> None:
        check(self.ensemble >= 1, "ensemble", self.ensemble, ">= 1 (members of the ensemble; 1: one model)")
        check(self.warm >= 1, "warm", self.warm, ">= 1 (members averaged; 1: no averaging)")
        check(
            self.ensemble == 1 or self.warm == 1,
            "warm",
            self.warm,
            "1 with --ensemble (one directory holds an ensemble or one averaged model; train them apart)",
        )
        check(
            self.warm_from is None or (self.ensemble == 1 and self.warm == 1),
            "warm_from",
            self.warm_from,
            "without --ensemble or --warm (it averages members already trained)",
        )
        check(self.epochs >= 1, "epochs", self.epochs, ">= 1")
        check(self.min_steps >= 1, "min_steps", self.min_steps, ">= 1")
        check(self.trainable_layers >= -1, "trainable_layers", self.trainable_layers, ">= -1 (-1: all)")
        check(self.batch_size >= 1, "batch_size", self.batch_size, ">= 1")
        check(self.learning_rate > 0, "learning_rate", self.learning_rate, "> 0, e.g. 5e-4")


def bradley_terry_loss(r_chosen: Tensor, r_rejected: Tensor, label: Tensor | None = None) -> Tensor:
    """-log sigmoid(r_c - r_r), or with soft labels p: -(p log s(d) + (1 - p) log s(-d)). `[B] -> scalar`."""
    d = r_chosen - r_rejected
    if label is None:
        return -F.logsigmoid(d).mean()
    return -(label * F.logsigmoid(d) + (1 - label) * F.logsigmoid(-d)).mean()


def train_reward_model(rm, tok, pairs: dict[str, list], cfg: RewardConfig, seed: int, progress: bool = True) -> dict:
    """Bradley-Terry training in place on `pairs` (columns prompt, chosen, rejected[, label])."""
    n = len(pairs["prompt"])
    order = list(range(n))
    rng = random.Random(seed)
    params = [p for p in rm.parameters() if p.requires_grad]  # frozen trunk or LoRA: only what trains
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0)
    scorer = data_parallel(Scorer(rm))  # under torchrun DDP averages the gradients (batch_size is per rank)
    per_epoch = max(1, -(-n // cfg.batch_size) // rank_and_world()[1])
    epochs = max(cfg.epochs, -(-cfg.min_steps // per_epoch))  # a small file: enough passes for min_steps
    steps = epochs * per_epoch
    step, t0, losses = 0, time.perf_counter(), []
    labels = pairs.get("label")
    bar = tqdm(total=steps, desc="reward model", disable=not progress, leave=False)
    rm.train()
    for _ in range(epochs):
        rng.shuffle(order)
        for s in shard(list(range(0, n, cfg.batch_size))):
            idx = order[s : s + cfg.batch_size]
            prompts = [pairs["prompt"][i] for i in idx]
            ids, mask = encode_texts(
                tok, prompts + prompts, [pairs["chosen"][i] for i in idx] + [pairs["rejected"][i] for i in idx]
            )
            r = scorer(ids, mask)
            label = None if labels is None else torch.tensor([float(labels[i]) for i in idx], device=r.device)
            loss = bradley_terry_loss(r[: len(idx)], r[len(idx) :], label)
            for g in opt.param_groups:
                g["lr"] = cosine_lr(step, steps, cfg.learning_rate, warmup=max(1, steps // 20))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            losses.append(loss.item())
            step += 1
            bar.update(1)
    bar.close()
    rm.eval()
    return {
        "epochs": epochs,
        "steps": steps,
        "train_loss_first": float(np.mean(losses[:20])),
        "train_loss_last": float(np.mean(losses[-20:])),
        "wall_s": time.perf_counter() - t0,
    }


@dataclass(frozen=True)
class MemberSeeds:
    """Where one ensemble or WARM member's randomness comes from."""

    init: int  # the scalar head's (and LoRA adapters') initialization
    order: int  # the data order (and the bootstrap resample)


def member_seeds(seed: int, cfg: RewardConfig) -> list[MemberSeeds]:
    """One entry per member. Member 0 is the single model of `seed`; an ensemble's members differ in both
    seeds unless `shared_init`, WARM's in the data order only (averaging needs one initialization)."""
    k = max(cfg.ensemble, cfg.warm)
    shared = cfg.warm > 1 or cfg.shared_init
    return [MemberSeeds(seed if shared else seed + i, seed + i) for i in range(k)]


def bootstrap_pairs(pairs: dict[str, list], seed: int) -> dict[str, list]:
    """A resample of the pairs with replacement, as many as there are (seeded)."""
    rng = random.Random(seed)
    n = len(pairs["prompt"])
    idx = [rng.randrange(n) for _ in range(n)]
    return {c: [col[i] for i in idx] for c, col in pairs.items()}


def split_pairs(pairs: dict[str, list], fraction: float, seed: int) -> tuple[dict[str, list], dict[str, list]]:
    """Hold out the pairs of a seeded `fraction` of the prompts (all pairs of a prompt stay on one side)."""
    prompts = sorted(set(pairs["prompt"]))
    random.Random(seed).shuffle(prompts)
    held = set(prompts[: int(len(prompts) * fraction)])
    pick = lambda keep: {
        c: [v for v, p in zip(col, pairs["prompt"]) if (p in held) == keep]  # noqa: E731
        for c, col in pairs.items()
    }
    return pick(False), pick(True)


Score = Callable[[list[str], list[str]], Tensor]  # (prompts, responses) -> scores [B]


def scorer(rm, tok) -> Score:
    """A reward model's normalized scores as a `Score` (`reward_model.score_texts`)."""
    return lambda prompts, responses: score_texts(rm, tok, prompts, responses)


def pair_accuracy(score: Score, pairs: dict[str, list]) -> dict[str, float]:
    """Share of pairs whose chosen reply `score` puts above the rejected one."""
    chosen = score(pairs["prompt"], pairs["chosen"])
    rejected = score(pairs["prompt"], pairs["rejected"])
    return {"accuracy": float((chosen > rejected).float().mean()), "pairs": len(pairs["prompt"])}


def pairwise_accuracy(score: Score, prompts: list[str], groups: list[list[str]], gold: list[list[float]]) -> dict:
    """Held-out accuracy on pairs whose gold scores differ, and the correlation of `score`'s scores with gold."""
    flat_p = [p for p, g in zip(prompts, groups) for _ in g]
    flat_r = [r for g in groups for r in g]
    s = score(flat_p, flat_r).tolist()
    k, correct, total, i = 0, 0, 0, 0
    for g_scores in gold:
        k = len(g_scores)
        block = s[i : i + k]
        for a in range(k):
            for b in range(a + 1, k):
                if g_scores[a] != g_scores[b]:
                    total += 1
                    correct += (block[a] - block[b]) * (g_scores[a] - g_scores[b]) > 0
        i += k
    flat_gold = [x for g in gold for x in g]
    corr = float(np.corrcoef(s, flat_gold)[0, 1]) if len(set(flat_gold)) > 1 else float("nan")
    return {"accuracy": correct / total if total else float("nan"), "pairs": total, "correlation": corr}
