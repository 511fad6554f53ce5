"""Remedies against reward over-optimization, one record each: what `compare --remedies` runs beside one reward
model, and what the docs' table of remedies lists.

A remedy is a change of what the policy optimizes (`reward_dir` + `objective` + `length_penalty`: the run's
`RunConfig` fields) or of where the KL goes (`rl`: `RLHFConfig` fields). Remedies on the reward side also rank
best-of-n. The reward models they need (an ensemble, a WARM average) are trained once per run directory
(`prepare_reward_models`, with the run's reward-stage settings: `member_config`) and reused by every comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from torch import Tensor

from rlhf_toy.errors import note_once

from ..algorithms.reward import RewardConfig
from ..data.tasks import Task
from ..models.lora import LoraConfig
from ..models.reward_ensemble import MemberScores, ScoredReward
from .evaluate import score_texts
from .reward_stage import train_reward
from .run import RunConfig
from .stages import task_reward

ENSEMBLE_DIR, WARM_DIR = "reward_ensemble", "reward_warm"
ENSEMBLE_SIZE = 5  # Coste et al. 2024: 4-5 members
LENGTH_PENALTY = 0.05  # per word: a reply 10 words longer pays 0.5 of a reference std of the reward model


@dataclass(frozen=True)
class Remedy:
    name: str
    label: str
    summary: str
    reward_dir: str | None = None  # None: the run's --reward_dir
    objective: str | None = None  # None: the run's --reward_objective
    length_penalty: float | None = None  # None: the run's --length_penalty
    rl: dict[str, Any] = field(default_factory=dict)  # RLHFConfig fields it changes

    @property
    def ranks_best_of_n(self) -> bool:
        """Whether it changes the reward (best-of-n ranks by it), not only the RL update."""
        return not self.rl

    def run_config(self, run: RunConfig) -> RunConfig:
        """The run as this remedy scores replies (lambda of the uncertainty objective: the run's)."""
        return replace(
            run,
            reward_dir=self.reward_dir or run.reward_dir,
            reward_objective=self.objective or run.reward_objective,
            length_penalty=run.length_penalty if self.length_penalty is None else self.length_penalty,
        )


REMEDIES = {
    r.name: r
    for r in (
        Remedy(
            "none", "one reward model", "The run's reward model alone (the baseline every remedy is measured against)."
        ),
        Remedy(
            "ensemble_mean",
            "ensemble, mean",
            f"{ENSEMBLE_SIZE} reward models of different seeds, their mean score.",
            ENSEMBLE_DIR,
            "mean",
        ),
        Remedy(
            "ensemble_worst",
            "ensemble, worst case",
            "The minimum over the members (Coste et al. 2024's worst-case optimization).",
            ENSEMBLE_DIR,
            "worst",
        ),
        Remedy(
            "ensemble_uncertainty",
            "ensemble, mean - lambda var",
            "The members' mean less lambda times their variance (Coste et al. 2024's uncertainty-weighted "
            "optimization).",
            ENSEMBLE_DIR,
            "uncertainty",
        ),
        Remedy(
            "warm",
            "WARM",
            f"{ENSEMBLE_SIZE} reward models fine-tuned from one initialization, weights averaged (Rame et al. 2024).",
            WARM_DIR,
            "mean",
        ),
        Remedy(
            "length",
            f"length penalty {LENGTH_PENALTY}/word",
            "One reward model less a penalty per word (against length-driven gains, Singhal et al. 2023).",
            length_penalty=LENGTH_PENALTY,
        ),
        Remedy(
            "kl_k3_loss",
            "KL as k3 in the loss",
            "One reward model; the KL penalty as beta x k3 in the loss instead of -beta x k1 in the reward.",
            rl={"kl_in": "loss", "kl_estimator": "k3"},
        ),
        Remedy(
            "kl_k2_loss",
            "KL as k2 in the loss",
            "One reward model; the KL penalty as beta x k2 (0.5 log-ratio squared) in the loss.",
            rl={"kl_in": "loss", "kl_estimator": "k2"},
        ),
    )
}


TRAINED_HERE = {ENSEMBLE_DIR: "ensemble", WARM_DIR: "warm"}  # reward models remedies need: RewardConfig's field


def member_config(run: RunConfig, kind: str) -> tuple[RewardConfig, LoraConfig]:
    """The settings of the run's reward stage (its report's config: the same training for every member as for
    the one model the remedies are measured against), with `kind` (ensemble or warm) set to `ENSEMBLE_SIZE`."""
    report = run.dir.load_json(run.dir.reward_report)
    if report is None:
        note_once(
            f"{run.dir.reward_report} is missing, so the {kind} members train on the reward stage's defaults; run "
            "the reward stage first to give them its settings"
        )
    saved = (report or {}).get("config", {})
    own = lambda cls: {f.name: saved[f.name] for f in fields(cls) if f.init and f.name in saved}  # noqa: E731
    reward = {**own(RewardConfig), "ensemble": 1, "warm": 1, "warm_from": None, kind: ENSEMBLE_SIZE}
    return RewardConfig(**reward), LoraConfig(**own(LoraConfig))


def prepare_reward_models(run: RunConfig, remedies: list[Remedy]) -> None:
    """Train the ensemble and WARM reward models the remedies need, once per run directory (an existing one is
    reused: delete it to retrain), with the run's reward-stage settings."""
    for name in sorted({r.reward_dir for r in remedies if r.reward_dir in TRAINED_HERE}):
        member_run = replace(run, reward_dir=name, reward_objective="mean", length_penalty=0.0)
        if not member_run.dir.reward_model.is_dir():
            cfg, lora = member_config(run, TRAINED_HERE[name])
            print(f"training run_dir/{name} for the remedies ({ENSEMBLE_SIZE} reward models)")
            train_reward(member_run, cfg, lora)


class RewardCache:
    """Each remedy's reward, every reward directory loaded once (objectives and length penalties share its
    members, and their scores of a set of replies: `MemberScores`)."""

    def __init__(self, run: RunConfig, task: Task, tok, device) -> None:
        self.run, self.task, self.tok, self.device = run, task, tok, device
        self.loaded: dict[str, Any] = {}
        self.member_scores: dict[str, MemberScores] = {}

    def of(self, remedy: Remedy):
        """The reward a remedy optimizes (a `ScoredReward`, or the task's program)."""
        r = remedy.run_config(self.run)
        if r.reward_dir not in self.loaded:
            plain = replace(r, reward_objective="mean", length_penalty=0.0)
            self.loaded[r.reward_dir] = task_reward(plain, self.task, self.tok, self.device)
        base = self.loaded[r.reward_dir]
        if not isinstance(base, ScoredReward):
            return task_reward(r, self.task, self.tok, self.device)  # a program: refuses what it cannot honour
        return replace(base, objective=r.reward_objective, coef=r.uncertainty_coef, length_penalty=r.length_penalty)

    def score_texts(self, remedy: Remedy, prompts: list[str], texts: list[str]) -> Tensor:
        """The remedy's rewards `[B]` of replies (each reward directory's members score a set of replies once)."""
        reward = self.of(remedy)
        if not isinstance(reward, ScoredReward):
            return score_texts(reward, prompts, texts)
        key = remedy.run_config(self.run).reward_dir
        if key not in self.member_scores:
            self.member_scores[key] = MemberScores(reward)
        return self.member_scores[key].under(reward)(prompts, texts)


# The lab's two comparisons (CompareConfig's defaults plus these differences, one level each).
REMEDIES_LAB = {  # every remedy with PPO at the default budget, 3 seeds, at the beta where one reward model comes
    "methods": "ppo",  # closest to best-of-64 (0.881 gold at 2.85 nats with beta 0.05, 2026-12-03)
    "kl_coef": "0.05",
    "remedies": "none,ensemble_worst,ensemble_uncertainty,warm,length,kl_k3_loss",
    "name": "remedies",
}
OVEROPTIMIZATION = {  # long enough at a small beta that one reward model's gold peaks and falls
    "methods": "ppo",
    "remedies": "none,ensemble_worst,ensemble_uncertainty,warm,length",
    "kl_coef": "0.003",  # one reward model's gold peaks near step 30 and falls to about -0.9 by step 60 (probed)
    "episodes": 9600,
    "seeds": "0",
    "name": "overopt_remedies",
}
