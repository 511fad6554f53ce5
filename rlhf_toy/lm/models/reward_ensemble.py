"""Remedies against reward hacking on the reward model's side: ensembles, weight averaging (WARM), length.

- **Ensemble** (Coste et al. 2024): K reward models trained on the same pairs, differing in seed (the head's
  initialization and the data order) and optionally in a bootstrap resample of the pairs. Saved as one directory:
  `ensemble.json` (the member list) and `member_0/ ... member_{K-1}/`, each a plain reward-model directory with
  its own normalization (reference samples score mean 0, std 1 under every member, so their scores are on one
  scale). Objectives over the members' scores `[K, B]` (`combine_scores`): `mean`; `worst` (the minimum: a reply
  scores only what every member grants it); `uncertainty` (mean - lambda * variance across members: Coste et
  al.'s uncertainty-weighted optimization).
- **WARM** (Rame et al. 2024): members fine-tuned from one initialization, their weights averaged
  (`average_weights`) into one model: one model's cost at inference. Weight averaging is only meaningful for
  models that share an initialization, so each member records a digest of its initial weights (`reward_init`
  in its config) and averaging refuses members whose digests differ.
- **Length** (Singhal et al. 2023): `ScoredReward` subtracts `length_penalty` x words from every score.

`ScoredReward` is what the stages hand to the trainer, best-of-n and evaluation: members' scores combined by the
objective, less the length penalty. It has `RewardModel`'s interface (`score_texts`, `score_samples`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlhf_toy.errors import UserError
from rlhf_toy.io import atomic_dir

from .reward_model import RewardModel, load_reward_model, same_tokenizer

ENSEMBLE_FILE = "ensemble.json"
OBJECTIVES = ("mean", "worst", "uncertainty")


def combine_scores(scores: Tensor, objective: str, coef: float = 0.0) -> Tensor:
    """The members' scores `[K, B]` as one score per reply `[B]`: `mean`, `worst` (min over members) or
    `uncertainty` (mean - coef * variance over members, the population variance: divided by K)."""
    if objective == "mean":
        return scores.mean(0)
    if objective == "worst":
        return scores.min(0).values
    if objective == "uncertainty":
        return scores.mean(0) - coef * scores.var(0, unbiased=False)
    raise ValueError(f"unknown objective {objective!r}; one of {', '.join(OBJECTIVES)}")


def words(texts: list[str]) -> Tensor:
    """Words (whitespace-separated) per reply `[B]`."""
    return torch.tensor([float(len(t.split())) for t in texts])


@dataclass
class ScoredReward:
    """Reward models (one, or an ensemble's members) and the objective that makes their scores one reward:
    `combine_scores(member scores, objective, coef) - length_penalty * words`. `RewardModel`'s interface."""

    members: list[RewardModel]
    objective: str = "mean"
    coef: float = 0.0
    length_penalty: float = 0.0

    def __post_init__(self) -> None:
        if self.objective != "mean" and len(self.members) < 2:
            raise UserError(
                f"--reward_objective {self.objective} takes the {'minimum' if self.objective == 'worst' else 'spread'}"
                " over an ensemble's members, and this reward model is one model; train an ensemble "
                "(reward --ensemble 5 --reward_dir reward_ensemble) and pass its --reward_dir, or use "
                "--reward_objective mean"
            )

    def member_texts(self, prompts: list[str], responses: list[str]) -> Tensor:
        """Every member's normalized scores `[K, B]`."""
        return torch.stack([m.score_texts(prompts, responses).float().cpu() for m in self.members])

    def member_samples(self, s, policy_tok) -> Tensor:
        """Every member's normalized scores `[K, B]` of sampled replies (`Samples`)."""
        return torch.stack([m.score_samples(s, policy_tok).float().cpu() for m in self.members])

    def objective_of(self, member_scores: Tensor, texts: list[str]) -> Tensor:
        """`[K, B]` member scores and the replies -> the reward `[B]`."""
        out = combine_scores(member_scores, self.objective, self.coef)
        return out - self.length_penalty * words(texts) if self.length_penalty else out

    @torch.no_grad()
    def score_texts(self, prompts: list[str], responses: list[str]) -> Tensor:
        return self.objective_of(self.member_texts(prompts, responses), responses)

    @torch.no_grad()
    def score_samples(self, s, policy_tok) -> Tensor:
        return self.objective_of(self.member_samples(s, policy_tok), s.texts)

    def to(self, device) -> ScoredReward:
        for m in self.members:
            m.model.to(device)
        return self


class MemberScores:
    """A `ScoredReward`'s member scores `[K, B]` of each set of replies, computed once: the reward stage scores its
    held-out pairs for every member and every objective, `compare` ranks best-of-n's replies under every
    objective and length penalty, each from the same member scores."""

    def __init__(self, reward: ScoredReward) -> None:
        self.reward = reward
        self.seen: dict[tuple[tuple[str, ...], tuple[str, ...]], Tensor] = {}

    def __call__(self, prompts: list[str], responses: list[str]) -> Tensor:
        key = (tuple(prompts), tuple(responses))
        if key not in self.seen:
            self.seen[key] = self.reward.member_texts(prompts, responses)
        return self.seen[key]

    def member(self, i: int):
        """Member i's scores `[B]` as a `(prompts, responses) -> Tensor` function."""
        return lambda prompts, responses: self(prompts, responses)[i]

    def under(self, objective: ScoredReward):
        """The reward `[B]` under `objective` (the same members, another objective or length penalty)."""
        return lambda prompts, responses: objective.objective_of(self(prompts, responses), responses)


def is_ensemble(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / ENSEMBLE_FILE).is_file()


def is_reward_dir(path: str | os.PathLike[str]) -> bool:
    """Whether a model folder holds a reward model (a sequence classifier) or an ensemble of them."""
    if is_ensemble(path):
        return True
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or [])


def is_plain_name(name: object) -> bool:
    """A file name with no path in it: not empty, no separator, not `.` or `..`."""
    return isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name and "\\" not in name


def member_dirs(path: str | os.PathLike[str]) -> list[Path]:
    """The member directories an ensemble directory lists, each checked to hold a reward model."""
    path = Path(path)
    try:
        names = json.loads((path / ENSEMBLE_FILE).read_text())["members"]
    except (ValueError, KeyError, TypeError):
        names = None
    # Each member is a directory inside this one: a name that is a path (`a/b`, `..`, `/abs`) could reach outside.
    if not (isinstance(names, list) and names and all(is_plain_name(n) for n in names)):
        raise UserError(
            f"{path / ENSEMBLE_FILE} does not list the ensemble's members as directory names inside it; retrain it "
            "with reward --ensemble K"
        )
    for name in names:
        if not (path / name / "config.json").is_file():
            raise UserError(
                f"the reward ensemble in {path} lacks its member {name} ({len(names)} listed in {ENSEMBLE_FILE}); "
                f"retrain it with reward --ensemble {len(names)}"
            )
    return [path / n for n in names]


def load_scored_reward(
    path: str | os.PathLike[str],
    policy_tok,
    reads: str = "auto",
    objective: str = "mean",
    coef: float = 0.0,
    length_penalty: float = 0.0,
) -> ScoredReward:
    """The reward model or ensemble in `path` under an objective. An ensemble's members must share one tokenizer
    (they read the same replies the same way)."""
    dirs = member_dirs(path) if is_ensemble(path) else [Path(path)]
    members = [load_reward_model(d, policy_tok, reads) for d in dirs]
    for d, m in zip(dirs[1:], members[1:]):
        if not same_tokenizer(m.tok, members[0].tok):
            raise UserError(
                f"ensemble member {d.name} of {path} has another tokenizer than {dirs[0].name}; an ensemble's "
                "members read replies with one tokenizer: retrain it with reward --ensemble K"
            )
    return ScoredReward(members, objective, coef, length_penalty)


def save_ensemble(path: str | os.PathLike[str], models: list[Any], tok, info: dict[str, Any]) -> None:
    """Members and `ensemble.json` (member names plus `info`) as one directory, renamed into place at once."""
    with atomic_dir(path) as tmp:
        names = [f"member_{i}" for i in range(len(models))]
        for name, model in zip(names, models):
            model.save_pretrained(tmp / name)
            tok.save_pretrained(tmp / name)
        (tmp / ENSEMBLE_FILE).write_text(json.dumps({"members": names, **info}, indent=1))


def weights_digest(model) -> str:
    """A hash of a model's parameters (names, shapes and bytes): the identity of an initialization."""
    h = hashlib.blake2b(digest_size=16)
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode() + str(tuple(p.shape)).encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def average_weights(models: list[Any], names: list[str] | None = None):
    """WARM: a copy of `models[0]` whose floating-point weights are the members' mean. Every member must record
    the same initialization (`config.reward_init`, set before fine-tuning): averaging models fine-tuned from
    different starting points mixes unrelated weights."""
    names = names or [f"member {i}" for i in range(len(models))]
    inits = [getattr(m.config, "reward_init", None) for m in models]
    for name, init in zip(names, inits):
        if init is None or init != inits[0]:
            raise UserError(
                f"WARM averages reward models fine-tuned from one initialization, and {name} started from another "
                f"than {names[0]} (an --ensemble run draws each member's head from its own seed); train the "
                "members with reward --warm K (or --ensemble K --shared_init)"
            )
    out = copy.deepcopy(models[0])
    states = [m.state_dict() for m in models]
    averaged = {
        k: torch.stack([s[k].float() for s in states]).mean(0).to(v.dtype) if v.is_floating_point() else v
        for k, v in states[0].items()
    }
    out.load_state_dict(averaged)
    out.config.warm_members = len(models)
    return out
