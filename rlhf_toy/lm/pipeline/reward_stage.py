"""Stage 4, the reward model: one model, an ensemble (`--ensemble K`) or a weight average (`--warm K`,
`--warm_from DIR`), written to the run's `--reward_dir` with its held-out accuracy (per member and combined)."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from rlhf_toy.distributed import is_main
from rlhf_toy.errors import UserError

from ..algorithms.reward import (
    RewardConfig,
    Score,
    bootstrap_pairs,
    member_seeds,
    pair_accuracy,
    pairwise_accuracy,
    scorer,
    split_pairs,
    train_reward_model,
)
from ..labeling.store import TIE_LABEL, is_label_log
from ..models.base import context_length, load_base, resolve_base_model
from ..models.chat import check_fits, check_pairs_fit, check_tokenizer_matches, encode_prompts, load_tokenizer
from ..models.devices import autocast
from ..models.layers import freeze_below
from ..models.lora import LoraConfig, add_lora, lora_settings, merged_copy
from ..models.reward_ensemble import (
    ENSEMBLE_FILE,
    OBJECTIVES,
    MemberScores,
    ScoredReward,
    average_weights,
    is_ensemble,
    load_scored_reward,
    member_dirs,
    save_ensemble,
    weights_digest,
)
from ..models.reward_model import RewardModel, reward_model_from, set_normalization, trunk_and_head
from .run import RunConfig, writes_run_dir
from .rundir import RunDir


def start_reward_model(run: RunConfig, cfg: RewardConfig, lora: LoraConfig):
    """`(scalar-head model on the run's device, its tokenizer)`: from the SFT trunk, or from `--reward_base` (a
    separate model with its own tokenizer); its top `trainable_layers` blocks train (all: -1), and LoRA adapters
    if asked for."""
    rd = run.dir
    if cfg.reward_base:
        source = resolve_base_model(cfg.reward_base, rd.path / "reward_base")
        _, tok = load_base(source)
        what = "reward base"
    else:
        source, what = rd.sft, "SFT"
        tok = rd.load_sft_tokenizer()
    rm = reward_model_from(source, tok, what)
    check_tokenizer_matches(tok, rm, "reward model")
    if cfg.trainable_layers >= 0:
        freeze_below(trunk_and_head(rm)[0], cfg.trainable_layers)
    if lora.enabled:
        rm = add_lora(rm, lora, "SEQ_CLS")
    return rm.to(run.torch_device), tok


def heldout_metrics(rd: RunDir, held_pairs: dict[str, list] | None, score: Score) -> dict[str, Any]:
    """Held-out accuracy of `score`: on a user file's held-out pairs, or on the preferences stage's held-out
    groups (pairs of different gold, with the correlation to gold); empty when there is neither."""
    if held_pairs is not None:  # a tie (soft label 1/2, e.g. from `label`) has no right answer: not counted
        labels = held_pairs.get("label") or [1.0] * len(held_pairs["prompt"])
        decided = {c: [v for v, y in zip(col, labels) if y != TIE_LABEL] for c, col in held_pairs.items()}
        if not decided["prompt"]:
            return {}
        return {f"heldout_{k}": v for k, v in pair_accuracy(score, decided).items()}
    held = rd.load_json(rd.preferences_eval)
    if held is None:
        return {}
    return {
        f"heldout_{k}": v
        for k, v in pairwise_accuracy(score, held["prompts"], held["responses"], held["scores"]).items()
    }


def train_members(
    run: RunConfig, cfg: RewardConfig, lora: LoraConfig, pairs: dict[str, list], ref: dict[str, list]
) -> tuple[list[Any], Any, list[dict[str, Any]]]:
    """`(members, tokenizer, each one's training figures)`: one reward model per `member_seeds` entry, normalized on
    the reference samples; each records the digest of its initial weights (`reward_init`, WARM's check)."""
    members, histories, tok = [], [], None
    for seeds in member_seeds(run.seed, cfg):
        torch.manual_seed(seeds.init)  # the head (and LoRA adapters) draw from it
        rm, tok = start_reward_model(run, cfg, lora)
        if not members:  # the pairs must fit the model: checked before any training
            where = run.preferences_file or str(run.dir.preferences)
            check_fits(encode_prompts(tok, pairs["prompt"]), context_length(rm.config), 2, "preference")
            check_pairs_fit(tok, pairs, context_length(rm.config), where)
        init = weights_digest(rm)
        train_pairs = bootstrap_pairs(pairs, seeds.order) if cfg.bootstrap else pairs
        with autocast(run.torch_device):
            history = train_reward_model(rm, tok, train_pairs, cfg, seeds.order, run.progress)
        rm = merged_copy(rm)  # LoRA adapters folded in: a plain transformers model from here on
        rm.config.reward_init = init
        mean, std = set_normalization(rm, tok, ref["prompts"], ref["responses"])
        members.append(rm)
        histories.append({**history, "norm_mean": mean, "norm_std": std, "init_seed": seeds.init})
    return members, tok, histories


def load_members(path: Path) -> tuple[list[Any], Any, list[str]]:
    """`(models, tokenizer, names)` of an ensemble directory's members (checked as every stage loads them: present,
    one tokenizer), for `--warm_from`."""
    if not is_ensemble(path):
        raise UserError(
            f"--warm_from needs an ensemble directory (with {ENSEMBLE_FILE}), and {path} is not one; train it "
            "with reward --ensemble K --shared_init --reward_dir NAME"
        )
    dirs = member_dirs(path)
    ensemble = load_scored_reward(path, load_tokenizer(dirs[0]), reads="text")
    return [m.model for m in ensemble.members], ensemble.members[0].tok, [d.name for d in dirs]


def train_reward(run: RunConfig, cfg: RewardConfig, lora: LoraConfig | None = None) -> dict[str, Any]:
    """The reward stage without the run directory's lock (`stage_reward` holds it; `compare` already does): one
    reward model, an ensemble (`--ensemble K`) or a weight average (`--warm K`, `--warm_from DIR`), written
    to the run's `--reward_dir` with held-out accuracy (per member and combined)."""
    run.start()
    rd = run.dir
    rd.check_reward_target()
    lora = lora_settings(lora)
    if run.reward_objective != "mean" and cfg.ensemble < 2:
        raise UserError(
            f"--reward_objective {run.reward_objective} combines an ensemble's members; pass --ensemble 5 (or "
            "more than 1), or --reward_objective mean"
        )
    pairs = rd.load_preferences(run.preferences_file)
    held_pairs = None
    if run.preferences_file and run.heldout_fraction > 0:  # a user's file: hold out a seeded share of its prompts
        pairs, held_pairs = split_pairs(pairs, run.heldout_fraction, run.seed)
        if not held_pairs["prompt"] or not pairs["prompt"]:
            raise UserError(
                f"{run.preferences_file} has too few prompts to hold out {run.heldout_fraction:.0%} of "
                "them; add pairs or pass --heldout_fraction 0"
            )
    # Normalize on reference samples (one SFT sample per prompt) when the preferences stage wrote them; on a
    # user's file, on both sides of its training pairs.
    ref = rd.load_json(rd.reference_samples) or {
        "prompts": pairs["prompt"] * 2,
        "responses": pairs["chosen"] + pairs["rejected"],
    }
    if cfg.warm_from:
        members, tok, names = load_members(rd.under_run(cfg.warm_from))
        histories: list[dict[str, Any]] = [{} for _ in members]
    else:
        members, tok, histories = train_members(run, cfg, lora, pairs, ref)
        names = [f"member_{i}" for i in range(len(members))]
    heldout = lambda score: heldout_metrics(rd, held_pairs, score)  # noqa: E731
    metrics: dict[str, Any] = {"stage": "reward", "pairs": len(pairs["prompt"]), "reward_dir": str(rd.reward_model)}
    # where the pairs came from: the report words its alarms for a reward model of a user's own labels
    labels = run.preferences_file is not None and is_label_log(run.preferences_file)
    metrics["preferences"] = "labels" if labels else "file" if run.preferences_file else "generated"
    ensemble = ScoredReward([RewardModel(m, tok, reads_ids=False) for m in members])
    scores = MemberScores(ensemble)  # each held-out reply scored once by each member
    if len(members) > 1:  # each member's figures, then what they make together
        metrics["members"] = [
            {"name": n, **h, **heldout(scores.member(i))} for i, (n, h) in enumerate(zip(names, histories))
        ]
    if cfg.ensemble > 1:
        for objective in OBJECTIVES:
            under = replace(ensemble, objective=objective, coef=run.uncertainty_coef)
            metrics[f"ensemble_{objective}"] = heldout(scores.under(under))
        metrics.update(metrics[f"ensemble_{run.reward_objective}"])
        info = {"init": "shared" if cfg.shared_init else "seeded", "bootstrap": cfg.bootstrap, "seed": run.seed}
        if is_main():
            save_ensemble(rd.reward_model, members, tok, info)
    else:
        rm = members[0]
        if len(members) > 1:  # WARM: one model whose weights are the members' mean
            rm = average_weights(members, names)
            metrics["norm_mean"], metrics["norm_std"] = set_normalization(rm, tok, ref["prompts"], ref["responses"])
            metrics["warm_members"] = len(members)
        metrics.update(heldout(scorer(rm, tok)))
        rd.save_model(rd.reward_model, rm, tok)
    if len(members) == 1:
        metrics.update(histories[0])
    metrics["config"] = {**asdict(cfg), **asdict(lora)}
    rd.save_json(rd.reward_report, metrics)
    return metrics


stage_reward = writes_run_dir(train_reward)
