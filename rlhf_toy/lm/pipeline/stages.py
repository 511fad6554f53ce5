"""The RLHF pipeline's stages, in order: tokenizer, SFT, preferences, reward model (`reward_stage.py`), PPO,
evaluation.

Each stage is one function `stage_NAME(run, *configs) -> metrics`: it reads what the earlier stages wrote in
the run directory and writes its own outputs there (every load and save goes through `RunDir`; the layout is
in `rundir.py`). The CLI (`cli.py`) maps each command to one of these functions.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset

from rlhf_toy.config import check, derived, option, parse_list
from rlhf_toy.errors import UserError

from ..algorithms.dpo import DPOConfig, train_dpo
from ..algorithms.dpo import pairs_from_groups as dpo_pairs_from_groups
from ..algorithms.online import label as algorithm_label
from ..algorithms.sft import SFTConfig, encode_pairs, train_sft
from ..data.preferences import Groups, PreferenceConfig, check_preferences, group_replies, pairs_from_groups
from ..data.tasks import Task
from ..models.base import context_length, load_base, resolve_base_model
from ..models.causal_lm import ModelConfig, new_causal_lm
from ..models.chat import (
    check_fits,
    check_pairs_fit,
    encode_prompts,
    train_tokenizer,
)
from ..models.devices import autocast
from ..models.lora import LoraConfig, add_lora, lora_settings
from ..models.reward_ensemble import is_ensemble
from ..models.sampling import sample
from .evaluate import evaluate_best_of_n, evaluate_policy, evaluation_table
from .run import RunConfig, writes_run_dir
from .rundir import RunDir

# 1. Tokenizer ------------------------------------------------------------------------------------------------


@dataclass
class TokenizerConfig:
    vocab_size: int = option("BPE vocabulary size (special tokens included).", 1024)

    def __post_init__(self) -> None:
        check(self.vocab_size >= 300, "vocab_size", self.vocab_size, ">= 300 (byte-level BPE needs 256 + merges)")


@writes_run_dir
def stage_tokenizer(run: RunConfig, cfg: TokenizerConfig) -> dict[str, Any]:
    if run.base_model:  # nothing to train: the sft stage saves the base model's own tokenizer with it
        return {"stage": "tokenizer", "skipped": f"--base_model {run.base_model} brings its own tokenizer"}
    task = run.start()
    texts = [p for p, _ in task.train] + [r for _, r in task.train]
    tok = train_tokenizer(texts, cfg.vocab_size, split_digits=task.checkable)
    run.dir.save_tokenizer(tok)
    return {"stage": "tokenizer", "vocab": len(tok), "pad": tok.pad_token_id, "eos": tok.eos_token_id}


# 2. SFT ------------------------------------------------------------------------------------------------------


def entropy_floor(task: Task, eval_ids) -> float | None:
    """The data's own loss floor per response token, if the task knows its entropy."""
    if task.entropy_floor_nats is None:
        return None
    return task.entropy_floor_nats * len(eval_ids) / sum(len(r) for _, r in eval_ids)


def on_topic_rate(task: Task, prompts: list[str], responses: list[str]) -> float:
    return sum(task.is_on_topic(p, r) for p, r in zip(prompts, responses)) / max(1, len(prompts))


def start_model(run: RunConfig, model_cfg: ModelConfig):
    """`(model on the run's device, tokenizer, context length)`: the base model, or a fresh tiny GPT-2."""
    rd = run.dir
    if run.base_model:
        model, tok = load_base(resolve_base_model(run.base_model, rd.base_model))
        return model.to(run.torch_device), tok, context_length(model.config)
    tok = rd.load_tokenizer()
    return new_causal_lm(tok, model_cfg, run.seed).to(run.torch_device), tok, model_cfg.n_positions


@writes_run_dir
def stage_sft(run: RunConfig, model_cfg: ModelConfig, cfg: SFTConfig) -> dict[str, Any]:
    task = run.start()
    rd = run.dir
    if cfg.epochs == 0 and not run.base_model:
        raise UserError("--epochs 0 (no SFT) needs --base_model: a fresh tiny GPT-2 knows nothing yet")
    model, tok, context = start_model(run, model_cfg)
    if run.data:  # your own data: a prompt that cannot fit is an error, not something to drop quietly
        check_fits(encode_prompts(tok, [p for p, _ in task.train + task.eval]), context, 4, "--data")
    check_fits(encode_prompts(tok, task.eval_prompts), context, 4, "held-out")
    train_ids, dropped, history = [], 0, {"eval_loss": [None]}
    if cfg.epochs > 0:
        train_ids, dropped = encode_pairs(tok, task.train, context)
        # a held-out prompt file without replies (--eval_data for a reward program) has no loss to measure
        eval_ids, _ = encode_pairs(tok, [(p, r) for p, r in task.eval if r], context)
        with autocast(run.torch_device):
            history = train_sft(model, tok, train_ids, eval_ids, cfg, run.seed, run.progress)
    torch.manual_seed(run.seed)
    prompts = task.eval_prompts[: cfg.sample_prompts]
    # as long as asked, within half the context and within what the longest sampled prompt leaves (check_fits
    # above leaves at least 4 tokens)
    room = context - max(len(ids) for ids in encode_prompts(tok, prompts)) - 1
    s = sample(model, tok, prompts, max_new_tokens=max(1, min(context // 2, cfg.sample_tokens, room)))
    floor = entropy_floor(task, eval_ids) if cfg.epochs > 0 else None
    metrics = {
        "stage": "sft",
        "params": sum(p.numel() for p in model.parameters()),
        "train_pairs": len(train_ids),
        "dropped_pairs_too_long": dropped,
        "eval_loss": None if history["eval_loss"][-1] != history["eval_loss"][-1] else history["eval_loss"][-1],
        "entropy_floor": floor,
        "loss_over_floor": None if floor is None else history["eval_loss"][-1] / floor,
        "gold_mean": sum(task.judge(s.prompts, s.texts)) / len(prompts),
        "eos_rate": float(s.eos.float().mean()),
        "on_topic_rate": on_topic_rate(task, s.prompts, s.texts) if task.has_topic else None,
        "samples": [{"prompt": p, "response": r} for p, r in list(zip(s.prompts, s.texts))[:5]],
        "history": history,
        "base_model": run.base_model,
        "config": asdict(cfg) if run.base_model else {**asdict(model_cfg), **asdict(cfg)},
    }
    rd.save_model(rd.sft, model, tok)
    rd.save_json(rd.report("sft.json"), metrics)
    return metrics


# 3. Preferences ----------------------------------------------------------------------------------------------


def sample_groups(model, tok, prompts: list[str], judge, cfg: PreferenceConfig, seed: int) -> Groups:
    """`cfg.k` replies of `model` to each prompt (torch seeded with `seed`), grouped and judged (`group_replies`)."""
    torch.manual_seed(seed)
    texts = sample(model, tok, [p for p in prompts for _ in range(cfg.k)], cfg.max_new_tokens, cfg.temperature).texts
    return group_replies(prompts, texts, judge, cfg, seed)


@writes_run_dir
def stage_preferences(run: RunConfig, cfg: PreferenceConfig) -> dict[str, Any]:
    task = run.start()
    rd = run.dir
    model, tok = rd.load_sft(run.torch_device)
    prompts = task.train_prompts[: cfg.n_prompts]
    check_fits(encode_prompts(tok, prompts), context_length(model.config), cfg.max_new_tokens, "training")
    t0 = time.perf_counter()
    groups = sample_groups(model, tok, prompts, task.judge, cfg, run.seed)
    rows = pairs_from_groups(groups, cfg, run.seed)
    # Held-out groups are plain SFT samples (no swapped replies): the accuracy reported is on what PPO meets.
    held = sample_groups(
        model,
        tok,
        task.eval_prompts[: cfg.n_eval_prompts],
        task.judge,
        replace(cfg, offtopic_fraction=0.0),
        run.seed + 1,
    )
    ds = Dataset.from_dict(rows)
    check_preferences(ds, "the sampled preference set")
    rd.save_preferences(ds)
    rd.save_json(rd.preferences_eval, {"prompts": held.prompts, "responses": held.responses, "scores": held.scores})
    # Reference samples for the reward model's normalization: the first SFT sample of every group.
    rd.save_json(rd.reference_samples, {"prompts": groups.prompts, "responses": [g[0] for g in groups.responses]})
    gold = [x for g in groups.scores for x in g]
    metrics = {
        "stage": "preferences",
        "prompts": len(prompts),
        "k": cfg.k,
        "pairs": len(ds),
        "pairs_per_sample": len(ds) / (len(prompts) * cfg.k),
        "gold_mean": sum(gold) / len(gold),
        "wall_s": time.perf_counter() - t0,
        "config": asdict(cfg),
    }
    rd.save_json(rd.report("preferences.json"), metrics)
    return metrics


# 4. Reward model: reward_stage.py (one model, an ensemble or a WARM average) -------------------------------


# Shared by the policy stages (online and DPO) and the evaluation ------------------------------------------


def task_reward(run: RunConfig, task: Task, tok, device: torch.device, reads: str = "auto"):
    """What scores replies: the task's program (checkable tasks, --reward_fn) or the run's reward model (or
    ensemble) under `--reward_objective` and `--length_penalty`."""
    if task.reward is not None:
        if run.length_penalty or run.reward_objective != "mean":
            raise UserError(
                "--length_penalty and --reward_objective shape a reward model's scores, and this run's reward is "
                "a program; put them in your reward function, or leave them at their defaults"
            )
        return task.reward
    return run.dir.load_reward_model(tok, reads, device, run.reward_objective, run.uncertainty_coef, run.length_penalty)


def reward_kind(run: RunConfig, task: Task) -> str:
    """What a policy run optimizes, as the report's alarms word it (`alarms.REWARD_KINDS`): a program (checkable
    tasks, --reward_fn), an ensemble, a reward model trained on a user's own labels (`label`), or a reward model."""
    if task.reward is not None:
        return "program"
    rd = run.dir
    if is_ensemble(rd.reward_model):
        return "ensemble"
    report = rd.load_json(rd.reward_report) or {}
    return "labels" if report.get("preferences") == "labels" else "reward model"


def start_policy(rd: RunDir, device: torch.device, lora: LoraConfig):
    """`(policy, tokenizer)` of a policy stage: the SFT model, with fresh trainable LoRA adapters if asked for."""
    model, tok = rd.load_sft(device)
    return (add_lora(model, lora, "CAUSAL_LM") if lora.enabled else model), tok


def reference_model(rd: RunDir, device: torch.device, lora: LoraConfig):
    """The frozen reference: a second copy of the SFT model, or None for a LoRA policy (the same network with
    its adapters off: no copy in memory)."""
    return None if lora.enabled else rd.load_sft(device)[0]


# 5. The online policy stage: policy_stage.py (every algorithm of the table) -----------------------------


# 5b. DPO: offline, on the preference pairs -----------------------------------------------------------------


@dataclass
class DPODirConfig:
    policy_dir: str = option("Output directory: a path, or a bare name for run_dir/NAME.", "dpo")


def stage_dpo(run: RunConfig, cfg: DPOConfig, where: DPODirConfig, lora: LoraConfig | None = None) -> dict[str, Any]:
    """DPO from the SFT model on the run's preference pairs (or --preferences_file); reference = the SFT model.
    Held-out: the implicit-reward accuracy on the preferences stage's held-out groups (pairs of different gold)."""
    run.start()
    rd = run.dir
    lora = lora_settings(lora)
    out = rd.policy_dir(where.policy_dir)
    pairs = rd.load_preferences(run.preferences_file)
    with out.lock(), rd.reading():
        out.check_kind("dpo")
        model, tok = start_policy(rd, run.torch_device, lora)
        check_pairs_fit(tok, pairs, context_length(model.config), run.preferences_file or str(rd.preferences))
        ref_model = reference_model(rd, run.torch_device, lora)
        held = rd.load_json(rd.preferences_eval)
        held_pairs = None if held is None else dpo_pairs_from_groups(held["prompts"], held["responses"], held["scores"])
        with autocast(run.torch_device):  # ref_model None (LoRA): the same network with the adapters off
            history = train_dpo(model, ref_model, tok, pairs, cfg, run.seed, held_pairs, run.progress)
        out.save_policy(model, tok)
        summary = {
            "stage": "dpo",
            "algorithm": "dpo",
            "pairs": len(pairs["prompt"]),
            "heldout_pairs": None if held_pairs is None else len(held_pairs["prompt"]),
            **{k: v for k, v in history.items() if k not in ("loss", "train_accuracy")},
            "config": {**asdict(cfg), **asdict(lora)},
        }
        rd.save_json(out.summary, summary)
    return summary


# 6. Evaluation -----------------------------------------------------------------------------------------------


@dataclass
class EvalConfig:
    eval_prompts: int = option("Held-out prompts to evaluate on.", 200)
    best_of: str = option("Comma-separated n for best-of-n baselines (empty: none).", "4,16,64")
    policies: str = option("Comma-separated policy directories under run_dir (ppo, grpo, dpo, ...).", "ppo")
    reference_name: str | None = option(
        "Row name of the reference model (None: SFT, or base with --reference base).", None
    )
    reference: str = option(
        "The first row and the KL reference: sft (the SFT model) or base (--base_model itself; with it the SFT "
        "model is a row of its own).",
        "sft",
    )
    temperature: float = option("Sampling temperature for every model.", 1.0)
    max_new_tokens: int = option("Longest response.", 32)
    pass_k: int = option("Checkable tasks: replies per prompt for pass@1 and pass@k.", 8)
    best_of_ns: list[int] = derived()
    policy_names: list[str] = derived()

    def __post_init__(self) -> None:
        check(self.eval_prompts >= 1, "eval_prompts", self.eval_prompts, ">= 1")
        check(self.temperature > 0, "temperature", self.temperature, "> 0, e.g. 1.0")
        check(self.max_new_tokens >= 1, "max_new_tokens", self.max_new_tokens, ">= 1")
        check(self.pass_k >= 1, "pass_k", self.pass_k, ">= 1")
        check(self.reference in ("sft", "base"), "reference", self.reference, "sft or base")
        self.best_of_ns = parse_list("best_of", self.best_of, int, "integers >= 1") if self.best_of.strip() else []
        check(all(n >= 1 for n in self.best_of_ns), "best_of", self.best_of, "comma-separated integers >= 1")
        self.policy_names = [p.strip() for p in self.policies.split(",") if p.strip()]


@writes_run_dir
def stage_evaluate(run: RunConfig, cfg: EvalConfig) -> dict[str, Any]:
    task = run.start()
    rd = run.dir
    policy_dirs = {name: rd.policy_dir(name) for name in cfg.policy_names}
    missing = [name for name, d in policy_dirs.items() if not (d.policy / "config.json").is_file()]
    if missing:  # fail before sampling anything
        raise UserError(
            f"no trained policy in {', '.join(str(policy_dirs[m].policy) for m in missing)}; run the "
            "'ppo' stage first or pass --policies with existing policy directories ('' for none)"
        )
    if cfg.reference == "base" and not run.base_model:
        raise UserError("--reference base needs --base_model (the model the SFT stage started from)")
    sft, tok = rd.load_sft(run.torch_device)
    ref = sft
    if cfg.reference == "base":  # the SFT stage converted it (a GGUF file) or read it: the same tokenizer
        ref = load_base(resolve_base_model(run.base_model, rd.base_model))[0].to(run.torch_device)
    rm = task_reward(run, task, tok, run.torch_device)
    prompts = task.eval_prompts[: cfg.eval_prompts]
    judged = lambda name, model: evaluate_policy(  # noqa: E731  every row on the same prompts and seed
        name, model, ref, rm, tok, task, prompts, cfg.temperature, cfg.max_new_tokens, run.seed, cfg.pass_k
    )
    rows = [judged(cfg.reference_name or ("SFT" if cfg.reference == "sft" else "base"), ref)]
    if cfg.best_of_ns:
        rows += evaluate_best_of_n(
            ref, rm, tok, task, prompts, cfg.best_of_ns, cfg.temperature, cfg.max_new_tokens, run.seed
        )
    if cfg.reference == "base":
        rows.append(judged("SFT", sft))
    for name, d in policy_dirs.items():
        policy, _ = d.load_policy(name)
        label = f"{algorithm_label(d.load_summary().get('algorithm', 'ppo'))} ({name})"
        rows.append(judged(label, policy.to(run.torch_device)))
    settings = evaluation_settings(run, cfg, len(prompts))
    name = evaluation_file(rd.path, settings)
    table = evaluation_table(rows)
    rd.save_text(rd.report(f"{name}.md"), f"{settings_line(settings)}\n\n{table}")
    rd.save_json(rd.report(f"{name}.json"), {"rows": rows, "prompts": len(prompts), "settings": settings})
    print(table)
    print(f"table in {rd.report(name + '.md')}", file=sys.stderr)
    keys = ("gold", "gold_se", "rm_score", "kl", "on_topic", "accuracy", "accuracy_se", "pass@1", "pass@k")
    return {
        "stage": "evaluate",
        "table": str(rd.report(f"{name}.md")),
        "rows": {r["name"]: {k: r[k] for k in keys if k in r} for r in rows},
    }


def evaluation_settings(run: RunConfig, cfg: EvalConfig, prompts: int) -> dict[str, Any]:
    """What makes one evaluation another: the models compared, the reward and judge, the prompts, the sampling."""
    return {
        "policies": cfg.policy_names,
        "reference": cfg.reference,
        "best_of": cfg.best_of_ns,
        "reward": run.reward_fn or run.reward_dir,
        "judge": run.judge,
        "data": run.data or run.task,
        "prompts": prompts,
        "temperature": cfg.temperature,
        "max_new_tokens": cfg.max_new_tokens,
        "seed": run.seed,
    }


def settings_line(settings: dict[str, Any]) -> str:
    shown = {k: ",".join(map(str, v)) if isinstance(v, list) else v for k, v in settings.items() if v is not None}
    return "Evaluation: " + "; ".join(f"{k} {v}" for k, v in shown.items())


def evaluation_file(run_dir: Path, settings: dict[str, Any]) -> str:
    """Where an evaluation's table goes (without .md/.json): `eval` for the run's first evaluation (its headline
    table) and for a re-run of that one; any other evaluation gets a file named by its policies, reward and data,
    so that no evaluation overwrites another's table."""

    def held(name: str) -> dict[str, Any] | None:
        path = run_dir / f"{name}.json"
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text()).get("settings", {})
        except (ValueError, AttributeError):
            return {}

    if held("eval") in (None, settings):
        return "eval"
    parts = ["+".join(settings["policies"]) or "no-policies", Path(str(settings["reward"])).name, settings["data"]]
    slug = re.sub(r"[^A-Za-z0-9_.+-]+", "-", "_".join(Path(str(p)).stem for p in parts)).strip("-")
    name, i = f"eval-{slug}", 2
    while held(name) not in (None, settings):
        name, i = f"eval-{slug}-{i}", i + 1
    return name
