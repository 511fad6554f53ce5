"""The lesson's warning, shown: PPO at several KL coefficients against the gold judge (Gao et al. 2022).

Runs PPO from the same SFT model and reward model with beta 0, a small beta and the default beta, and plots
the reward-model score and the gold score of the training batches against sqrt(KL to the reference), beside
best-of-n from the SFT model (KL = log n - (n - 1) / n). The proxy keeps rising; where the gold score stops
following it, the policy is exploiting the reward model rather than getting better.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlhf_toy.errors import UserError
from rlhf_toy.io import atomic_write_json, atomic_write_text
from rlhf_toy.logging import plt_module, read_jsonl, save_figure

from .evaluate import evaluate_best_of_n
from .pipeline import RunConfig, load_causal_lm
from .rlhf import LM_PPO, RLHFConfig
from .stages_rl import ResumeConfig, load_reward_model, stage_ppo


@dataclass
class OveroptConfig:
    betas: str = field(default="0,0.03,0.1", metadata={"help": "Comma-separated KL coefficients to run."})
    steps: int = field(default=100, metadata={"help": "PPO steps per run."})
    best_of: str = field(default="1,2,4,8,16,32,64", metadata={"help": "n for the best-of-n curve."})
    eval_prompts: int = field(default=200, metadata={"help": "Held-out prompts for best-of-n."})

    def parsed(self) -> tuple[list[float], list[int]]:
        try:
            betas = [float(x) for x in self.betas.split(",")]
            ns = [int(x) for x in self.best_of.split(",")]
        except ValueError:
            raise UserError("betas and best_of must be comma-separated numbers") from None
        if any(b < 0 for b in betas) or any(n < 1 for n in ns) or self.steps < 1:
            raise UserError("betas must be >= 0, best_of values >= 1 and steps >= 1")
        return betas, ns


def smooth(x: list[float], k: int = 5) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    return np.convolve(np.pad(x, (k // 2, k - 1 - k // 2), mode="edge"), np.ones(k) / k, mode="valid")


def run_overoptimization(run: RunConfig, cfg: OveroptConfig) -> dict[str, Any]:
    betas, ns = cfg.parsed()
    task = run.start()
    sft, tok = load_causal_lm(run.path / "sft", "SFT")
    rm = load_reward_model(run.path / "reward_model", tok)
    bon = evaluate_best_of_n(sft, rm, tok, task, task.eval_prompts[: cfg.eval_prompts], ns, 1.0, 32, run.seed)
    curves: dict[str, Any] = {"best_of_n": [{k: r[k] for k in ("name", "kl", "gold", "rm_score")} for r in bon]}
    samples: dict[str, list[str]] = {}
    for beta in betas:
        out = run.path / f"overopt_beta{beta:g}"
        stage_ppo(run, RLHFConfig(steps=cfg.steps, kl_coef=beta, save_every=0), LM_PPO,
                  ResumeConfig(ppo_dir=str(out)))
        rows = read_jsonl(out / "metrics.jsonl")
        curves[f"beta={beta:g}"] = [{k: r.get(k) for k in ("step", "kl", "score", "gold")} for r in rows]
        samples[f"beta={beta:g}"] = json.loads((out / "samples.json").read_text()) if (out / "samples.json").exists() \
            else []
    atomic_write_json(run.path / "overoptimization.json", curves)
    plot_overoptimization(curves, run.path / "overoptimization.png")
    lines = ["| run | final KL | final RM score | final gold | peak gold (step) |", "| --- | --- | --- | --- | --- |"]
    for name, rows in curves.items():
        if name == "best_of_n":
            continue
        gold = smooth([r["gold"] for r in rows])
        peak = int(np.argmax(gold))
        lines.append(f"| {name} | {rows[-1]['kl']:.2f} | {rows[-1]['score']:.2f} | {rows[-1]['gold']:.2f} | "
                     f"{gold[peak]:.2f} ({rows[peak]['step']}) |")
    table = "\n".join(lines) + "\n"
    atomic_write_text(run.path / "overoptimization.md", table)
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
        x = np.sqrt(np.clip(smooth([r["kl"] for r in rows]), 0, None))
        axes[0].plot(x, smooth([r["score"] for r in rows]), label=f"PPO {name}")
        axes[1].plot(x, smooth([r["gold"] for r in rows]), label=f"PPO {name}")
    axes[0].set(xlabel="sqrt(KL to reference)", ylabel="reward-model score (proxy)", title="What PPO optimizes")
    axes[1].set(xlabel="sqrt(KL to reference)", ylabel="gold score (VADER, -1 off topic)", title="What we wanted")
    for ax in axes:
        ax.legend(fontsize=8)
    save_figure(fig, path)
