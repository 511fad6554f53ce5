"""Preference pairs from the SFT model's own samples, labelled by the gold judge.

For each prompt: sample k responses, score each once with the gold judge, and form every pair within the group
whose gold scores differ. A pair's label is a Bradley-Terry draw, chosen beats rejected with probability
sigmoid((g_chosen - g_rejected) / bt_scale), or, with `soft_labels`, that probability itself. k samples per
prompt with all pairs give far more informative pairs per sample than two samples per prompt.

A share of groups gets one response taken from another prompt (`offtopic_fraction`): SFT samples are almost
never off topic, so without these a reward model never learns that the judge punishes dropping the topic, and
PPO later finds that blind spot.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from rlhf_toy.config import check, option
from rlhf_toy.errors import UserError

from .tasks import Judge

COLUMNS = ["prompt", "chosen", "rejected", "chosen_score", "rejected_score", "label"]


@dataclass
class PreferenceConfig:
    """How preference pairs are built."""

    n_prompts: int = option("Training prompts to sample for.", 2000)
    k: int = option("Samples per prompt; all pairs within a group are used.", 4)
    temperature: float = option("Sampling temperature.", 1.0)
    max_new_tokens: int = option("Longest sampled response.", 32)
    bt_scale: float = option("Label noise: P(a > b) = sigmoid((g_a - g_b) / scale).", 0.1)
    soft_labels: bool = option("Keep P(chosen > rejected) as a soft label.", False)
    offtopic_fraction: float = option("Share of groups given a reply to another prompt.", 0.1)
    n_eval_prompts: int = option("Held-out prompts for reward-model evaluation.", 200)

    def __post_init__(self) -> None:
        check(self.k >= 2, "k", self.k, ">= 2 to form pairs, e.g. 4")
        for name in ("n_prompts", "n_eval_prompts", "max_new_tokens"):
            check(getattr(self, name) >= 1, name, getattr(self, name), ">= 1")
        check(self.temperature > 0, "temperature", self.temperature, "> 0, e.g. 1.0")
        check(self.bt_scale > 0, "bt_scale", self.bt_scale, "> 0, e.g. 0.1")
        check(0 <= self.offtopic_fraction <= 1, "offtopic_fraction", self.offtopic_fraction, "in [0, 1]")


@dataclass
class Groups:
    """k responses per prompt with their gold scores: `responses[i][j]` is the j-th reply to `prompts[i]`."""

    prompts: list[str]
    responses: list[list[str]]
    scores: list[list[float]]


def group_replies(prompts: list[str], texts: list[str], judge: Judge, cfg: PreferenceConfig, seed: int) -> Groups:
    """Groups of `cfg.k` sampled replies per prompt (`texts`: k in a row per prompt, as `sample` of each prompt
    repeated k times draws them), a share of them given an off-topic reply, scored by the gold judge. The sampling
    itself is the pipeline's (`data` sits below `models`)."""
    rng = random.Random(seed)
    responses = [texts[i * cfg.k : (i + 1) * cfg.k] for i in range(len(prompts))]
    if len(prompts) > 1:
        for i in range(len(prompts)):
            if rng.random() < cfg.offtopic_fraction:
                other = (i + rng.randrange(1, len(prompts))) % len(prompts)
                responses[i][rng.randrange(cfg.k)] = rng.choice(responses[other])
    scores_flat = judge([p for p in prompts for _ in range(cfg.k)], [r for group in responses for r in group])
    scores = [scores_flat[i * cfg.k : (i + 1) * cfg.k] for i in range(len(prompts))]
    return Groups(prompts, responses, scores)


def pairs_from_groups(groups: Groups, cfg: PreferenceConfig, seed: int) -> dict[str, list]:
    """All within-group pairs with different gold scores, labelled as the module docstring says."""
    rng = random.Random(seed)
    rows: dict[str, list] = {c: [] for c in COLUMNS}
    for prompt, responses, scores in zip(groups.prompts, groups.responses, groups.scores):
        for a in range(len(responses)):
            for b in range(a + 1, len(responses)):
                if scores[a] == scores[b] or responses[a] == responses[b]:
                    continue
                p_a = 1.0 / (1.0 + math.exp(-(scores[a] - scores[b]) / cfg.bt_scale))
                if cfg.soft_labels:
                    win, lose, label = (a, b, p_a) if p_a >= 0.5 else (b, a, 1.0 - p_a)
                else:
                    win, lose, label = (a, b, 1.0) if rng.random() < p_a else (b, a, 1.0)
                for col, v in zip(COLUMNS, (prompt, responses[win], responses[lose], scores[win], scores[lose], label)):
                    rows[col].append(v)
    return rows


def check_preferences(ds, where: str) -> None:
    """A preference dataset needs prompt/chosen/rejected columns and at least one row."""
    missing = [c for c in ("prompt", "chosen", "rejected") if c not in ds.column_names]
    if missing:
        raise UserError(
            f"{where} lacks the column(s) {missing}; a preference file needs prompt, chosen and rejected "
            f"(it has {ds.column_names})"
        )
    if len(ds) == 0:
        raise UserError(f"{where} holds no preference pairs; sample more prompts or check the judge's scores differ")
    for column in ("prompt", "chosen", "rejected"):
        for i, value in enumerate(ds[column]):
            if not isinstance(value, str):
                raise UserError(
                    f"{where}: row {i + 1} has a {type(value).__name__} in '{column}' ({value!r}), not "
                    "a text; every prompt, chosen and rejected must be a string"
                )
