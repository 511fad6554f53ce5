"""Part 2 stages: PPO against the reward model (`ppo`), the evaluation table (`evaluate`), and `all`.

    run_dir/ppo/policy/            the fine-tuned policy (plain AutoModelForCausalLM.from_pretrained loads it)
    run_dir/ppo/trainer_state.pt   value head, optimizer, beta, KL average, RNG states: for --resume
    run_dir/ppo/metrics.jsonl, curves.png, ppo.json
    run_dir/eval.md, eval.json     SFT vs best-of-n vs PPO on held-out prompts
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rlhf_toy.errors import UserError
from rlhf_toy.io import atomic_dir, atomic_torch_save, atomic_write_json, atomic_write_text
from rlhf_toy.logging import MetricLogger, plt_module, read_jsonl, save_figure
from rlhf_toy.ppo import PPOConfig

from .evaluate import evaluate_best_of_n, evaluate_policy, markdown
from .pipeline import RunConfig, load_causal_lm
from .rlhf import RLHFConfig, RLHFTrainer


def load_reward_model(path: Path, tok):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if not (path / "config.json").is_file():
        raise UserError(f"no reward model in {path}; run the 'reward' stage first (or pass the right --run_dir)")
    rm_tok = AutoTokenizer.from_pretrained(str(path))
    if rm_tok.get_vocab() != tok.get_vocab() or rm_tok.pad_token_id != tok.pad_token_id:
        raise UserError(f"the reward model's tokenizer in {path} does not match the policy's; train the reward model "
                        "from this run's SFT model")
    return AutoModelForSequenceClassification.from_pretrained(str(path)).eval()


@dataclass
class ResumeConfig:
    resume: bool = field(default=False, metadata={"help": "Continue from run_dir/ppo's last checkpoint."})
    ppo_dir: str | None = field(default=None, metadata={"help": "Output directory (default: run_dir/ppo)."})


def save_checkpoint(trainer: RLHFTrainer, out: Path) -> None:
    with atomic_dir(out / "policy") as tmp:
        trainer.policy.lm.save_pretrained(tmp)
        trainer.tok.save_pretrained(tmp)
    atomic_torch_save(trainer.state(), out / "trainer_state.pt")


def plot_ppo_curves(rows: list[dict[str, Any]], path: Path) -> None:
    plt = plt_module()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    steps = [r["step"] for r in rows]
    axes[0].plot(steps, [r["score"] for r in rows], label="reward model")
    if "gold" in rows[0]:
        axes[0].plot(steps, [r["gold"] for r in rows], label="gold")
    axes[0].set(xlabel="step", title="score")
    axes[0].legend(fontsize=8)
    axes[1].plot(steps, [r["kl"] for r in rows])
    axes[1].set(xlabel="step", title="KL to reference (nats)")
    axes[2].plot(steps, [r["response_length"] for r in rows])
    axes[2].set(xlabel="step", title="response length (tokens)")
    save_figure(fig, path)


def stage_ppo(run: RunConfig, cfg: RLHFConfig, ppo: PPOConfig, resume: ResumeConfig) -> dict[str, Any]:
    task = run.start()
    out = Path(resume.ppo_dir) if resume.ppo_dir else run.path / "ppo"
    state = None
    if resume.resume:
        if not (out / "trainer_state.pt").is_file() or not (out / "policy" / "config.json").is_file():
            raise UserError(f"nothing to resume in {out}: no checkpoint (policy/ and trainer_state.pt); "
                            "run without --resume first")
        state = torch.load(out / "trainer_state.pt", weights_only=False)
        policy_dir = out / "policy"
    else:
        policy_dir = run.path / "sft"
    model, tok = load_causal_lm(policy_dir, "policy")
    ref_model, _ = load_causal_lm(run.path / "sft", "reference")
    rm = load_reward_model(run.path / "reward_model", tok)
    trainer = RLHFTrainer(model, rm, tok, cfg, ppo, task.train_prompts, run.seed, judge=task.judge,
                          ref_model=ref_model)
    if state is not None:
        trainer.load_state(state)
    logger_rows = read_jsonl(out / "metrics.jsonl") if state is not None and (out / "metrics.jsonl").exists() else []
    logger_rows = [r for r in logger_rows if r["step"] <= trainer.step_count]
    logger = MetricLogger(out, tensorboard=True)
    for r in logger_rows:  # keep the history up to the checkpoint when resuming
        logger.log(r["step"], {k: v for k, v in r.items() if k != "step"})
    t0 = time.perf_counter()
    bar = tqdm(total=cfg.steps, initial=trainer.step_count, desc="ppo", disable=not run.progress, leave=False)
    try:
        while trainer.step_count < cfg.steps and not trainer.stopped_by_kl_limit:
            m = trainer.step()
            logger.log(m["step"], m)
            logger_rows.append(m)
            bar.update(1)
            bar.set_postfix(score=f"{m['score']:.2f}", gold=f"{m.get('gold', 0):.2f}", kl=f"{m['kl']:.2f}",
                            refresh=False)
            if cfg.save_every and trainer.step_count % cfg.save_every == 0:
                save_checkpoint(trainer, out)
    finally:
        bar.close()
        logger.close()
    save_checkpoint(trainer, out)
    atomic_write_json(out / "samples.json", trainer.last_samples)
    plot_ppo_curves(logger_rows, out / "curves.png")
    last = logger_rows[-1] if logger_rows else {}
    step_s = sum(r["time/step_s"] for r in logger_rows)
    summary = {"stage": "ppo", "steps": trainer.step_count, "wall_s": time.perf_counter() - t0,
               "stopped_by_kl_limit": trainer.stopped_by_kl_limit, "final_score": last.get("score"),
               "final_gold": last.get("gold"), "final_kl": last.get("kl"), "final_beta": last.get("beta"),
               "episodes_per_s": cfg.batch_size * len(logger_rows) / max(1e-9, step_s),
               "config": asdict(cfg), "ppo": ppo.to_dict()}
    atomic_write_json(out / "ppo.json", summary)
    return summary


@dataclass
class EvalConfig:
    eval_prompts: int = field(default=200, metadata={"help": "Held-out prompts to evaluate on."})
    best_of: str = field(default="4,16,64", metadata={"help": "Comma-separated n for best-of-n baselines."})
    policies: str = field(default="ppo", metadata={"help": "Comma-separated PPO output dirs under run_dir."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature for every model."})
    max_new_tokens: int = field(default=32, metadata={"help": "Longest response."})

    def ns(self) -> list[int]:
        try:
            ns = [int(x) for x in self.best_of.split(",") if x.strip()]
        except ValueError:
            raise UserError(f"best_of must be comma-separated integers (got {self.best_of!r})") from None
        if any(n < 1 for n in ns):
            raise UserError(f"best_of values must be >= 1 (got {self.best_of!r})")
        return ns


def stage_evaluate(run: RunConfig, cfg: EvalConfig) -> dict[str, Any]:
    task = run.start()
    sft, tok = load_causal_lm(run.path / "sft", "SFT")
    rm = load_reward_model(run.path / "reward_model", tok)
    prompts = task.eval_prompts[: cfg.eval_prompts]
    rows = [evaluate_policy("SFT", sft, sft, rm, tok, task, prompts, cfg.temperature, cfg.max_new_tokens, run.seed)]
    if cfg.ns():
        rows += evaluate_best_of_n(sft, rm, tok, task, prompts, cfg.ns(), cfg.temperature, cfg.max_new_tokens,
                                   run.seed)
    for name in [p for p in cfg.policies.split(",") if p.strip()]:
        path = run.path / name / "policy"
        if path.is_dir():
            policy, _ = load_causal_lm(path, f"PPO policy '{name}'")
            rows.append(evaluate_policy(f"PPO ({name})", policy, sft, rm, tok, task, prompts, cfg.temperature,
                                        cfg.max_new_tokens, run.seed))
    table = markdown(rows)
    atomic_write_text(run.path / "eval.md", table)
    atomic_write_json(run.path / "eval.json", {"rows": rows, "prompts": len(prompts)})
    print(table)
    return {"stage": "evaluate", "rows": {r["name"]: {k: r[k] for k in ("gold", "rm_score", "kl", "on_topic")}
                                          for r in rows}}
