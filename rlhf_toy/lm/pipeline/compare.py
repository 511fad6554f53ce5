"""Every RLHF method on the gold-vs-KL frontier: `rlhf-toy compare`.

From one run's SFT model and reward model (stages 1-4), each method trains over several seeds at a matched
budget (the same number of sampled episodes for every online method; DPO reads the preference pairs), then each
policy is evaluated on the held-out prompts (gold, reward-model score, KL to the reference, on-topic rate,
distinct-2) beside best-of-n from the SFT model. Gao et al.'s (2022) functional forms are fitted with d =
sqrt(KL) and R = gold minus the SFT model's gold: best-of-n R = d (alpha - beta d) on its n = 1 ... 64 points,
RL R = d (alpha - beta log d) on each method's training curve (the training batches' gold against their KL,
averaged over seeds). Outputs: run_dir/compare.md, compare.json, compare.png (`--name` picks another stem).

Several betas (`--kl_coef 0,0.03,0.1`) make each online method one variant per beta (`ppo_beta0.03`): with
`--methods ppo --seeds 0` that is the lesson's over-optimization warning (PPO at several KL coefficients against
best-of-n, proxy and gold against sqrt(KL); Gao et al. 2022), which was the `overopt` command before 0.2.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rlhf_toy.config import check, check_seed, derived, option, parse_list
from rlhf_toy.logging import markdown_table, moving_average, plt_module, read_jsonl, save_figure

from ..algorithms.dpo import DPOConfig
from ..algorithms.online import ALGORITHMS, OFFLINE_LABELS
from ..algorithms.rlhf import RLHFConfig
from .evaluate import evaluate_best_of_n, evaluate_policy, mean_se
from .reasoning import plot_accuracy, summarize_checkable
from .run import RunConfig, writes_run_dir
from .stages import DPODirConfig, ResumeConfig, stage_dpo, stage_ppo, task_reward

METHODS = (*ALGORITHMS, *OFFLINE_LABELS)  # every online algorithm of the table, then DPO
LARGEST_GROUP = max(a.default_group_size for a in ALGORITHMS.values())  # a batch must hold whole groups of it


@dataclass
class CompareConfig:
    methods: str = option(
        "Comma-separated methods: ppo, reinforce, reinforce_baseline, rloo, grpo, dpo.", ",".join(METHODS)
    )
    seeds: str = option("Comma-separated seeds of the RL runs (the SFT and reward models are the run's).", "0,1,2")
    episodes: int = option("Sampled episodes per online run (steps = episodes / batch_size).", 6400)
    batch_size: int = option(
        "Episodes per step for every online method (grouped ones: batch_size / k prompts, k replies each).", 64
    )
    eval_prompts: int = option("Held-out prompts for every evaluation.", 200)
    best_of: str = option("n of the best-of-n frontier.", "1,2,4,8,16,32,64")
    kl_coef: str = option(
        "beta of every online method's KL penalty; several, comma-separated, run each online method "
        "once per beta (empty: RLHFConfig's 0.1).",
        "",
    )
    minibatch_size: int | None = option(
        "Sequences per gradient step of every online method (None: each preset's, at most batch_size).", None
    )
    learning_rate: float | None = option("Learning rate of every online method (None: each preset's).", None)
    max_new_tokens: int | None = option("Longest reply of every method and evaluation (None: RLHFConfig's).", None)
    eval_every: int = option(
        "Checkable tasks: held-out greedy accuracy every this many steps of each online run (its curve against "
        "episodes and wall time; 0: only at the end).",
        10,
    )
    name: str = option(
        "Name of this comparison: its outputs are run_dir/NAME.md, .json, .png and its runs "
        "run_dir/NAME_METHOD_sSEED (another name keeps an earlier comparison).",
        "compare",
    )
    method_list: list[str] = derived()
    seed_list: list[int] = derived()
    best_of_ns: list[int] = derived()
    betas: list[float | None] = derived()

    def __post_init__(self) -> None:
        self.method_list = [m.strip() for m in self.methods.split(",") if m.strip()]
        check(
            bool(self.method_list) and all(m in METHODS for m in self.method_list),
            "methods",
            self.methods,
            f"comma-separated names from {', '.join(METHODS)}",
        )
        self.seed_list = parse_list("seeds", self.seeds, int, "comma-separated integers")
        for seed in self.seed_list:
            check_seed(seed, "seeds")
        # Two runs of one seed are the same run: a standard error over them would claim a precision it lacks.
        check(len(set(self.seed_list)) == len(self.seed_list), "seeds", self.seeds, "distinct seeds, e.g. 0,1,2")
        self.best_of_ns = parse_list("best_of", self.best_of, int, "integers >= 1")
        check(all(n >= 1 for n in self.best_of_ns), "best_of", self.best_of, "comma-separated integers >= 1")
        check(
            self.batch_size % LARGEST_GROUP == 0,
            "batch_size",
            self.batch_size,
            f"a multiple of {LARGEST_GROUP} (the group size of the grouped methods)",
        )
        check(self.episodes >= self.batch_size, "episodes", self.episodes, f">= batch_size ({self.batch_size})")
        check(self.eval_prompts >= 2, "eval_prompts", self.eval_prompts, ">= 2")
        self.betas = parse_list("kl_coef", self.kl_coef, float, "numbers >= 0") if self.kl_coef.strip() else [None]
        check(all(b is None or b >= 0 for b in self.betas), "kl_coef", self.kl_coef, "numbers >= 0, e.g. 0.1")
        check(self.learning_rate is None or self.learning_rate > 0, "learning_rate", self.learning_rate, "> 0")
        check(self.max_new_tokens is None or self.max_new_tokens >= 1, "max_new_tokens", self.max_new_tokens, ">= 1")
        check(self.eval_every >= 0, "eval_every", self.eval_every, ">= 0 (0: only at the end)")
        check(
            self.minibatch_size is None or 1 <= self.minibatch_size <= self.batch_size,
            "minibatch_size",
            self.minibatch_size,
            f"between 1 and batch_size ({self.batch_size})",
        )
        check(
            bool(re.fullmatch(r"[A-Za-z0-9_.-]+", self.name)),
            "name",
            self.name,
            "letters, digits, '_', '-' or '.' (it names files in the run directory)",
        )


def fit_gao(d: np.ndarray, r: np.ndarray, form: str) -> dict[str, float]:
    """Least-squares alpha, beta of R = d (alpha - beta f(d)), f = d (best-of-n) or log d (RL), on points with
    d > 0; the predicted peak (d*, R*) where dR/dd = 0 (None when beta <= 0: no peak in this form); and the
    largest d fitted (`max_d`: a peak far beyond it is an extrapolation, not a prediction to trust)."""
    keep = d > 1e-6
    d, r = d[keep], r[keep]
    if len(d) < 2:
        return {"alpha": float("nan"), "beta": float("nan"), "peak_d": None, "peak_gain": None, "max_d": None}
    max_d = float(d.max())
    f = d if form == "bon" else np.log(d)
    A = np.stack([d, -d * f], 1)  # R = alpha d - beta d f(d): linear in (alpha, beta)
    (alpha, beta), *_ = np.linalg.lstsq(A, r, rcond=None)
    if beta <= 0:
        return {"alpha": float(alpha), "beta": float(beta), "peak_d": None, "peak_gain": None, "max_d": max_d}
    peak = alpha / (2 * beta) if form == "bon" else math.exp(alpha / beta - 1)
    gain = peak * (alpha - beta * (peak if form == "bon" else math.log(peak)))
    return {"alpha": float(alpha), "beta": float(beta), "peak_d": float(peak), "peak_gain": float(gain), "max_d": max_d}


def format_fit(f: dict[str, Any] | None) -> list[str]:
    """The table cells alpha, beta, peak gold gain (at KL) of one `fit_gao` result."""
    if not f or f["alpha"] != f["alpha"]:
        return ["-", "-", "-"]
    if f["peak_d"] is None:
        peak = "none"
    elif f["peak_d"] > 2 * f["max_d"]:  # far outside the fitted KL range: say so instead of a number
        peak = f"beyond the data (KL > {(2 * f['max_d']) ** 2:.0f})"
    else:
        peak = f"{f['peak_gain']:+.3f} ({f['peak_d'] ** 2:.1f})"
    return [f"{f['alpha']:.3f}", f"{f['beta']:.3f}", peak]


def training_curve(
    rows_by_seed: list[list[dict[str, Any]]], key: str = "objective/gold"
) -> tuple[np.ndarray, np.ndarray]:
    """(sqrt KL, gain of `key` over the first step) of the training batches, averaged over seeds and smoothed."""
    n = min(len(rows) for rows in rows_by_seed)
    kl = np.mean([[r["objective/kl"] for r in rows[:n]] for rows in rows_by_seed], 0)
    gain = np.mean([[r[key] - rows[0][key] for r in rows[:n]] for rows in rows_by_seed], 0)
    return np.sqrt(np.clip(moving_average(list(kl), 5), 0, None)), np.asarray(moving_average(list(gain), 5))


def variants(cfg: CompareConfig) -> list[tuple[str, str, float | None]]:
    """`(variant, method, beta)` for every run of a seed: each online method once per beta (named METHOD, or
    METHOD_betaB when there are several betas), DPO once (it has no KL penalty to the reference's samples)."""
    out = []
    for method in cfg.method_list:
        if method not in ALGORITHMS or len(cfg.betas) == 1:
            out.append((method, method, cfg.betas[0] if method in ALGORITHMS else None))
        else:
            out += [(f"{method}_beta{b:g}", method, b) for b in cfg.betas]
    return out


def online_settings(
    method: str, beta: float | None, cfg: CompareConfig, checkable: bool = False
) -> tuple[RLHFConfig, Any]:
    """The matched budget for one online run: the method's own preset and group size, `cfg`'s batch and beta (and
    on a checkable task, the held-out accuracy every `eval_every` steps)."""
    algorithm = ALGORITHMS[method]
    kl = {} if beta is None else {"kl_coef": beta}
    tokens = {} if cfg.max_new_tokens is None else {"max_new_tokens": cfg.max_new_tokens}
    steps = cfg.episodes // cfg.batch_size
    evals = {"eval_every": cfg.eval_every or steps, "eval_prompts": cfg.eval_prompts} if checkable else {}
    rl = RLHFConfig(
        **{
            **algorithm.rollout,
            "steps": steps,
            "batch_size": cfg.batch_size,
            "group_size": algorithm.default_group_size,
            "save_every": 0,
            **kl,
            **tokens,
            **evals,
        }
    )
    preset = algorithm.preset  # a batch smaller than the preset's minibatch is one minibatch
    lr = {} if cfg.learning_rate is None else {"learning_rate": cfg.learning_rate}
    minibatch = cfg.minibatch_size or min(preset.minibatch_size, cfg.batch_size)
    return rl, replace(preset, minibatch_size=minibatch, **lr)


@writes_run_dir
def run_comparison(run: RunConfig, cfg: CompareConfig) -> dict[str, Any]:
    task = run.start()
    rd = run.dir
    device = run.torch_device
    sft, tok = rd.load_sft(device)
    rm = task_reward(run, task, tok, device)
    prompts = task.eval_prompts[: cfg.eval_prompts]
    sampling = RLHFConfig()  # every evaluation samples as the online methods do by default
    temperature, tokens = sampling.temperature, cfg.max_new_tokens or sampling.max_new_tokens
    sft_row = evaluate_policy("SFT", sft, sft, rm, tok, task, prompts, temperature, tokens, run.seed)
    bon = (
        []
        if task.checkable
        else evaluate_best_of_n(sft, rm, tok, task, prompts, cfg.best_of_ns, temperature, tokens, run.seed)
    )
    runs = variants(cfg)
    if task.reward is not None and any(m not in ALGORITHMS for _, m, _ in runs):
        dropped = sorted({m for _, m, _ in runs if m not in ALGORITHMS})
        print(f"note: {', '.join(dropped)} left out: a program reward gives no preference pairs to learn from")
        runs = [r for r in runs if r[1] in ALGORITHMS]
    results: dict[str, list[dict[str, Any]]] = {v: [] for v, _, _ in runs}
    curves: dict[str, list[list[dict[str, Any]]]] = {v: [] for v, _, _ in runs}
    for seed in cfg.seed_list:
        seeded = replace(run, seed=seed)
        for variant, method, beta in runs:
            name = f"{cfg.name}_{variant}_s{seed}"
            t0 = time.perf_counter()
            if method in ALGORITHMS:
                rl, preset = online_settings(method, beta, cfg, task.checkable)
                summary = stage_ppo(seeded, rl, preset, ResumeConfig(policy_dir=name), None, method)
                curves[variant].append(read_jsonl(rd.policy_dir(name).metrics))
            else:
                summary = stage_dpo(seeded, DPOConfig(), DPODirConfig(name))
            wall = time.perf_counter() - t0
            policy, _ = rd.policy_dir(name).load_policy(name)
            row = evaluate_policy(variant, policy.to(device), sft, rm, tok, task, prompts, temperature, tokens, seed)
            row.update(seed=seed, wall_s=wall, episodes_per_s=summary.get("episodes_per_s"))
            results[variant].append(row)
    if task.checkable:
        report = summarize_checkable(sft_row, results, curves, cfg.batch_size)
    else:
        report = summarize(sft_row, bon, results, curves)
    report["settings"] = {
        "episodes": cfg.episodes,
        "batch_size": cfg.batch_size,
        "kl_coef": cfg.betas if len(cfg.betas) > 1 else cfg.betas[0],
        "minibatch_size": cfg.minibatch_size,
        "seeds": cfg.seed_list,
    }
    rd.save_json(rd.report(f"{cfg.name}.json"), report)
    rd.save_text(rd.report(f"{cfg.name}.md"), report["table"])
    if task.checkable:
        plot_accuracy(report, rd.report(f"{cfg.name}.png"))
    else:
        plot_frontier(report, curves, rd.report(f"{cfg.name}.png"))
    print(report["table"])
    return report


def summarize(
    sft_row: dict[str, Any],
    bon: list[dict[str, Any]],
    results: dict[str, list[dict[str, Any]]],
    curves: dict[str, list[list[dict[str, Any]]]],
) -> dict[str, Any]:
    base = sft_row["gold"]
    bon_d = np.array([math.sqrt(max(r["kl"], 0.0)) for r in bon])
    bon_fit = fit_gao(bon_d, np.array([r["gold"] - base for r in bon]), "bon")
    methods: dict[str, Any] = {}
    for m, rows in results.items():
        fig = {
            k: mean_se([r[k] for r in rows])
            for k in ("gold", "rm_score", "kl", "on_topic", "distinct_2", "wall_s")
            if rows and rows[0].get(k) is not None
        }
        eps = [r["episodes_per_s"] for r in rows if r.get("episodes_per_s")]
        fit = fit_gao(*training_curve(curves[m]), "rl") if curves.get(m) else None
        methods[m] = {
            **{k: {"mean": v[0], "se": v[1]} for k, v in fig.items()},
            "fit": fit,
            "episodes_per_s": float(np.median(eps)) if eps else None,
            "seeds": len(rows),
        }
    head = [
        "method",
        "seeds",
        "gold",
        "RM score",
        "KL (nats)",
        "on topic",
        "distinct-2",
        "wall s",
        "episodes/s",
        "Gao alpha",
        "Gao beta",
        "peak gold gain (at KL)",
    ]

    pm = lambda x: f"{x['mean']:.3f} ± {x['se']:.3f}"  # noqa: E731
    rows = [
        ["SFT", "-", f"{sft_row['gold']:.3f}", f"{sft_row['rm_score']:.2f}", "0", "-", "-", "-", "-", "-", "-", "-"]
    ]
    rows += [
        [
            r["name"],
            "-",
            f"{r['gold']:.3f}",
            f"{r['rm_score']:.2f}",
            f"{r['kl']:.2f}",
            "-",
            "-",
            "-",
            "-",
            *(format_fit(bon_fit) if r is bon[-1] else ["-", "-", "-"]),
        ]
        for r in bon
    ]
    for m, f in methods.items():
        rows.append(
            [
                m,
                str(f["seeds"]),
                pm(f["gold"]),
                pm(f["rm_score"]),
                pm(f["kl"]),
                pm(f["on_topic"]) if "on_topic" in f else "-",
                pm(f["distinct_2"]),
                f"{f['wall_s']['mean']:.0f}",
                "-" if f["episodes_per_s"] is None else f"{f['episodes_per_s']:.0f}",
                *format_fit(f["fit"]),
            ]
        )
    return {
        "sft": sft_row,
        "best_of_n": bon,
        "best_of_n_fit": bon_fit,
        "methods": methods,
        "runs": results,
        "table": markdown_table(head, rows),
    }


def plot_frontier(report: dict[str, Any], curves: dict[str, list[list[dict[str, Any]]]], path) -> None:
    plt = plt_module()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    bon = report["best_of_n"]
    d = [math.sqrt(max(r["kl"], 0.0)) for r in bon]
    for ax, key, label, logged in (
        (axes[0], "gold", "gold (held-out)", "objective/gold"),
        (axes[1], "rm_score", "reward-model score", "objective/score"),
    ):
        base = report["sft"][key]
        ax.plot(d, [r[key] for r in bon], "k--o", ms=3, label="best-of-n (n = 1 ... 64)")
        for i, (m, f) in enumerate(report["methods"].items()):
            color = f"C{i}"
            x = math.sqrt(max(f["kl"]["mean"], 0.0))
            ax.errorbar(x, f[key]["mean"], yerr=f[key]["se"], fmt="o", capsize=3, color=color, label=m)
            if curves.get(m):  # the training batches' path to it, faint, in the same colour
                xs, gain = training_curve(curves[m], logged)
                ax.plot(xs, base + gain, alpha=0.35, lw=1, color=color)
        ax.set(xlabel="sqrt(KL to the reference, nats)", ylabel=label)
    axes[0].set_title("What we wanted (gold)")
    axes[1].set_title("What was optimized (proxy)")
    axes[0].legend(fontsize=7)
    save_figure(fig, path)
