"""`rlhf-toy agent-compare`: online algorithms on one environment over seeds, success against episodes and wall time.

Each (algorithm, seed) is the `agent` command's own run (the same flags, parsed by the same command: a record's
preset, the environment's settings), in `run_dir/ALGORITHM/seed_N`. Then one figure (sampled success against
episodes and against seconds, the mean over seeds and each seed, with the random, scripted and optimal policies
as reference lines) and one table (held-out greedy success, mean ± standard error over seeds; episodes to a
sampled success of 0.9; seconds): `run_dir/compare.md`, `compare.png`, `compare.json`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlhf_toy.config import check, option, parse_list, parse_names
from rlhf_toy.errors import UserError
from rlhf_toy.io import atomic_write_json, atomic_write_text, read_json
from rlhf_toy.logging import markdown_table, plt_module, read_jsonl, save_figure

from ..algorithms.online import ALGORITHMS, label

COMPARED = ("ppo", "grpo", "rloo", "reinforce_baseline")


@dataclass
class AgentCompareConfig:
    env: str = option("The environment (as the agent command's --env).", "frozenlake")
    algorithms: str = option("Comma-separated online algorithms.", ",".join(COMPARED))
    seeds: str = option("Comma-separated seeds.", "0,1,2")
    run_dir: str = option("Where the runs, the table and the figure go.", "runs/agent-compare")
    steps: int | None = option("RL steps of every run (None: the environment's).", None)
    threads: int = option("torch threads of each run.", 1)
    eval_episodes: int = option("Held-out greedy episodes of each run.", 100)

    def __post_init__(self) -> None:
        self.algorithm_list = parse_names("algorithms", self.algorithms, ALGORITHMS)
        self.seed_list = parse_list("seeds", self.seeds, int, "integers")
        check(self.steps is None or self.steps >= 1, "steps", self.steps, ">= 1")


def run_args(cfg: AgentCompareConfig, algorithm: str, seed: int) -> list[str]:
    out = Path(cfg.run_dir) / algorithm / f"seed_{seed}"
    args = ["--env", cfg.env, "--algorithm", algorithm, "--seed", str(seed), "--run_dir", str(out)]
    args += ["--threads", str(cfg.threads), "--eval_episodes", str(cfg.eval_episodes)]
    return args + (["--steps", str(cfg.steps)] if cfg.steps else [])


def run_one(args: list[str]) -> None:
    """One run exactly as `rlhf-toy agent ARGS` runs it: through the command table itself."""
    from ..pipeline.cli import main  # the table names this module

    main(["agent", *args])


def curves(path: Path) -> dict[str, np.ndarray]:
    rows = read_jsonl(path / "metrics.jsonl", steps=True)
    batch = read_json(path / "agent.json")["settings"]["rl"]["batch_size"]
    return {
        "episodes": np.array([r["step"] * batch for r in rows], dtype=float),
        "seconds": np.cumsum([r["time/step_s"] for r in rows]),
        "success": np.array([r["agent/success"] for r in rows]),
    }


def first_at(c: dict[str, np.ndarray], level: float, window: int = 5) -> float:
    """Episodes at which the moving average of the sampled success first reaches `level` (NaN: never)."""
    s = np.convolve(c["success"], np.ones(window) / window, mode="valid")
    hits = np.flatnonzero(s >= level)
    return float(c["episodes"][hits[0] + window - 1]) if len(hits) else float("nan")


def summarize(cfg: AgentCompareConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"env": cfg.env, "algorithms": {}, "references": {}}
    for a in cfg.algorithm_list:
        every = [Path(cfg.run_dir) / a / f"seed_{s}" for s in cfg.seed_list]
        runs = [r for r in every if (r / "eval.json").is_file()]
        failed = [read_json(r / "failed.json")["error"] for r in every if r not in runs]
        if not runs:
            out["algorithms"][a] = {"failed": failed}
            continue
        evals = [read_json(r / "eval.json") for r in runs]
        greedy = [e["eval"][label(a)]["success"] for e in evals]
        out["references"] = {k: v for k, v in evals[0]["eval"].items() if k in ("random", "scripted", "optimal")}
        cs = [curves(r) for r in runs]
        out["algorithms"][a] = {
            "greedy_success": greedy,
            "returns": [e["eval"][label(a)]["return"] for e in evals],
            "turns": [e["eval"][label(a)]["turns"] for e in evals],
            "sft_success": [e["eval"]["SFT"]["success"] for e in evals],
            "episodes_to_0.9": [first_at(c, 0.9) for c in cs],
            "rl_s": [e["rl_s"] for e in evals],
            "curves": [{k: v.tolist() for k, v in c.items()} for c in cs],
            "failed": failed,
        }
    return out


def mean_se(xs: list[float]) -> str:
    x = np.asarray(xs, dtype=float)
    se = x.std(ddof=1) / np.sqrt(len(x)) if len(x) > 1 else 0.0
    return f"{x.mean():.3f} ± {se:.3f}"


def table(summary: dict[str, Any]) -> str:
    head = ["algorithm", "held-out greedy success", "return", "turns", "episodes to 0.9 (sampled)", "RL seconds"]
    rows = []
    for a, r in summary["algorithms"].items():
        stopped = f" ({len(r['failed'])} seed(s) stopped: see below)" if r["failed"] else ""
        if "greedy_success" not in r:
            rows.append([label(a), f"every seed stopped{stopped}", "", "", "", ""])
            continue
        reached = [x for x in r["episodes_to_0.9"] if x == x]
        to = f"{np.median(reached):.0f} ({len(reached)}/{len(r['episodes_to_0.9'])} seeds)" if reached else "never"
        rows.append(
            [
                label(a),
                mean_se(r["greedy_success"]),
                mean_se(r["returns"]),
                mean_se(r["turns"]),
                to,
                f"{np.median(r['rl_s']):.0f}",
            ]
        )
    for name, ref in summary["references"].items():
        rows.append(
            [
                name,
                f"{ref['success']:.3f}",
                f"{ref['return']:.3f}" if "return" in ref else "",
                f"{ref['turns']:.2f}" if "turns" in ref else "",
                "",
                "",
            ]
        )
    notes = [f"- {label(a)}: {e}" for a, r in summary["algorithms"].items() for e in r["failed"]]
    return markdown_table(head, rows) + ("\n\nStopped runs:\n\n" + "\n".join(notes) if notes else "")


def plot(summary: dict[str, Any], path: Path) -> None:
    plt = plt_module()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (a, r) in enumerate(summary["algorithms"].items()):
        color = f"C{i}"
        if not r.get("curves"):
            continue
        for ax, x in zip(axes, ("episodes", "seconds")):
            for c in r["curves"]:
                ax.plot(c[x], c["success"], color=color, alpha=0.25, lw=0.8)
            n = min(len(c["success"]) for c in r["curves"])
            mean = np.mean([c["success"][:n] for c in r["curves"]], 0)
            ax.plot(np.mean([c[x][:n] for c in r["curves"]], 0), mean, color=color, lw=2, label=label(a))
    for ax, x in zip(axes, ("episodes", "RL seconds (1 thread)")):
        for j, (name, ref) in enumerate(summary["references"].items()):
            ax.axhline(ref["success"], ls="--", color=f"0.{3 + 2 * j}", lw=1, label=name)
        ax.set_xlabel(x)
        ax.set_ylabel("success (sampled, training episodes)")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=8)
    fig.suptitle(f"{summary['env']}: success of the training episodes, mean over seeds (thin: each seed)")
    save_figure(fig, path)


def run_agent_compare(cfg: AgentCompareConfig) -> int:
    """Every (algorithm, seed) not finished yet (a folder with its eval.json or failed.json is kept: delete it to
    run it again), then the table and the figure. A run that stops with an error (its policy's actions all
    invalid, say) is a result too: its message goes to its failed.json and the table counts it."""
    for a in cfg.algorithm_list:
        for s in cfg.seed_list:
            path = Path(cfg.run_dir) / a / f"seed_{s}"
            if (path / "eval.json").is_file() or (path / "failed.json").is_file():
                continue
            try:
                run_one(run_args(cfg, a, s))
            except UserError as exc:
                if not (path / "agent.json").is_file():  # a bad setting, not a result: stop there
                    raise
                atomic_write_json(path / "failed.json", {"error": str(exc)})
                print(f"note: {a} seed {s} stopped: {exc}", file=sys.stderr)
    summary = summarize(cfg)
    out = Path(cfg.run_dir)
    atomic_write_json(out / "compare.json", summary)
    plot(summary, out / "compare.png")
    seeds = ", ".join(map(str, cfg.seed_list))
    atomic_write_text(out / "compare.md", f"# {cfg.env}: seeds {seeds}\n\n{table(summary)}\n\n![](compare.png)\n")
    print(json.dumps({"stage": "agent-compare", "env": cfg.env, "table": str(out / "compare.md")}))
    return 0
