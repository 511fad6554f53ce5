"""`compare` on a checkable task (arithmetic, Countdown): held-out accuracy instead of the gold-vs-KL frontier.

Each online method's runs log the held-out greedy accuracy every `eval_every` steps (`eval/greedy_gold`), beside
the training seconds so far (`time/train_s`, evaluations excluded). The report is one table (greedy accuracy and
its gain over the SFT model, pass@1, pass@k, reply lengths of right and wrong replies, zero-variance groups,
truncation, entropy, wall time; mean ± standard error over seeds) and one figure: accuracy against episodes, against
training seconds, and the lengths of right and wrong replies.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlhf_toy.logging import markdown_table, plt_module, save_figure

from .evaluate import checked_columns, mean_se

FIGURES = (
    "accuracy",
    "pass@1",
    "pass@k",
    "length_right",
    "length_wrong",
    "zero_variance",
    "truncated",
    "entropy",
    "kl",
)


def mean_and_se(values: list[float]) -> dict[str, float]:
    """`mean_se` as the report's JSON keeps it."""
    return dict(zip(("mean", "se"), mean_se(values)))


def accuracy_curve(rows: list[dict[str, Any]], start: float, batch_size: int) -> np.ndarray:
    """`[n, 3]`: (episodes, training seconds, held-out greedy accuracy), from the SFT model's accuracy at 0."""
    points = [(0.0, 0.0, start)]
    points += [
        (r["step"] * batch_size, r["time/train_s"], r["eval/greedy_gold"]) for r in rows if "eval/greedy_gold" in r
    ]
    return np.asarray(points)


TARGET = 0.9  # the held-out accuracy whose first crossing the table reports (episodes and training seconds)


def first_reaching(curve: np.ndarray, target: float = TARGET) -> tuple[float, float] | None:
    """(episodes, training seconds) at the first evaluation with accuracy >= `target`; None if never."""
    hits = np.nonzero(curve[:, 2] >= target)[0]
    return None if len(hits) == 0 else (float(curve[hits[0], 0]), float(curve[hits[0], 1]))


def summarize_checkable(
    sft_row: dict[str, Any],
    results: dict[str, list[dict[str, Any]]],
    curves: dict[str, list[list[dict[str, Any]]]],
    batch_size: int,
) -> dict[str, Any]:
    """Every method's figures over seeds, the table, and each seed's accuracy curve."""
    methods: dict[str, Any] = {}
    for m, rows in results.items():
        figs = {
            k: mean_and_se([r[k] for r in rows]) for k in FIGURES if rows and all(r.get(k) is not None for r in rows)
        }
        gains = [r["accuracy"] - sft_row["accuracy"] for r in rows]
        # Times: medians over seeds (one run slowed by another process on the machine moves a mean, not these).
        seed_curves = [accuracy_curve(c, sft_row["accuracy"], batch_size) for c in curves.get(m, [])]
        reached = [first_reaching(c) for c in seed_curves]
        methods[m] = {
            **figs,
            "wall_s": float(np.median([r["wall_s"] for r in rows])) if rows else None,
            # Median over seeds of the first crossing of TARGET; None unless every seed crossed it.
            "to_target": None
            if not reached or None in reached
            else [float(np.median([r[i] for r in reached if r is not None])) for i in (0, 1)],
            "reached_target": sum(r is not None for r in reached),
            "gain": mean_and_se(gains),
            "episodes_per_s": float(np.median([r["episodes_per_s"] for r in rows if r.get("episodes_per_s")] or [0])),
            "seeds": len(rows),
            "curves": [c.tolist() for c in seed_curves],
        }
    pm = lambda f, k: f"{f[k]['mean']:.3f} ± {f[k]['se']:.3f}" if k in f else "-"  # noqa: E731
    tokens = lambda f, k: f"{f[k]['mean']:.1f}" if k in f else "-"  # noqa: E731
    k = sft_row.get("k", "k")
    head = [
        "method",
        "seeds",
        "greedy accuracy",
        "gain over SFT",
        *checked_columns(k),
        "KL (nats)",
        f"episodes to {TARGET} (median)",
        f"train s to {TARGET} (median)",
        "wall s (median)",
        "episodes/s",
    ]
    s = sft_row
    table = [
        [
            "SFT",
            "-",
            f"{s['accuracy']:.3f} ± {s['accuracy_se']:.3f}",
            "-",
            f"{s['pass@1']:.3f}",
            f"{s['pass@k']:.3f}",
            "-" if s["length_right"] is None else f"{s['length_right']:.1f}",
            "-" if s["length_wrong"] is None else f"{s['length_wrong']:.1f}",
            f"{s['zero_variance']:.2f}",
            f"{s['truncated']:.3f}",
            f"{s['entropy']:.3f}",
            "0",
            "-",
            "-",
            "-",
            "-",
        ]
    ]
    for m, f in methods.items():
        table.append(
            [
                m,
                str(f["seeds"]),
                pm(f, "accuracy"),
                f"{f['gain']['mean']:+.3f} ± {f['gain']['se']:.3f}",
                pm(f, "pass@1"),
                pm(f, "pass@k"),
                tokens(f, "length_right"),
                tokens(f, "length_wrong"),
                pm(f, "zero_variance"),
                pm(f, "truncated"),
                pm(f, "entropy"),
                pm(f, "kl"),
                "-" if f["to_target"] is None else f"{f['to_target'][0]:.0f}",
                "-" if f["to_target"] is None else f"{f['to_target'][1]:.1f}",
                "-" if f["wall_s"] is None else f"{f['wall_s']:.0f}",
                f"{f['episodes_per_s']:.0f}",
            ]
        )
    return {"sft": sft_row, "methods": methods, "runs": results, "table": markdown_table(head, table)}


def plot_accuracy(report: dict[str, Any], path) -> None:
    """Held-out greedy accuracy against episodes and against training seconds (mean over seeds, ± s.e. shaded),
    and the mean reply length of right and of wrong replies per method."""
    plt = plt_module()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    names = list(report["methods"])
    for i, m in enumerate(names):
        runs = [np.asarray(c) for c in report["methods"][m]["curves"]]
        if not runs:
            continue
        n = min(len(c) for c in runs)
        stack = np.stack([c[:n] for c in runs])  # [seeds, n, 3]
        acc = stack[:, :, 2].mean(0)
        se = stack[:, :, 2].std(0, ddof=1) / np.sqrt(len(runs)) if len(runs) > 1 else np.zeros(n)
        # Training seconds: the median over seeds at each point (robust to a run slowed by another process).
        for ax, x in ((axes[0], stack[:, :, 0].mean(0)), (axes[1], np.median(stack[:, :, 1], 0))):
            ax.plot(x, acc, color=f"C{i}", label=m)
            ax.fill_between(x, acc - se, acc + se, color=f"C{i}", alpha=0.15)
    axes[0].set(xlabel="episodes (replies trained on)", ylabel="held-out greedy accuracy", title="accuracy / episodes")
    axes[1].set(xlabel="training seconds (median over seeds; evaluations excluded)", title="accuracy / wall time")
    axes[0].legend(fontsize=7)
    f = report["methods"]
    x = np.arange(len(names))
    right = [f[m]["length_right"]["mean"] if "length_right" in f[m] else np.nan for m in names]
    wrong = [f[m]["length_wrong"]["mean"] if "length_wrong" in f[m] else np.nan for m in names]
    axes[2].bar(x - 0.2, right, 0.4, label="right replies")
    axes[2].bar(x + 0.2, wrong, 0.4, label="wrong replies")
    axes[2].set_xticks(x, names, rotation=30, fontsize=7)
    axes[2].set(ylabel="tokens", title="reply length")
    axes[2].legend(fontsize=7)
    save_figure(fig, path)
