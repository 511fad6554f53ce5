"""DPO (Rafailov et al. 2023): the policy learns from preference pairs directly, offline, with no reward model
and no sampling loop. The reference is the frozen SFT model; the loss is the core's `rlhf_toy.losses.dpo_loss`
on summed response log-probs (EOS included), which `response_logprobs` gives for any causal LM.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from rlhf_toy.config import check, option
from rlhf_toy.errors import UserError
from rlhf_toy.losses import dpo_loss

from ..models.causal_lm import response_logprobs
from ..models.chat import encode_prompts, encode_responses, pad_sequences
from ..models.lora import reference_mode, trainable_parameters


@dataclass
class DPOConfig:
    """DPO's settings."""

    beta: float = option(
        "DPO's beta: the strength of the implicit KL to the reference (0.1 drifts to KL ~20 on "
        "helpdesk in one epoch; 1.0 stays near 2 nats with higher gold: docs, Results).",
        1.0,
    )
    epochs: int = option("Passes over the preference pairs.", 1)
    batch_size: int = option("Pairs per gradient step.", 32)
    learning_rate: float = option("Adam learning rate (constant after a short warmup).", 1e-4)
    max_grad_norm: float = option("Gradient-norm clip.", 1.0)

    def __post_init__(self) -> None:
        check(self.beta > 0, "beta", self.beta, "> 0, e.g. 1.0")
        check(self.epochs >= 1, "epochs", self.epochs, ">= 1")
        check(self.batch_size >= 1, "batch_size", self.batch_size, ">= 1")
        check(self.learning_rate > 0, "learning_rate", self.learning_rate, "> 0, e.g. 1e-4")
        check(self.max_grad_norm > 0, "max_grad_norm", self.max_grad_norm, "> 0")


def sequence_logps(model, tok, prompts: list[str], responses: list[str]) -> Tensor:
    """Summed log-probs `[B]` of each response (EOS appended) after its prompt, on the model's device."""
    prompt_ids, prompt_mask = pad_sequences(encode_prompts(tok, prompts), tok.pad_token_id, "left")
    response_ids, response_mask = pad_sequences(encode_responses(tok, responses), tok.pad_token_id, "right")
    logps, _ = response_logprobs(model, prompt_ids, prompt_mask, response_ids)
    return (logps * response_mask.to(logps.device)).sum(1)


def pair_logps(model, tok, pairs: dict[str, list], idx: list[int]) -> tuple[Tensor, Tensor]:
    """`(chosen [b], rejected [b])` summed log-probs of pairs `idx`, in one forward pass."""
    prompts = [pairs["prompt"][i] for i in idx]
    both = sequence_logps(
        model, tok, prompts + prompts, [pairs["chosen"][i] for i in idx] + [pairs["rejected"][i] for i in idx]
    )
    return both[: len(idx)], both[len(idx) :]


@torch.no_grad()
def reference_pair_logps(model, ref_model, tok, pairs: dict[str, list], idx: list[int]) -> tuple[Tensor, Tensor]:
    """The reference's `(chosen, rejected)` log-probs: `ref_model`, or (None) the LoRA `model` with adapters off."""
    if ref_model is None:
        with reference_mode(model):
            return pair_logps(model, tok, pairs, idx)
    return pair_logps(ref_model, tok, pairs, idx)


@torch.no_grad()
def implicit_accuracy(model, ref_model, tok, pairs: dict[str, list], beta: float, batch_size: int = 64) -> float:
    """Share of pairs whose chosen reply has the larger implicit reward beta * log(pi / pi_ref)."""
    if not pairs["prompt"]:
        return float("nan")
    hits = []
    for s in range(0, len(pairs["prompt"]), batch_size):
        idx = list(range(s, min(s + batch_size, len(pairs["prompt"]))))
        pc, pr = pair_logps(model, tok, pairs, idx)
        rc, rr = reference_pair_logps(model, ref_model, tok, pairs, idx)
        hits.append(dpo_loss(pc, pr, rc, rr, beta).accuracy.item() * len(idx))
    return float(sum(hits) / len(pairs["prompt"]))


def train_dpo(
    model,
    ref_model,
    tok,
    pairs: dict[str, list],
    cfg: DPOConfig,
    seed: int,
    held_pairs: dict[str, list] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train `model` in place on `pairs` (prompt/chosen/rejected) against the frozen `ref_model` (None: `model`
    is a LoRA model and the reference is it with the adapters off). Returns the loss history and, with
    `held_pairs`, the held-out implicit-reward accuracy before and after each epoch."""
    if not pairs.get("prompt"):
        raise UserError("DPO needs preference pairs; run the 'preferences' stage or pass --preferences_file")
    if ref_model is not None:
        ref_model = ref_model.eval().requires_grad_(False)
    params = trainable_parameters(model)
    opt = torch.optim.Adam(params, lr=cfg.learning_rate)
    n, rng = len(pairs["prompt"]), random.Random(seed)
    steps = cfg.epochs * -(-n // cfg.batch_size)
    warmup = max(1, steps // 10)
    history: dict[str, Any] = {"loss": [], "train_accuracy": []}
    if held_pairs is not None:
        history["heldout_accuracy"] = [implicit_accuracy(model, ref_model, tok, held_pairs, cfg.beta)]
    t0, step = time.perf_counter(), 0
    bar = tqdm(total=steps, desc="dpo", disable=not progress, leave=False)
    for _ in range(cfg.epochs):
        order = list(range(n))
        rng.shuffle(order)
        for s in range(0, n, cfg.batch_size):
            idx = order[s : s + cfg.batch_size]
            ref_c, ref_r = reference_pair_logps(model, ref_model, tok, pairs, idx)
            pol_c, pol_r = pair_logps(model, tok, pairs, idx)
            out = dpo_loss(pol_c, pol_r, ref_c, ref_r, cfg.beta)
            for g in opt.param_groups:
                g["lr"] = cfg.learning_rate * min(1.0, (step + 1) / warmup)
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            history["loss"].append(out.loss.item())
            history["train_accuracy"].append(out.accuracy.item())
            step += 1
            bar.update(1)
        if held_pairs is not None:
            history["heldout_accuracy"].append(implicit_accuracy(model, ref_model, tok, held_pairs, cfg.beta))
    bar.close()
    model.eval()
    history["wall_s"] = time.perf_counter() - t0
    history["loss_first"] = float(np.mean(history["loss"][:5]))
    history["loss_last"] = float(np.mean(history["loss"][-5:]))
    return history


def pairs_from_groups(prompts: list[str], groups: list[list[str]], gold: list[list[float]]) -> dict[str, list]:
    """Every pair of a held-out group whose gold scores differ, the better one as chosen."""
    out: dict[str, list] = {"prompt": [], "chosen": [], "rejected": []}
    for p, g, s in zip(prompts, groups, gold):
        for a in range(len(g)):
            for b in range(a + 1, len(g)):
                if s[a] != s[b] and g[a] != g[b]:
                    win, lose = (a, b) if s[a] > s[b] else (b, a)
                    out["prompt"].append(p)
                    out["chosen"].append(g[win])
                    out["rejected"].append(g[lose])
    return out
