"""Learning-curve plots (matplotlib, Agg backend)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from rlhf_toy.logging import moving_average, plt_module, save_figure


def plot_learning_curve(
    returns: Sequence[float], threshold: float | None, path: str | os.PathLike[str], title: str
) -> None:
    """Episode returns and their 20-episode moving average against the episode index."""
    plt = plt_module()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(returns, lw=0.6, alpha=0.4, label="episode return")
    ax.plot(moving_average(returns, 20), lw=1.8, label="mean of last 20")
    if threshold is not None:
        ax.axhline(threshold, ls="--", c="gray", lw=1, label=f"solved ({threshold:g})")
    ax.set(xlabel="episode", ylabel="return", title=title)
    ax.legend(loc="lower right", fontsize=8)
    save_figure(fig, path)
