"""The stages of the toy RLHF pipeline, each reading and writing one run directory.

    run_dir/tokenizer/          stage 1: BPE tokenizer (transformers format)
    run_dir/sft/                stage 2: SFT model + tokenizer (`save_pretrained`); sft.json: losses, floor
    run_dir/preferences/        stage 3: `datasets.Dataset` of prompt/chosen/rejected (+ gold scores, label)
    run_dir/preferences_eval.json   held-out groups of samples with gold scores, for reward-model evaluation
    run_dir/reward_model/       stage 4: scalar-head model + tokenizer; reward.json: accuracy, correlation
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from rlhf_toy.errors import UserError
from rlhf_toy.io import atomic_dir, atomic_write_json
from rlhf_toy.seeding import seed_everything

from .chat import check_tokenizer_matches, load_tokenizer, train_tokenizer
from .model import ModelConfig, check_fits, encode_prompts, new_causal_lm
from .preferences import PreferenceConfig, check_preferences, pairs_from_groups, sample_groups
from .reward import RewardConfig, pairwise_accuracy, reward_model_from_sft, set_normalization, train_reward_model
from .sampling import sample
from .sft import SFTConfig, encode_pairs, train_sft
from .tasks import Task, get_task, load_table, on_topic


@dataclass
class RunConfig:
    """Where a run lives and what it trains on."""

    run_dir: str = field(default="runs/helpdesk", metadata={"help": "Directory of the run (all stages)."})
    task: str = field(default="helpdesk", metadata={"help": "Built-in task: helpdesk or chatterbot."})
    data: str | None = field(default=None, metadata={"help": "Your own prompt/response file (JSONL, CSV, parquet)."})
    preferences_file: str | None = field(default=None, metadata={
        "help": "Your own preference file (prompt/chosen/rejected) for the reward stage."})
    judge: str | None = field(default=None, metadata={"help": "Gold judge as module:function (text -> float)."})
    seed: int = field(default=0, metadata={"help": "Seed of every stage."})
    threads: int = field(default=2, metadata={"help": "torch threads."})
    max_train_pairs: int | None = field(default=None, metadata={"help": "Use only this many SFT pairs (quick runs)."})
    progress: bool = field(default=True, metadata={"help": "Show progress bars."})

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise UserError(f"threads must be >= 1 (got {self.threads})")
        if self.max_train_pairs is not None and self.max_train_pairs < 1:
            raise UserError(f"max_train_pairs must be >= 1 (got {self.max_train_pairs})")

    @property
    def path(self) -> Path:
        return Path(self.run_dir)

    def start(self) -> Task:
        quiet_libraries()
        seed_everything(self.seed, self.threads)
        task = get_task(self.task, self.data, self.judge, self.seed)
        if self.max_train_pairs is not None:
            task.train = task.train[: self.max_train_pairs]
        return task


def quiet_libraries() -> None:
    """No load reports or per-shard progress bars from transformers/datasets: our own bars say enough."""
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()


@dataclass
class TokenizerConfig:
    vocab_size: int = field(default=1024, metadata={"help": "BPE vocabulary size (special tokens included)."})

    def __post_init__(self) -> None:
        if self.vocab_size < 300:
            raise UserError(f"vocab_size must be >= 300 (got {self.vocab_size}): byte-level BPE needs 256 + merges")


def stage_tokenizer(run: RunConfig, cfg: TokenizerConfig) -> dict[str, Any]:
    task = run.start()
    texts = [p for p, _ in task.train] + [r for _, r in task.train]
    with atomic_dir(run.path / "tokenizer") as tmp:
        tok = train_tokenizer(texts, cfg.vocab_size, tmp)
    return {"stage": "tokenizer", "vocab": len(tok), "pad": tok.pad_token_id, "eos": tok.eos_token_id}


def entropy_floor(task: Task, eval_ids) -> float | None:
    """The data's own loss floor per response token, if the task knows its entropy."""
    if task.entropy_floor_nats is None:
        return None
    return task.entropy_floor_nats * len(eval_ids) / sum(len(r) for _, r in eval_ids)


def on_topic_rate(prompts: list[str], responses: list[str]) -> float:
    return sum(on_topic(p, r) for p, r in zip(prompts, responses)) / max(1, len(prompts))


def stage_sft(run: RunConfig, model_cfg: ModelConfig, cfg: SFTConfig) -> dict[str, Any]:
    task = run.start()
    tok = load_tokenizer(run.path / "tokenizer")
    if run.data:  # your own data: a prompt that cannot fit is an error, not something to drop quietly
        check_fits(encode_prompts(tok, [p for p, _ in task.train + task.eval]), model_cfg.n_positions, 4, "--data")
    train_ids, dropped = encode_pairs(tok, task.train, model_cfg.n_positions)
    eval_ids, _ = encode_pairs(tok, task.eval, model_cfg.n_positions)
    check_fits(encode_prompts(tok, task.eval_prompts), model_cfg.n_positions, 4, "held-out")
    model = new_causal_lm(tok, model_cfg, run.seed)
    history = train_sft(model, tok, train_ids, eval_ids, cfg, run.seed, run.progress)
    torch.manual_seed(run.seed)
    prompts = task.eval_prompts[:200]
    s = sample(model, tok, prompts, max_new_tokens=model_cfg.n_positions // 2)
    floor = entropy_floor(task, eval_ids)
    metrics = {
        "stage": "sft", "params": sum(p.numel() for p in model.parameters()), "train_pairs": len(train_ids),
        "dropped_pairs_too_long": dropped, "eval_loss": history["eval_loss"][-1], "entropy_floor": floor,
        "loss_over_floor": None if floor is None else history["eval_loss"][-1] / floor,
        "gold_mean": sum(task.judge(s.prompts, s.texts)) / len(prompts), "eos_rate": float(s.eos.float().mean()),
        "on_topic_rate": on_topic_rate(s.prompts, s.texts) if task.has_topic else None,
        "samples": [{"prompt": p, "response": r} for p, r in list(zip(s.prompts, s.texts))[:5]],
        "history": history, "config": {**asdict(model_cfg), **asdict(cfg)},
    }
    with atomic_dir(run.path / "sft") as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    atomic_write_json(run.path / "sft.json", metrics)
    return metrics


def load_causal_lm(path: Path, what: str):
    from transformers import AutoModelForCausalLM

    if not (path / "config.json").is_file():
        raise UserError(f"no {what} model in {path}; run the earlier stage first (or pass the right --run_dir)")
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    check_tokenizer_matches(tok, model, what)
    return model, tok


def stage_preferences(run: RunConfig, cfg: PreferenceConfig) -> dict[str, Any]:
    from datasets import Dataset

    task = run.start()
    model, tok = load_causal_lm(run.path / "sft", "SFT")
    prompts = task.train_prompts[: cfg.n_prompts]
    check_fits(encode_prompts(tok, prompts), model.config.n_positions, cfg.max_new_tokens, "training")
    t0 = time.perf_counter()
    groups = sample_groups(model, tok, prompts, task.judge, cfg, run.seed)
    rows = pairs_from_groups(groups, cfg, run.seed)
    # Held-out groups are plain SFT samples (no swapped replies): the accuracy reported is on what PPO meets.
    held = sample_groups(model, tok, task.eval_prompts[: cfg.n_eval_prompts], task.judge,
                         replace(cfg, offtopic_fraction=0.0), run.seed + 1)
    ds = Dataset.from_dict(rows)
    check_preferences(ds, "the sampled preference set")
    with atomic_dir(run.path / "preferences") as tmp:
        ds.save_to_disk(str(tmp))
    atomic_write_json(run.path / "preferences_eval.json", {"prompts": held.prompts, "responses": held.responses,
                                                            "scores": held.scores})
    # Reference samples for the reward model's normalization: the first SFT sample of every group.
    atomic_write_json(run.path / "reference_samples.json",
                      {"prompts": groups.prompts, "responses": [g[0] for g in groups.responses]})
    gold = [x for g in groups.scores for x in g]
    metrics = {"stage": "preferences", "prompts": len(prompts), "k": cfg.k, "pairs": len(ds),
               "pairs_per_sample": len(ds) / (len(prompts) * cfg.k), "gold_mean": sum(gold) / len(gold),
               "wall_s": time.perf_counter() - t0, "config": asdict(cfg)}
    atomic_write_json(run.path / "preferences.json", metrics)
    return metrics


def load_preferences(run: RunConfig):
    from datasets import load_from_disk

    if run.preferences_file:
        ds = load_table(run.preferences_file)
        where = run.preferences_file
    else:
        path = run.path / "preferences"
        if not path.is_dir():
            raise UserError(f"no preferences in {path}; run the 'preferences' stage first or pass --preferences_file")
        ds, where = load_from_disk(str(path)), str(path)
    check_preferences(ds, where)
    return {c: ds[c] for c in ds.column_names if c in ("prompt", "chosen", "rejected", "label")}


def stage_reward(run: RunConfig, cfg: RewardConfig) -> dict[str, Any]:
    run.start()
    pairs = load_preferences(run)
    sft, tok = load_causal_lm(run.path / "sft", "SFT")
    check_fits(encode_prompts(tok, pairs["prompt"]), sft.config.n_positions, 2, "preference")
    rm = reward_model_from_sft(str(run.path / "sft"), tok)
    check_tokenizer_matches(tok, rm, "reward model")
    history = train_reward_model(rm, tok, pairs, cfg, run.seed, run.progress)
    ref_path = run.path / "reference_samples.json"
    ref = json.loads(ref_path.read_text()) if ref_path.is_file() else {"prompts": pairs["prompt"],
                                                                         "responses": pairs["chosen"]}
    mean, std = set_normalization(rm, tok, ref["prompts"], ref["responses"])
    metrics: dict[str, Any] = {"stage": "reward", "pairs": len(pairs["prompt"]), "norm_mean": mean, "norm_std": std,
                               **history, "config": asdict(cfg)}
    held_path = run.path / "preferences_eval.json"
    if held_path.is_file():
        held = json.loads(held_path.read_text())
        metrics.update({f"heldout_{k}": v for k, v in
                        pairwise_accuracy(rm, tok, held["prompts"], held["responses"], held["scores"]).items()})
    with atomic_dir(run.path / "reward_model") as tmp:
        rm.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    atomic_write_json(run.path / "reward.json", metrics)
    return metrics
