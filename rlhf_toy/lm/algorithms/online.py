"""The online RLHF algorithms: one frozen `OnlineAlgorithm` record each, in one table, `ALGORITHMS`.

They share everything up to the rewards (sampling, log-probs, the reward model, the per-token KL); a record
says only what differs: how rewards become advantages (its `advantages` function, built on the core's
`rlhf_toy.advantages`), which policy loss `ppo_update` applies, whether the value head is a critic, how many
replies it samples per prompt, its preset (the update's settings) and its rollout settings (DAPO's dynamic
sampling, say). Every command, label, comparison
method, benchmark row and reference page is derived from this table (`rlhf-toy ppo|reinforce|...`,
`compare --methods`, `docs/reference/algorithms.md`).

Adding an algorithm: write its advantage function here (on the core's functions) or its loss in
`rlhf_toy.losses`, add one record to `ALGORITHMS`, and its tests (docs/contributing.md has the recipe).

A sequence reward is the reward-model score minus beta times the sequence KL (with the KL in the loss, the
score alone). Each preset is `PPOConfig`'s defaults plus its own differences, one level: no preset is derived
from another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor

from rlhf_toy.advantages import discounted_returns, dr_grpo_advantages, gae, grpo_advantages, rloo_advantages
from rlhf_toy.config import given
from rlhf_toy.errors import UserError, note_once
from rlhf_toy.masks import last_real_index
from rlhf_toy.ppo import POLICY_LOSSES, PPOConfig

from .rlhf_config import RLHFConfig


@dataclass(frozen=True)
class Signals:
    """What one batch of rollouts gives an advantage function. Tensors are `[B, R]` (B replies of R tokens)
    unless noted; the replies to one prompt are consecutive rows."""

    rewards: Tensor  # per token: -beta * KL, plus the reward-model score at the last real token
    scores: Tensor  # [B] reward-model scores
    kl: Tensor  # per-token KL to the reference, the penalty's estimator (0 on padding)
    values: Tensor  # the value head's estimates (0 on padding, and 0 without a critic)
    mask: Tensor  # 1 on real response tokens
    beta: float  # the KL coefficient in the reward this step (0 when the KL is a loss term: --kl_in loss)
    # [B] the value of the state after each row's last real step where the episode was cut there (an agent's turn or
    # context limit), 0 where it terminated; None: every row terminated (a reply). A critic bootstraps from it.
    bootstrap: Tensor | None = None


# `(signals, ppo, group_size) -> (advantages [B, R], value targets [B, R])`
AdvantageFn = Callable[[Signals, PPOConfig, int], tuple[Tensor, Tensor]]

RL_FIELDS = frozenset(f.name for f in fields(RLHFConfig) if f.init)
PPO_FIELDS = frozenset(f.name for f in fields(PPOConfig) if f.init)
FIELD_DEFAULTS = {f.name: f.default for cls in (RLHFConfig, PPOConfig) for f in fields(cls) if f.init}

# The settings only some algorithms read, by the part of the algorithm that reads them; every other field of
# `RLHFConfig` and `PPOConfig` is read by every online algorithm. A record reads a part's settings when it has the
# part (`OnlineAlgorithm.reads`); a setting it does not read is refused, never ignored (`OnlineAlgorithm.configs`).
CLIPPED_SETTINGS = ("clip", "clip_range", "clip_range_high", "anneal_clip", "ratio_level")  # the clipped surrogate
# the value head's loss, its learning rate, and the steps that train it alone
CRITIC_SETTINGS = ("vf_coef", "clip_range_vf", "value_lr_scale", "critic_warmup")
ADVANTAGE_SETTINGS = ("gamma", "gae_lambda")  # each advantage function names those it reads (`reads_settings`)


def reads_settings(*names: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Mark an advantage function with the `ADVANTAGE_SETTINGS` it reads (`fn.reads`)."""

    def mark(fn: AdvantageFn) -> AdvantageFn:
        fn.reads = names  # type: ignore[attr-defined]
        return fn

    return mark


def terminal_steps(mask: Tensor) -> Tensor:
    """`[B, R]` bool: True at each reply's last real token (the end of its episode)."""
    terminated = torch.zeros_like(mask, dtype=torch.bool)
    terminated[torch.arange(mask.shape[0], device=mask.device), last_real_index(mask)] = True
    return terminated


@reads_settings("gamma", "gae_lambda")
def token_gae(s: Signals, ppo: PPOConfig, group_size: int) -> tuple[Tensor, Tensor]:
    """PPO: the core's `gae` over response tokens (or an agent's turns; time-major for the core); the last real step
    ends it, terminated, or cut and bootstrapped from `s.bootstrap` (the lesson's truncated episode)."""
    next_values = torch.cat([s.values[:, 1:], torch.zeros_like(s.values[:, :1])], 1)
    done = terminal_steps(s.mask)
    if s.bootstrap is None:
        terminated, truncated = done, None
    else:  # each row ends in a cut whose next value is its bootstrap (0 where it terminated: the same thing)
        next_values = torch.where(done, s.bootstrap[:, None].to(next_values.dtype), next_values)
        terminated, truncated = torch.zeros_like(done), done
    adv, ret = gae(
        s.rewards.T,
        s.values.T,
        next_values.T,
        terminated.T,
        None if truncated is None else truncated.T,
        gamma=ppo.gamma,
        lam=ppo.gae_lambda,
        mask=s.mask.T,
    )
    return adv.T, ret.T


@reads_settings("gamma")
def token_returns(s: Signals, ppo: PPOConfig, group_size: int) -> tuple[Tensor, Tensor]:
    """REINFORCE: the core's `discounted_returns` of the per-token rewards, no baseline."""
    ret = discounted_returns(s.rewards.T, terminal_steps(s.mask).T, gamma=ppo.gamma, mask=s.mask.T).T
    return ret * s.mask, ret


@reads_settings("gamma")
def token_returns_minus_values(s: Signals, ppo: PPOConfig, group_size: int) -> tuple[Tensor, Tensor]:
    """REINFORCE with a learned baseline: the returns minus the value head's estimate."""
    adv, ret = token_returns(s, ppo, group_size)
    return adv - s.values * s.mask, ret


def group_baseline(core: Callable[[Tensor, int], Tensor]) -> AdvantageFn:
    """An advantage function from a core group baseline (`rloo_advantages`, `grpo_advantages`, ...): one sequence
    reward per reply (the score, less beta times its KL; beta is 0 when the KL is in the loss), compared within
    its group, on every token of the reply."""

    def advantages(s: Signals, ppo: PPOConfig, group_size: int) -> tuple[Tensor, Tensor]:
        sequence = s.scores - s.beta * s.kl.sum(1) if s.beta else s.scores
        return core(sequence, group_size)[:, None] * s.mask, sequence[:, None] * s.mask

    advantages.__name__ = advantages.__qualname__ = f"group_baseline({core.__name__})"
    return reads_settings()(advantages)  # a reply's reward is one number: no per-token discount, no GAE


@dataclass(frozen=True, eq=False)
class OnlineAlgorithm:
    """One online algorithm's identity. `name` is its `--algorithm`-style key, run-directory name and
    `compare` method; its command is `name` with '-' for '_'."""

    name: str
    label: str  # in tables and plots
    summary: str  # the command's help line
    preset: PPOConfig  # the command's defaults for the update
    advantages: AdvantageFn
    policy_loss: str  # `ppo_update`'s: "clipped" surrogate or plain "pg" (-log pi * A)
    uses_critic: bool  # its advantages read the value head
    default_group_size: int = 1  # replies per prompt (k); > 1: advantages compare the replies of one prompt
    rollout: dict[str, Any] = field(default_factory=dict)  # RLHFConfig's defaults it changes (DAPO's sampling)
    paper: str = ""  # where it comes from

    def __post_init__(self) -> None:
        if self.policy_loss not in POLICY_LOSSES:
            raise UserError(f"{self.name}: policy_loss must be one of {POLICY_LOSSES}, not {self.policy_loss!r}")
        unknown = set(self.rollout) - RL_FIELDS
        if unknown:
            raise UserError(f"{self.name}: rollout names no RLHFConfig field: {sorted(unknown)}")

    @property
    def defaults(self) -> dict[str, Any]:
        """Its command's defaults: the preset's update settings, its group size and its rollout settings."""
        return {**self.preset.to_dict(), "group_size": self.default_group_size, **self.rollout}

    @property
    def command(self) -> str:
        return self.name.replace("_", "-")

    @property
    def grouped(self) -> bool:
        return self.default_group_size > 1

    def needs_values(self, ppo: PPOConfig) -> bool:
        """Whether a rollout must run the value head: for a critic's advantages, or a value loss that counts."""
        return self.uses_critic or ppo.vf_coef > 0

    @property
    def unread(self) -> dict[str, str]:
        """The settings this algorithm does not read, each with why: its command refuses them."""
        why: dict[str, str] = {}
        if self.policy_loss != "clipped":
            for name in CLIPPED_SETTINGS:
                why[name] = f"{self.name}'s loss is the plain policy gradient (-log pi * A): it has no ratio to clip"
        if not self.uses_critic:
            for name in CRITIC_SETTINGS:
                why[name] = f"{self.name} has no critic: its advantages never read a value head"
        for name in ADVANTAGE_SETTINGS:
            if name not in getattr(self.advantages, "reads", ADVANTAGE_SETTINGS):
                why[name] = (
                    f"{self.name}'s advantages compare whole replies' rewards in a group: no per-token discount"
                    if self.grouped
                    else f"{self.name}'s advantages are returns, not GAE"
                )
        return why

    @property
    def reads(self) -> frozenset[str]:
        """Every setting (field of `RLHFConfig` or `PPOConfig`) this algorithm reads."""
        return (RL_FIELDS | PPO_FIELDS) - set(self.unread)

    def configs(self, **overrides: Any) -> tuple[RLHFConfig, PPOConfig]:
        """`(RLHFConfig, PPOConfig)` of this algorithm: its record (preset, group size, rollout) with `overrides`
        (fields of either config). The one place a record becomes settings: the commands, `compare`, the
        benchmarks and `RLHFTrainer(algorithm=...)` all go through it. A setting it does not read, or no setting
        at all, is a `UserError` naming it."""
        unread = self.unread
        for name in overrides:
            if name not in RL_FIELDS | PPO_FIELDS:
                raise UserError(f"{name!r} is not a setting of the online algorithms (RLHFConfig or PPOConfig)")
            if name in unread:
                raise UserError(f"{self.name} does not read {name}: {unread[name]}; leave it out")
        rl = {k: v for k, v in overrides.items() if k in RL_FIELDS}
        ppo = {k: v for k, v in overrides.items() if k in PPO_FIELDS}
        rl_cfg = RLHFConfig(**{"group_size": self.default_group_size, **self.rollout, **rl})
        ppo_cfg = replace(self.preset, **ppo)
        self.check(rl_cfg, ppo_cfg)
        return rl_cfg, ppo_cfg

    def settle(
        self, cfg: RLHFConfig | None, ppo: PPOConfig | None, task: dict[str, Any] | None = None
    ) -> tuple[RLHFConfig, PPOConfig]:
        """What a trainer runs, given a caller's configs (None: the record's): this record, with every field the
        caller gave that differs from it (a config built by `configs`, by `dataclasses.replace` or by the command
        line gives every field; `RLHFConfig(batch_size=16)` gives one). An override of a value the record sets is
        said once on stderr; a setting the algorithm does not read is refused (`configs`). `task`: the settings of
        the task or environment it runs on (an agent's environment record), those the algorithm reads and its
        rollout does not set (DAPO keeps its KL of 0 wherever it runs), under the caller's."""
        task = {k: v for k, v in (task or {}).items() if k in self.reads and k not in self.rollout}
        base_rl, base_ppo = self.configs(**task)
        overrides: dict[str, Any] = dict(task)
        for mine, theirs in ((base_rl, cfg), (base_ppo, ppo)):
            if theirs is not None:
                overrides.update(
                    {k: getattr(theirs, k) for k in sorted(given(theirs)) if getattr(theirs, k) != getattr(mine, k)}
                )
        settled = self.configs(**overrides)
        own = self.defaults  # the values the record sets: a changed one is worth a word
        changed = [k for k in overrides if k in own and own[k] != FIELD_DEFAULTS[k] and k not in task]
        if changed:
            shown = ", ".join(f"{k}={overrides[k]!r} (its record: {own[k]!r})" for k in changed)
            note_once(f"{self.name} runs with {shown}, as given")  # once: compare's seeds, a resumed run
        return settled

    def check(self, cfg: RLHFConfig, ppo: PPOConfig) -> None:
        """Refuse settings this algorithm cannot honour, with the fix, before any work."""
        group_size, batch_size, minibatch_size = cfg.group_size, cfg.batch_size, ppo.minibatch_size
        if self.grouped and group_size < 2:
            raise UserError(
                f"{self.name} needs at least 2 samples per prompt to compare them; set group_size to "
                f"{self.default_group_size} (--group_size {self.default_group_size})"
            )
        if cfg.dynamic_sampling and group_size < 2:
            raise UserError(
                "--dynamic_sampling drops groups of equal rewards, so it needs groups: pass --group_size 4 (or more)"
            )
        if batch_size % group_size:
            raise UserError(
                f"batch_size ({batch_size}) is not a multiple of group_size ({group_size}); pass a batch "
                "of whole groups, e.g. --batch_size 64 --group_size 4"
            )
        if minibatch_size % group_size:
            raise UserError(
                f"minibatch_size ({minibatch_size}) is not a multiple of group_size ({group_size}), so a "
                f"minibatch would split a prompt's replies; pass --minibatch_size "
                f"{max(group_size, minibatch_size // group_size * group_size)}"
            )


# Each preset: PPOConfig's defaults plus what differs, with why.
LM_PPO = PPOConfig(
    learning_rate=2e-5,  # fine-tuning a pretrained (SFT) model takes small steps
    anneal_lr=False,  # constant, as TRL
    n_epochs=4,  # TRL's 4 PPO epochs per batch
    minibatch_size=16,  # 16 sequences per gradient step, 4 per 64-prompt batch
    gamma=1.0,  # no discount within a reply of a few dozen tokens
    clip_range_vf=0.2,  # TRL clips the value prediction too
    vf_coef=0.1,  # TRL's weight of the value loss
    max_grad_norm=1.0,  # TRL's gradient-norm clip
)
LM_REINFORCE = PPOConfig(
    learning_rate=2e-5,  # as LM_PPO
    anneal_lr=False,
    n_epochs=1,  # on-policy: one pass over each batch
    minibatch_size=16,  # 4 gradient steps per 64-episode batch, as many as one PPO epoch
    gamma=1.0,
    clip=False,  # no ratio: the loss is -log pi * A
    normalize_advantages=False,  # centring the returns would itself be a baseline
    vf_coef=0.0,  # no critic
    max_grad_norm=1.0,
)
LM_REINFORCE_BASELINE = PPOConfig(
    learning_rate=2e-5,
    anneal_lr=False,
    n_epochs=1,
    minibatch_size=16,
    gamma=1.0,
    clip=False,
    normalize_advantages=False,  # the learned baseline is the only centring
    vf_coef=0.1,  # the value head is the baseline, weighted as LM_PPO's
    max_grad_norm=1.0,
)
LM_RLOO = PPOConfig(
    learning_rate=2e-5,
    anneal_lr=False,
    n_epochs=1,  # REINFORCE with a leave-one-out baseline, on-policy
    minibatch_size=16,  # a multiple of the group size keeps groups whole
    gamma=1.0,
    clip=False,
    normalize_advantages=False,  # the leave-one-out mean is the baseline
    vf_coef=0.0,  # no critic
    max_grad_norm=1.0,
)
LM_GRPO = PPOConfig(
    learning_rate=2e-5,
    anneal_lr=False,
    n_epochs=4,  # several clipped epochs per batch, as PPO
    minibatch_size=16,
    gamma=1.0,
    normalize_advantages=False,  # advantages are already normalized within each group
    loss_aggregation="sequence",  # each reply's mean over its own tokens, then over replies (DeepSeekMath)
    vf_coef=0.0,  # no critic
    max_grad_norm=1.0,
)
LM_DR_GRPO = PPOConfig(
    learning_rate=2e-5,
    anneal_lr=False,
    n_epochs=4,
    minibatch_size=16,
    gamma=1.0,
    normalize_advantages=False,  # the group mean is the only centring; no std scaling
    loss_aggregation="constant",  # sum over tokens / (replies x generation limit): no 1/|o_i| length bias
    vf_coef=0.0,
    max_grad_norm=1.0,
)
LM_DAPO = PPOConfig(
    learning_rate=2e-5,
    anneal_lr=False,
    n_epochs=4,
    minibatch_size=16,
    gamma=1.0,
    clip_range_high=0.28,  # clip-higher: eps_low 0.2, eps_high 0.28, against entropy collapse
    normalize_advantages=False,  # group-normalized advantages, as GRPO; the default token-level loss
    vf_coef=0.0,
    max_grad_norm=1.0,
)
LM_GSPO = PPOConfig(
    learning_rate=2e-5,
    anneal_lr=False,
    n_epochs=4,  # GSPO differs from GRPO only off-policy: several minibatches and epochs per batch
    minibatch_size=16,
    gamma=1.0,
    clip_range=3e-4,  # sequence ratios move little: the paper's 3e-4 / 4e-4
    clip_range_high=4e-4,
    ratio_level="sequence",  # one ratio per reply, exp(mean_t log rho_t), clipped at the sequence level
    normalize_advantages=False,
    loss_aggregation="sequence",
    vf_coef=0.0,
    max_grad_norm=1.0,
)
# DAPO's rollout differences from RLHFConfig's defaults.
DAPO_ROLLOUT = {
    "dynamic_sampling": True,  # drop groups of equal rewards, draw more prompts until the batch is full
    "overlong_buffer": 0.25,  # soft overlong punishment over the last quarter of max_new_tokens (DAPO: 4k of 20k)
    "mask_truncated": True,  # replies cut at the limit leave the loss
    "kl_coef": 0.0,  # DAPO drops the KL penalty
}

GROUP_SIZE = 4  # k of the grouped algorithms (`--group_size`)

ALGORITHMS: dict[str, OnlineAlgorithm] = {
    a.name: a
    for a in (
        OnlineAlgorithm(
            "ppo",
            "PPO",
            "PPO against the reward model with a KL penalty to the frozen SFT reference.",
            LM_PPO,
            token_gae,
            "clipped",
            uses_critic=True,
        ),
        OnlineAlgorithm(
            "reinforce",
            "REINFORCE",
            "REINFORCE on sequences, no baseline (the lesson's Break-the-baseline on a language model).",
            LM_REINFORCE,
            token_returns,
            "pg",
            uses_critic=False,
        ),
        OnlineAlgorithm(
            "reinforce_baseline",
            "REINFORCE+baseline",
            "REINFORCE on sequences with the value head as a learned baseline.",
            LM_REINFORCE_BASELINE,
            token_returns_minus_values,
            "pg",
            uses_critic=True,
        ),
        OnlineAlgorithm(
            "rloo",
            "RLOO",
            "RLOO: k replies per prompt, each baselined by the mean of the other k-1; no critic.",
            LM_RLOO,
            group_baseline(rloo_advantages),
            "pg",
            uses_critic=False,
            default_group_size=GROUP_SIZE,
        ),
        OnlineAlgorithm(
            "grpo",
            "GRPO",
            "GRPO: k replies per prompt, advantages normalized in the group (std), clipped loss, each reply's loss "
            "averaged over its tokens; no critic (--kl_in loss: DeepSeekMath's k3 KL in the loss).",
            LM_GRPO,
            group_baseline(grpo_advantages),
            "clipped",
            uses_critic=False,
            default_group_size=GROUP_SIZE,
            # Sampling beside the update: on the toy comparison (3 seeds, 6,400 episodes) the same held-out gold
            # (0.857 against 0.856 synchronously) in 0.78x the wall time (docs/results/algorithms.md).
            rollout={"async_rollouts": True},
            paper="Shao et al. 2024, arXiv 2402.03300",
        ),
        OnlineAlgorithm(
            "dr_grpo",
            "Dr. GRPO",
            "Dr. GRPO: GRPO without its two biases: advantages only centred in the group (no std), the loss summed "
            "over tokens and divided by a constant (no 1/|o_i|).",
            LM_DR_GRPO,
            group_baseline(dr_grpo_advantages),
            "clipped",
            uses_critic=False,
            default_group_size=GROUP_SIZE,
            paper="Liu et al. 2025, arXiv 2503.20783",
        ),
        OnlineAlgorithm(
            "dapo",
            "DAPO",
            "DAPO: GRPO's advantages with clip-higher (0.2 / 0.28), dynamic sampling, a token-level loss, overlong "
            "reward shaping, truncated replies masked, no KL penalty.",
            LM_DAPO,
            group_baseline(grpo_advantages),
            "clipped",
            uses_critic=False,
            default_group_size=GROUP_SIZE,
            rollout=DAPO_ROLLOUT,
            paper="Yu et al. 2025, arXiv 2503.14476",
        ),
        OnlineAlgorithm(
            "gspo",
            "GSPO",
            "GSPO: GRPO's advantages with one importance ratio per reply (its tokens' mean log-ratio), clipped at "
            "the sequence level (3e-4 / 4e-4).",
            LM_GSPO,
            group_baseline(grpo_advantages),
            "clipped",
            uses_critic=False,
            default_group_size=GROUP_SIZE,
            paper="Zheng et al. 2025, arXiv 2507.18071",
        ),
    )
}


def get_algorithm(name: str) -> OnlineAlgorithm:
    if name not in ALGORITHMS:
        raise UserError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


# Offline methods beside the online table (their own stage): label by name, for tables.
OFFLINE_LABELS = {"dpo": "DPO"}


def label(name: str) -> str:
    """The display label of an online algorithm or an offline method (the name itself if unknown)."""
    return ALGORITHMS[name].label if name in ALGORITHMS else OFFLINE_LABELS.get(name, name)
