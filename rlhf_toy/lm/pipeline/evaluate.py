"""Evaluation on held-out prompts: the SFT model, best-of-n from it (ranked by the reward model) and policies.

For each: mean gold score (± its standard error over prompts), mean reward-model score, KL to the reference
(sequence level, nats; best-of-n's is log n - (n - 1) / n), on-topic rate (tasks with a topic), distinct-2,
repetition rate, words per reply and how the gold gain over the first row correlates with the change in words
(`length_link`; a warning when gains go with longer replies), and five samples. On a checkable task (the gold
is right or wrong) also greedy accuracy, pass@1 and pass@k at the sampling temperature, the mean length of right
and of wrong replies, the share of prompts whose k replies are all right or all wrong (a GRPO group of them learns
nothing), the truncation rate and the entropy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from rlhf_toy.advantages import equal_groups
from rlhf_toy.logging import markdown_table

from ..algorithms.kl import per_token_kl
from ..data.tasks import Task
from ..data.text import distinct_2, repetition_rate
from ..models.causal_lm import response_logprobs
from ..models.sampling import sample


def text_metrics(task: Task, prompts: list[str], texts: list[str], rm_scores: list[float]) -> dict[str, Any]:
    gold = task.judge(prompts, texts)
    se = standard_error(gold)
    topic = [task.is_on_topic(p, r) for p, r in zip(prompts, texts)]
    return {
        "gold": float(np.mean(gold)),
        "gold_se": se,
        "gold_scores": [float(g) for g in gold],
        "rm_score": float(np.mean(rm_scores)),
        "on_topic": float(np.mean(topic)) if task.has_topic else None,
        "distinct_2": distinct_2(texts),
        "repetition": repetition_rate(texts),
        "length_words": float(np.mean([len(t.split()) for t in texts])),
        "words": [len(t.split()) for t in texts],
        "samples": [{"prompt": p, "response": r} for p, r in list(zip(prompts, texts))[:5]],
    }


def score_texts(rm, prompts: list[str], texts: list[str]) -> torch.Tensor:
    """Scores `[B]` of replies by a `RewardModel` or by a program reward `(prompts, texts) -> list[float]`."""
    if hasattr(rm, "score_texts"):
        return rm.score_texts(prompts, texts).float().cpu()
    return torch.tensor(rm(prompts, texts), dtype=torch.float32)


@torch.no_grad()
def greedy_accuracy(model, tok, task: Task, prompts: list[str], max_new_tokens: int) -> list[float]:
    """The gold of each prompt's greedy reply (on a checkable task: 1 right, 0 wrong)."""
    s = sample(model, tok, prompts, max_new_tokens, greedy=True)
    return [float(g) for g in task.judge(prompts, s.texts)]


@torch.no_grad()
def checkable_metrics(
    model, tok, task: Task, prompts: list[str], k: int, temperature: float, max_new_tokens: int, seed: int
) -> dict[str, Any]:
    """A checkable task's figures: greedy accuracy (± s.e. over prompts), then from k replies per prompt at
    `temperature`: pass@1 (their mean accuracy), pass@k (some reply right), the mean length in tokens of right and
    of wrong replies, the share of prompts whose k replies are all equal (zero variance: no GRPO signal), the share
    truncated at `max_new_tokens` and the mean per-token entropy (nats)."""
    greedy = greedy_accuracy(model, tok, task, prompts, max_new_tokens)
    torch.manual_seed(seed)
    flat = [p for p in prompts for _ in range(k)]
    s = sample(model, tok, flat, max_new_tokens, temperature, with_logprobs=True)
    right = torch.tensor(task.judge(flat, s.texts), dtype=torch.float32).view(len(prompts), k) > 0.5
    lengths = s.response_mask.sum(1).float().cpu()
    flat_right = right.flatten()
    mean_of = lambda x: float(x.mean()) if len(x) else None  # noqa: E731
    assert s.entropy is not None
    return {
        "accuracy": float(np.mean(greedy)),
        "accuracy_se": standard_error(greedy),
        "accuracy_scores": greedy,
        "pass@1": float(right.float().mean()),
        "pass@k": float(right.any(1).float().mean()),
        "k": k,
        "length_right": mean_of(lengths[flat_right]),
        "length_wrong": mean_of(lengths[~flat_right]),
        "zero_variance": float(equal_groups(flat_right.float(), k).float().mean()),
        "truncated": float((~s.eos).float().mean()),
        "entropy": float(s.entropy.sum() / s.response_mask.sum()),
    }


def best_of_n_kl(n: int) -> float:
    return math.log(n) - (n - 1) / n


@torch.no_grad()
def evaluate_policy(
    name: str,
    model,
    ref_model,
    rm,
    tok,
    task: Task,
    prompts: list[str],
    temperature: float,
    max_new_tokens: int,
    seed: int,
    pass_k: int = 8,
) -> dict[str, Any]:
    """Every figure of one model on `prompts` (the checkable ones with k = `pass_k` on a checkable task)."""
    torch.manual_seed(seed)
    s = sample(model, tok, prompts, max_new_tokens, temperature)
    logp, _ = response_logprobs(model, s.prompt_ids, s.prompt_mask, s.response_ids, temperature)
    ref_logp, _ = response_logprobs(ref_model, s.prompt_ids, s.prompt_mask, s.response_ids, temperature)
    kl = (per_token_kl(logp, ref_logp, "k1") * s.response_mask).sum(1).mean().item()
    scores = score_texts(rm, prompts, s.texts).tolist()
    row = {
        "name": name,
        "kl": kl,
        "eos_rate": float(s.eos.float().mean()),
        **text_metrics(task, prompts, s.texts, scores),
    }
    if task.checkable:
        row.update(checkable_metrics(model, tok, task, prompts, pass_k, temperature, max_new_tokens, seed))
        # the same held-out problems in the phrasings trained on: the in-template figure, beside the headline's
        row["eval_set"] = task.eval_name
        row["extra_accuracy"] = {
            name: greedy_accuracy(model, tok, task, ps[: len(prompts)], max_new_tokens)
            for name, ps in task.extra_evals.items()
        }
    return row


@torch.no_grad()
def best_of_n_texts(
    sft_model, tok, prompts: list[str], n_max: int, temperature: float, max_new_tokens: int, seed: int
) -> list[str]:
    """`n_max` replies per prompt from the SFT model, prompt-major (`[len(prompts) * n_max]`)."""
    torch.manual_seed(seed)
    flat_prompts = [p for p in prompts for _ in range(n_max)]
    return sample(sft_model, tok, flat_prompts, max_new_tokens, temperature).texts


def best_of_n_rows(
    task: Task, prompts: list[str], texts: list[str], scores: torch.Tensor, ns: list[int], label: str = ""
) -> list[dict[str, Any]]:
    """Best-of-n for each n: of the first n of each prompt's replies (`best_of_n_texts`), the one `scores`
    (`[len(texts)]`, the ranking reward) puts highest. `label` is appended to the row names."""
    n_max = len(texts) // len(prompts)
    scores = scores.view(len(prompts), n_max)
    rows = []
    for n in ns:
        best = scores[:, :n].argmax(1).tolist()
        chosen = [texts[i * n_max + b] for i, b in enumerate(best)]
        chosen_scores = scores[torch.arange(len(prompts)), torch.tensor(best)].tolist()
        rows.append(
            {
                "name": f"best-of-{n}{label}",
                "kl": best_of_n_kl(n),
                "eos_rate": None,
                **text_metrics(task, prompts, chosen, chosen_scores),
            }
        )
    return rows


@torch.no_grad()
def evaluate_best_of_n(
    sft_model,
    rm,
    tok,
    task: Task,
    prompts: list[str],
    ns: list[int],
    temperature: float,
    max_new_tokens: int,
    seed: int,
) -> list[dict[str, Any]]:
    """Sample max(ns) replies per prompt once; best-of-n for each n uses the first n of them, ranked by `rm`."""
    texts = best_of_n_texts(sft_model, tok, prompts, max(ns), temperature, max_new_tokens, seed)
    flat_prompts = [p for p in prompts for _ in range(max(ns))]
    return best_of_n_rows(task, prompts, texts, score_texts(rm, flat_prompts, texts), ns)


def mean_se(values: list[float]) -> tuple[float, float]:
    """The mean of `values` and its standard error (0 for one value: one seed has no spread)."""
    return float(np.mean(values)), standard_error(values) if len(values) > 1 else 0.0


def standard_error(values) -> float:
    """The standard error of the mean of `values` (sample std / sqrt n); nan for fewer than 2 values."""
    v = np.asarray(values, dtype=float)
    return float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")


def paired_gain(row: dict[str, Any], reference: dict[str, Any]) -> tuple[float, float]:
    """Mean gold gain over the reference on the same prompts, and its paired standard error."""
    diff = np.asarray(row["gold_scores"]) - np.asarray(reference["gold_scores"])
    return float(diff.mean()), standard_error(diff)


LENGTH_WARNING_R = 0.3  # a gain-length correlation above this, with longer replies, gets the table's warning


def length_link(row: dict[str, Any], reference: dict[str, Any]) -> dict[str, float]:
    """How much of a row's gold gain over `reference` (the same prompts) goes with length (Singhal et al. 2023):
    the mean change in words, and the correlation across prompts of the gold gain with the change in words (nan
    when either does not vary)."""
    gain = np.asarray(row["gold_scores"]) - np.asarray(reference["gold_scores"])
    longer = np.asarray(row["words"], dtype=float) - np.asarray(reference["words"], dtype=float)
    r = float(np.corrcoef(gain, longer)[0, 1]) if gain.std() > 0 and longer.std() > 0 else float("nan")
    return {"words_gain": float(longer.mean()), "gain_length_r": r}


def length_warnings(rows: list[dict[str, Any]]) -> list[str]:
    """One line per row (after the first, the reference) whose gold gain goes with longer replies: correlation
    above `LENGTH_WARNING_R` and more words on average."""
    out = []
    for r in rows[1:]:
        link = length_link(r, rows[0])
        if link["gain_length_r"] > LENGTH_WARNING_R and link["words_gain"] > 0:
            out.append(
                f"{r['name']}: its gold gain over {rows[0]['name']} correlates with reply length (r = "
                f"{link['gain_length_r']:.2f}, {link['words_gain']:+.1f} words): part of the gain may be length, "
                "not quality (Singhal et al. 2023); compare at matched length or train with --length_penalty"
            )
    return out


def format_gain(gain: float, se: float) -> str:
    """`+0.189 ± 0.079 (2.4 s.e.)`; the ratio is left out when the error is zero or unknown (identical scores)."""
    ratio = f" ({gain / se:.1f} s.e.)" if se > 0 else ""
    return f"{gain:+.3f} ± {se:.3f}{ratio}"


def accuracy_cells(scores: list[float], reference: list[float], first: bool) -> list[str]:
    """Greedy accuracy ± s.e. of per-prompt `scores`, and its gain over `reference` (the same prompts) ± paired s.e.
    ("-" for the first row, the reference itself)."""
    gain = np.asarray(scores) - np.asarray(reference)
    return [
        f"{np.mean(scores):.3f} ± {standard_error(scores):.3f}",
        "-" if first else format_gain(float(gain.mean()), standard_error(gain)),
    ]


def checkable_table(rows: list[dict[str, Any]]) -> list[list[str]]:
    """The checkable figures of the rows that have them, as table rows (`CHECKABLE_HEAD`); the first row is the
    reference of the paired gain in greedy accuracy."""
    out = []
    for r in rows:
        if "accuracy" not in r:
            continue
        length = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
        first = r is rows[0]
        extra = [
            cell
            for name, scores in r.get("extra_accuracy", {}).items()
            for cell in accuracy_cells(scores, rows[0]["extra_accuracy"][name], first)
        ]
        out.append(
            [
                r["name"],
                *accuracy_cells(r["accuracy_scores"], rows[0]["accuracy_scores"], first),
                *extra,
                f"{r['pass@1']:.3f}",
                f"{r['pass@k']:.3f}",
                length(r["length_right"]),
                length(r["length_wrong"]),
                f"{r['zero_variance']:.2f}",
                f"{r['truncated']:.3f}",
                f"{r['entropy']:.3f}",
            ]
        )
    return out


def checked_columns(k: int) -> list[str]:
    """The column names of a checkable task's sampled figures, shared by `evaluate` and `compare`."""
    return [
        "pass@1",
        f"pass@{k}",
        "tokens (right)",
        "tokens (wrong)",
        "zero-variance groups",
        "truncated",
        "entropy (nats/token)",
    ]


def checkable_head(k: int, eval_name: str = "held-out", extra: tuple[str, ...] = ()) -> list[str]:
    """The checkable table's columns: greedy accuracy and its paired gain on the headline set (`eval_name`), then
    on each other set (`extra`: the same problems in the training phrasings), then the sampled figures."""
    sets = [
        (f"greedy accuracy, {n} ± s.e.", f"gain over the first row, {n} ± paired s.e.") for n in (eval_name, *extra)
    ]
    return ["model", *[c for pair in sets for c in pair], *checked_columns(k)]


def evaluation_table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of every model's figures (the first row is the reference: the others' gold gain over it
    is paired by prompt, and correlated with their change in words), any length warning, then five sample
    conversations of each."""
    head = [
        "model",
        "gold ± s.e.",
        "gain over the first row ± paired s.e.",
        "RM score",
        "KL (nats)",
        "on topic",
        "distinct-2",
        "repetition",
        "words",
        "gain-length r",
    ]
    gains = [paired_gain(r, rows[0]) for r in rows]
    links = [length_link(r, rows[0]) for r in rows]
    out = markdown_table(
        head,
        [
            [
                r["name"],
                f"{r['gold']:.3f} ± {r['gold_se']:.3f}",
                "-" if r is rows[0] else format_gain(g, se),
                f"{r['rm_score']:.2f}",
                f"{r['kl']:.2f}",
                "-" if r["on_topic"] is None else f"{r['on_topic']:.3f}",
                f"{r['distinct_2']:.3f}" if math.isfinite(r["distinct_2"]) else "n/a",
                f"{r['repetition']:.3f}",
                f"{r['length_words']:.1f}",
                "-"
                if r is rows[0] or link["gain_length_r"] != link["gain_length_r"]
                else f"{link['gain_length_r']:.2f}",
            ]
            for r, (g, se), link in zip(rows, gains, links)
        ],
    )
    out += "".join(f"\n**Length.** {w}\n" for w in length_warnings(rows))
    checkable = [r for r in rows if "accuracy" in r]
    if checkable and checkable[0] is rows[0]:
        out += "\nChecked answers (greedy, and k replies per prompt at the sampling temperature):\n\n"
        extra = tuple(rows[0].get("extra_accuracy", {}))
        out += markdown_table(
            checkable_head(rows[0]["k"], rows[0].get("eval_set", "held-out"), extra), checkable_table(rows)
        )
    for r in rows:
        out += f"\n**{r['name']}**\n\n" + "".join(f"- {s['prompt']} -> {s['response']}\n" for s in r["samples"])
    return out
