"""The lesson's warning, shown: PPO at several KL coefficients against the gold judge (Gao et al. 2022).

Runs PPO from the same SFT model and reward model with each beta of `--betas` (default 0, 0.03 and 0.1), and
plots the reward-model score and the gold score of the training batches against sqrt(KL to the reference),
beside best-of-n from the SFT model (KL = log n - (n - 1) / n). The proxy keeps rising; where the gold score
stops following it, the policy is exploiting the reward model rather than getting better.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlhf_toy.config import check, derived, option, parse_list
from rlhf_toy.logging import markdown_table, moving_average, plt_module, read_jsonl, save_figure

from ..algorithms.rlhf import LM_PPO, RLHFConfig
from .evaluate import evaluate_best_of_n
from .stages import ResumeConfig, RunConfig, stage_ppo, writes_run_dir

SMOOTH = 5  # training-batch curves are noisy: plot and rank the trailing mean of 5 steps


@dataclass
class OveroptConfig:
    betas: str = option("Comma-separated KL coefficients to run.", "0,0.03,0.1")
    steps: int = option("PPO steps per run.", 100)
    best_of: str = option("n for the best-of-n curve.", "1,2,4,8,16,32,64")
    eval_prompts: int = option("Held-out prompts for best-of-n.", 200)
    beta_values: list[float] = derived()
    best_of_ns: list[int] = derived()

    def __post_init__(self) -> None:
        self.beta_values = parse_list("betas", self.betas, float, "numbers >= 0")
        check(all(b >= 0 for b in self.beta_values), "betas", self.betas, "comma-separated numbers >= 0")
        self.best_of_ns = parse_list("best_of", self.best_of, int, "integers >= 1")
        check(all(n >= 1 for n in self.best_of_ns), "best_of", self.best_of, "comma-separated integers >= 1")
        check(self.steps >= 1, "steps", self.steps, ">= 1")
        check(self.eval_prompts >= 1, "eval_prompts", self.eval_prompts, ">= 1")


@writes_run_dir
def run_overoptimization(run: RunConfig, cfg: OveroptConfig) -> dict[str, Any]:
    task = run.start()
    rd = run.dir
    sft, tok = rd.load_sft()
    rm = rd.load_reward_model(tok)
    bon = evaluate_best_of_n(sft, rm, tok, task, task.eval_prompts[: cfg.eval_prompts], cfg.best_of_ns, 1.0, 32,
                             run.seed)
    curves: dict[str, Any] = {"best_of_n": [{k: r[k] for k in ("name", "kl", "gold", "rm_score")} for r in bon]}
    for beta in cfg.beta_values:
        out = rd.ppo(f"overopt_beta{beta:g}")
        stage_ppo(run, RLHFConfig(steps=cfg.steps, kl_coef=beta, save_every=0), LM_PPO,
                  ResumeConfig(ppo_dir=str(out.path)))
        curves[f"beta={beta:g}"] = [{"step": r["step"], "kl": r["objective/kl"], "score": r["objective/score"],
                                     "gold": r.get("objective/gold")} for r in read_jsonl(out.metrics)]
    rd.save_json(rd.report("overoptimization.json"), curves)
    plot_overoptimization(curves, rd.report("overoptimization.png"))
    rows = []
    for name, steps in curves.items():
        if name == "best_of_n":
            continue
        gold = moving_average([r["gold"] for r in steps], SMOOTH)
        peak = int(np.argmax(gold))
        last = steps[-1]
        rows.append([name, f"{last['kl']:.2f}", f"{last['score']:.2f}", f"{last['gold']:.2f}",
                     f"{gold[peak]:.2f} ({steps[peak]['step']})"])
    table = markdown_table(["run", "final KL", "final RM score", "final gold", "peak gold (step)"], rows)
    rd.save_text(rd.report("overoptimization.md"), table)
    print(table)
    return curves


def plot_overoptimization(curves: dict[str, Any], path: Path) -> None:
    plt = plt_module()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    for name, rows in curves.items():
        if name == "best_of_n":
            x = [math.sqrt(max(r["kl"], 0.0)) for r in rows]
            axes[0].plot(x, [r["rm_score"] for r in rows], "k--o", ms=3, label="best-of-n")
            axes[1].plot(x, [r["gold"] for r in rows], "k--o", ms=3, label="best-of-n")
            continue
        x = np.sqrt(np.clip(moving_average([r["kl"] for r in rows], SMOOTH), 0, None))
        axes[0].plot(x, moving_average([r["score"] for r in rows], SMOOTH), label=f"PPO {name}")
        axes[1].plot(x, moving_average([r["gold"] for r in rows], SMOOTH), label=f"PPO {name}")
    axes[0].set(xlabel="sqrt(KL to reference)", ylabel="reward-model score (proxy)", title="What PPO optimizes")
    axes[1].set(xlabel="sqrt(KL to reference)", ylabel="gold score (VADER, -1 off topic)", title="What we wanted")
    for ax in axes:
        ax.legend(fontsize=8)
    save_figure(fig, path)
