"""`report.html`: one self-contained page that explains a run (or overlays several).

It holds the run's settings (what differs from its preset first), its alarms (`alarms.py`), its curves (drawn in
the browser by uPlot, whose script is inlined: no network), and a searchable table of sampled replies by step.
Everything the page shows is embedded as JSON, so writing it takes milliseconds and it opens from disk or from
a CI artifact.

A run directory is what a trainer writes: `metrics.jsonl` (one row per step), and when present `settings.json`
(`{"settings": ..., "preset": ...}`, flat) and `samples.jsonl` (rows of `{"step", "samples": [...]}`).
"""

from __future__ import annotations

import html
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from rlhf_toy.errors import UserError
from rlhf_toy.io import atomic_write_text, read_json
from rlhf_toy.logging import read_jsonl

from .alarms import ALARMS, REWARD_KINDS, raised

PHASES = ("sample", "reward", "policy_forward", "reference_forward", "update")  # the trainer's PhaseClock
# (title, keys): a chart draws the first key each run logs of every group; runs are overlaid.
CHARTS: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] = (
    ("Reward-model score and gold", (("objective/score",), ("objective/gold",))),
    ("Episodic return", (("charts/episodic_return", "charts/episodic_return_median"), ("eval/mean_return",))),
    ("Episode length", (("charts/episodic_length",),)),
    ("Agent: success rate", (("agent/success",),)),
    ("Agent: return and its spread over episodes", (("agent/return",), ("agent/return_std",))),
    ("Agent: turns per episode", (("agent/turns",),)),
    ("Agent: invalid actions (share of turns)", (("agent/invalid_rate",),)),
    ("Agent: the environment's share of the tokens", (("agent/env_token_share",),)),
    ("KL to the reference (nats)", (("objective/kl",),)),
    ("beta (KL coefficient)", (("objective/beta",),)),
    ("Entropy", (("policy/entropy", "losses/entropy"),)),
    ("Reply length (tokens)", (("policy/response_length",),)),
    ("EOS rate (replies that ended)", (("policy/eos_rate",),)),
    ("Distinct-2 across the batch", (("policy/distinct_2",),)),
    ("Clip fraction", (("ppo/clip_fraction", "losses/clip_fraction"),)),
    ("Approx KL of the update", (("ppo/approx_kl", "losses/approx_kl"),)),
    ("Value loss", (("ppo/value_loss", "losses/value_loss"),)),
    ("Explained variance", (("ppo/explained_variance", "losses/explained_variance"),)),
    ("Gradient norm (before clipping)", (("ppo/grad_norm", "losses/grad_norm"),)),
    ("Share of groups with equal rewards", (("sampling/equal_groups",),)),
    ("Held-out greedy gold", (("eval/greedy_gold",),)),
    ("Throughput", (("time/episodes_per_s", "charts/SPS"),)),
    ("Seconds per phase of a step", tuple((f"time/{p}_s",) for p in PHASES)),
)


@dataclass
class RunRecord:
    """What a report shows of one run directory."""

    name: str
    path: Path
    rows: list[dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)
    preset: dict[str, Any] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    reward_kind: str | None = None  # what a policy run optimized (`alarms.REWARD_KINDS`): the alarms' words

    @classmethod
    def load(cls, path: str | os.PathLike[str], name: str | None = None) -> RunRecord:
        p = Path(path)
        if not (p / "metrics.jsonl").is_file():
            raise UserError(
                f"no metrics.jsonl in {p}: report reads a policy run's directory (e.g. runs/helpdesk/ppo), a run "
                "directory that holds some, or a CartPole --out directory"
            )
        rows = read_jsonl(p / "metrics.jsonl", partial_last_line_ok=True, steps=True)
        meta = (
            read_json(p / "settings.json", "delete it to report without settings")
            if (p / "settings.json").is_file()
            else {}
        )
        samples = (
            read_jsonl(p / "samples.jsonl", partial_last_line_ok=True, steps=True)
            if (p / "samples.jsonl").is_file()
            else []
        )
        for i, s in enumerate(samples, 1):
            if not (isinstance(s.get("samples", []), list) and all(isinstance(x, dict) for x in s.get("samples", []))):
                raise UserError(
                    f"{p / 'samples.jsonl'}, row {i}: 'samples' is not a list of replies; fix or delete that line"
                )
        kind = meta.get("reward_kind") if meta.get("reward_kind") in REWARD_KINDS else None
        return cls(name or p.name, p, rows, meta.get("settings", {}), meta.get("preset", {}), samples, kind)


def policy_runs(path: str | os.PathLike[str]) -> list[Path]:
    """The run directories under `path`: itself when it logged metrics, else its subdirectories that did."""
    p = Path(path)
    if (p / "metrics.jsonl").is_file():
        return [p]
    found = sorted(d for d in p.iterdir() if (d / "metrics.jsonl").is_file()) if p.is_dir() else []
    if not found:
        raise UserError(
            f"no run in {p}: pass a policy run's directory (with metrics.jsonl, e.g. runs/helpdesk/ppo), a run "
            "directory holding some, or a CartPole --out directory"
        )
    return found


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def chart_data(runs: list[RunRecord]) -> list[dict[str, Any]]:
    """Per chart: aligned `x` (the union of the steps) and one series per run and key, None where not logged."""
    out = []
    for title, groups in CHARTS:
        lines = []
        for run in runs:
            for keys in groups:
                key = next((k for k in keys if any(k in r for r in run.rows)), None)
                if key is not None:
                    label = key if len(runs) == 1 else f"{run.name}: {key}"
                    lines.append((label, {r["step"]: _finite(r.get(key)) for r in run.rows if "step" in r}))
        if not lines:
            continue
        xs = sorted({s for _, pts in lines for s in pts})
        out.append(
            {"title": title, "x": xs, "series": [{"label": lb, "y": [pts.get(s) for s in xs]} for lb, pts in lines]}
        )
    return out


def settings_table(run: RunRecord) -> list[dict[str, Any]]:
    """Each setting with its preset's value; those that differ first."""
    rows = [
        {"key": k, "value": v, "preset": run.preset.get(k), "differs": k in run.preset and run.preset[k] != v}
        for k, v in run.settings.items()
    ]
    return sorted(rows, key=lambda r: (not r["differs"], r["key"]))


def report_data(runs: list[RunRecord], title: str) -> dict[str, Any]:
    return {
        "title": title,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
        "alarm_names": [a.name for a in ALARMS],
        "runs": [
            {
                "name": r.name,
                "path": str(r.path),
                "steps": len(r.rows),
                "last_step": r.rows[-1].get("step") if r.rows else None,
                # every text embedded: an installed package has no docs folder to link to
                "alarms": [asdict(a) for a in raised(r.rows, r.reward_kind)],
                "settings": settings_table(r),
                "samples": [{"step": s.get("step"), **x} for s in r.samples for x in s.get("samples", [])],
            }
            for r in runs
        ],
        "charts": chart_data(runs),
    }


def _clean(x: Any) -> Any:
    """JSON for the browser: NaN and inf (which JSON.parse refuses) become null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def script_json(obj: Any) -> str:
    """JSON to embed in a `<script>` element: `<`, `>` and `&` as \\u escapes, so that no text of a reply
    (`</script>`, `<!--<script>`, which put the HTML parser into a state that swallows the rest of the page)
    can end or hide the element; JSON.parse reads the escapes back as the same characters."""
    text = json.dumps(obj, allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(runs: list[RunRecord], title: str) -> str:
    """The page's HTML: the template with uPlot's script and style and the data inlined."""
    assets = resources.files(__package__)
    data = script_json(_clean(report_data(runs, title)))
    page = assets.joinpath("template.html").read_text(encoding="utf-8")
    for name, text in (
        ("{{title}}", html.escape(title)),
        ("{{uplot_css}}", assets.joinpath("vendor/uPlot.min.css").read_text(encoding="utf-8")),
        ("{{uplot_js}}", assets.joinpath("vendor/uPlot.iife.min.js").read_text(encoding="utf-8")),
        ("{{data}}", data),
    ):
        page = page.replace(name, text)
    return page


def write_report(paths: list[str | os.PathLike[str]], out: str | os.PathLike[str] | None = None) -> Path:
    """Write the report of the runs under `paths` (overlaid) to `out` (default: PATH/report.html for one path,
    else their common parent's report.html), atomically. Returns where it went."""
    runs = [RunRecord.load(d) for p in paths for d in policy_runs(p)]
    if out is None:
        out = Path(paths[0]) / "report.html" if len(paths) == 1 else Path(os.path.commonpath(paths)) / "report.html"
    title = runs[0].name if len(runs) == 1 else f"{len(runs)} runs: " + ", ".join(r.name for r in runs)
    atomic_write_text(out, render(runs, title))
    return Path(out)
