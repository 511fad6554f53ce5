"""`compare` on a task with a gold judge: every method on the gold-vs-KL frontier beside best-of-n.

Gao et al.'s (2022) functional forms are fitted with d = sqrt(KL) and R = gold minus the SFT model's gold:
best-of-n R = d (alpha - beta d) on its n = 1 ... 64 points, RL R = d (alpha - beta log d) on each method's
training curve (the training batches' gold against their KL, averaged over seeds). Over-optimization is read off
the same curve: the gold's peak, its drop to the end, and the proxy's rise meanwhile (`gold_peak`). The table
(gold, proxy, KL, words and the gain's correlation with length, ...), and the figure of gold and proxy against
sqrt(KL) with the fits.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlhf_toy.logging import markdown_table, moving_average, plt_module, save_figure

from .evaluate import format_gain, length_link, mean_se, paired_gain


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


SMOOTHING = 5  # steps in the moving average of a training curve


def gold_peak(rows_by_seed: list[list[dict[str, Any]]]) -> dict[str, float]:
    """Over-optimization on the training curve (training batches' gold and proxy, averaged over seeds, moving
    average of `SMOOTHING` steps): the peak gold and its step, the last gold, the drop from the peak, and how much
    the proxy (the optimized score) moved from the gold's peak to the end."""
    n = min(len(rows) for rows in rows_by_seed)
    mean = (
        lambda key: moving_average(  # noqa: E731
            list(np.mean([[r[key] for r in rows[:n]] for rows in rows_by_seed], 0)), SMOOTHING
        )
    )
    gold, proxy = mean("objective/gold"), mean("objective/score")
    i = int(np.argmax(gold))
    return {
        "peak_gold": float(gold[i]),
        "peak_step": i + 1,
        "final_gold": float(gold[-1]),
        "gold_drop": float(gold[i] - gold[-1]),
        "proxy_after_peak": float(proxy[-1] - proxy[i]),
    }


def best_of_n_by_reward(bon: dict[str, list[dict[str, Any]]]) -> list[list[str]]:
    """Best-of-max(n) ranked by each remedy's reward against ranked by one reward model: rows of (ranking, gold ±
    s.e., gain over one reward model ± paired s.e. over prompts, words)."""
    base = bon.get("none") or next(iter(bon.values()))
    rows = []
    for rows_of in bon.values():
        r = rows_of[-1]
        gain = "-" if rows_of is base else format_gain(*paired_gain(r, base[-1]))
        rows.append([r["name"], f"{r['gold']:.3f} ± {r['gold_se']:.3f}", gain, f"{r['length_words']:.1f}"])
    return rows


def summarize(
    sft_row: dict[str, Any],
    bon_by_reward: dict[str, list[dict[str, Any]]],
    results: dict[str, list[dict[str, Any]]],
    curves: dict[str, list[list[dict[str, Any]]]],
) -> dict[str, Any]:
    base = sft_row["gold"]
    bon = bon_by_reward.get("none") or next(iter(bon_by_reward.values()))  # the frontier: one reward model's
    bon_d = np.array([math.sqrt(max(r["kl"], 0.0)) for r in bon])
    bon_fit = fit_gao(bon_d, np.array([r["gold"] - base for r in bon]), "bon")
    methods: dict[str, Any] = {}
    for m, rows in results.items():
        fig = {
            k: mean_se([r[k] for r in rows])
            for k in ("gold", "rm_score", "kl", "on_topic", "distinct_2", "length_words", "wall_s")
            if rows and rows[0].get(k) is not None
        }
        eps = [r["episodes_per_s"] for r in rows if r.get("episodes_per_s")]
        fit = fit_gao(*training_curve(curves[m]), "rl") if curves.get(m) else None
        methods[m] = {
            **{k: {"mean": v[0], "se": v[1]} for k, v in fig.items()},
            "fit": fit,
            "overoptimization": gold_peak(curves[m]) if curves.get(m) else None,
            "length_r": float(np.mean([length_link(r, sft_row)["gain_length_r"] for r in rows])),
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
        "words",
        "gain-length r",
        "training gold: peak (step) -> end",
        "wall s",
        "episodes/s",
        "Gao alpha",
        "Gao beta",
        "peak gold gain (at KL)",
    ]
    blank = ["-"] * 4
    pm = lambda x: f"{x['mean']:.3f} ± {x['se']:.3f}" if math.isfinite(x["mean"]) else "n/a"  # noqa: E731
    rows = [
        [
            "SFT",
            "-",
            f"{sft_row['gold']:.3f}",
            f"{sft_row['rm_score']:.2f}",
            "0",
            "-",
            "-",
            f"{sft_row['length_words']:.1f}",
            *blank,
            "-",
            "-",
            "-",
        ]
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
            f"{r['length_words']:.1f}",
            *blank,
            *(format_fit(bon_fit) if r is bon[-1] else ["-", "-", "-"]),
        ]
        for r in bon
    ]
    for m, f in methods.items():
        o = f["overoptimization"]
        rows.append(
            [
                m,
                str(f["seeds"]),
                pm(f["gold"]),
                pm(f["rm_score"]),
                pm(f["kl"]),
                pm(f["on_topic"]) if "on_topic" in f else "-",
                pm(f["distinct_2"]),
                f"{f['length_words']['mean']:.1f}",
                "-" if f["length_r"] != f["length_r"] else f"{f['length_r']:.2f}",
                "-" if o is None else f"{o['peak_gold']:.3f} ({o['peak_step']}) -> {o['final_gold']:.3f}",
                f"{f['wall_s']['mean']:.0f}",
                "-" if f["episodes_per_s"] is None else f"{f['episodes_per_s']:.0f}",
                *format_fit(f["fit"]),
            ]
        )
    table = markdown_table(head, rows)
    if len(bon_by_reward) > 1:
        table += "\nBest-of-n ranked by each remedy's reward (the same replies; gain paired by prompt):\n\n"
        table += markdown_table(
            ["best-of-n", "gold ± s.e.", "gain over one reward model ± paired s.e.", "words"],
            best_of_n_by_reward(bon_by_reward),
        )
    return {
        "sft": sft_row,
        "best_of_n": bon,
        "best_of_n_by_reward": bon_by_reward,
        "best_of_n_fit": bon_fit,
        "methods": methods,
        "runs": results,
        "table": table,
    }


def plot_frontier(report: dict[str, Any], curves: dict[str, list[list[dict[str, Any]]]], path) -> None:
    """Gold and proxy against sqrt(KL): best-of-n's points, each method's end point (± s.e.) and its training
    path (faint), and Gao et al.'s RL form fitted to that path (dashed, gold panel)."""
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
            color = f"C{i % 10}"
            x = math.sqrt(max(f["kl"]["mean"], 0.0))
            ax.errorbar(x, f[key]["mean"], yerr=f[key]["se"], fmt="o", capsize=3, color=color, label=m)
            if curves.get(m):  # the training batches' path to it, faint, in the same colour
                xs, gain = training_curve(curves[m], logged)
                ax.plot(xs, base + gain, alpha=0.35, lw=1, color=color)
                fit = f.get("fit")
                if key == "gold" and fit and fit["alpha"] == fit["alpha"] and xs.max() > 0:
                    grid = np.linspace(max(1e-3, xs.min()), xs.max(), 50)
                    ax.plot(grid, base + grid * (fit["alpha"] - fit["beta"] * np.log(grid)), "--", lw=0.8, color=color)
        ax.set(xlabel="sqrt(KL to the reference, nats)", ylabel=label)
    axes[0].set_title("What we wanted (gold); dashed: Gao et al.'s fit")
    axes[1].set_title("What was optimized (proxy)")
    axes[0].legend(fontsize=7)
    save_figure(fig, path)
