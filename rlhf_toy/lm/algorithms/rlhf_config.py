"""`RLHFConfig`: the settings of the online RLHF loop around the PPO update (sampling, the KL penalty, groups,
DAPO's rollout shaping, checkpoints, held-out evaluation). Which of them an algorithm reads, and its own values,
are its record's (`online.OnlineAlgorithm.configs`)."""

from __future__ import annotations

from dataclasses import dataclass

from rlhf_toy.config import TracksGiven, check, option
from rlhf_toy.errors import UserError
from rlhf_toy.losses import KL_ESTIMATORS

from ..models.devices import BF16


@dataclass
class RLHFConfig(TracksGiven):
    """The RLHF loop around the PPO update."""

    steps: int = option("PPO steps (one batch of prompts each).", 200)
    batch_size: int = option("Prompts (episodes) per step.", 64)
    temperature: float = option("Sampling temperature (also used for log-probs).", 1.0)
    max_new_tokens: int = option("Longest response.", 32)
    kl_coef: float = option("beta: weight of the per-token KL penalty.", 0.1)
    adaptive_kl: bool = option("Adapt beta toward kl_target (Ziegler et al.).", False)
    kl_target: float = option("KL target in nats for the adaptive controller.", 6.0)
    kl_horizon: int = option("Horizon (episodes) of the adaptive controller.", 10_000)
    kl_estimator: str = option(
        "Per-token KL estimator of the penalty: k1, k2 or k3; auto: k1 in the reward, k3 in the loss.", "auto"
    )
    kl_in: str = option(
        "Where the KL penalty goes: reward (-beta * KL in the per-token reward: PPO-RLHF) or loss (beta * KL as a "
        "loss term: DeepSeekMath's GRPO; with k3 or k2). Logged KL is always the k1 estimate.",
        "reward",
    )
    kl_limit: float | None = option(
        "Stop, before updating, once the moving-average KL of the sampled policies exceeds this: the policy kept "
        "is the last one updated while the average was under it (None: never).",
        None,
    )
    kl_limit_window: int = option("Steps in the KL moving average.", 5)
    missing_eos_penalty: float | None = option(
        "Subtract this from the score of a response that never emitted EOS (None: no penalty).", None
    )
    whiten_rewards: bool = option("Whiten per-token rewards (scale only).", False)
    value_lr_scale: float = option("Value head learning rate / policy's.", 50.0)
    critic_warmup: int = option(
        "First steps that train only the value head (the policy's learning rate 0, verl's critic_warmup): a fresh "
        "critic's errors are otherwise the first advantages. They count in --steps.",
        0,
    )
    stop_at_eos: bool = option("Stop generation at EOS (off: fixed length).", True)
    save_every: int = option("Checkpoint every this many steps (0: only at the end).", 25)
    group_size: int = option(
        "Replies sampled per prompt (RLOO, GRPO: k >= 2); a step draws batch_size / group_size prompts.", 1
    )
    dynamic_sampling: bool = option(
        "DAPO's dynamic sampling: drop groups whose rewards are all equal (no signal) and draw more prompts until "
        "the batch is full (grouped algorithms).",
        False,
    )
    dynamic_sampling_rounds: int = option(
        "Most sampling rounds per step under dynamic sampling before the run stops with an error.", 8
    )
    overlong_buffer: float = option(
        "DAPO's overlong reward shaping: a penalty rising linearly from 0 to overlong_penalty over this last "
        "share of max_new_tokens (DAPO: 4k of 20k tokens, 0.2; 0: off).",
        0.0,
    )
    overlong_penalty: float = option("The overlong penalty at the generation limit.", 1.0)
    mask_truncated: bool = option(
        "Leave replies cut at max_new_tokens (no EOS) out of the loss (DAPO; TRL's mask_truncated_completions).",
        False,
    )
    eval_every: int = option(
        "Every this many steps, the greedy replies to eval_prompts held-out prompts are judged: their mean gold "
        "(a checkable task's held-out accuracy) is logged as eval/greedy_gold, beside the episodes and the "
        "training seconds so far (0: never).",
        0,
    )
    eval_prompts: int = option("Held-out prompts of that evaluation.", 200)
    async_rollouts: bool = option(
        "Sample and score the next batch in a second process (one torch thread, on another core) while this one "
        "updates, with the weights of the step before (PipelineRL, AReaL, TRL's async GRPO): pi_old is the "
        "sampler's; policy/staleness logs how many versions behind each batch is. CPU only.",
        False,
    )
    staleness: int = option(
        "Policy versions the sampled batch is behind the update under --async_rollouts: 1 overlaps sampling with "
        "the update; 0 does not (the synchronous run's numbers, bit for bit: a check).",
        1,
    )
    bf16: str = option(
        "bf16 autocast of the step's forward passes (sampling, reference, reward, update; the weights and Adam stay "
        "fp32): auto (on a GPU that has bf16, fp32 on the CPU), on (the CPU too, where it has AVX512-BF16 or AMX), "
        "or off.",
        "auto",
    )
    reward_reads: str = option(
        "How the reward model reads replies: auto (token ids when it shares the policy's "
        "tokenizer, else text), ids, or text.",
        "auto",
    )

    def lr_scales(self, step: int) -> tuple[float, float]:
        """`ppo_update`'s `lr_scales` at 0-based update `step`: (the language model's, the value head's). The first
        `critic_warmup` updates leave the policy as it is (scale 0) and fit only the value head."""
        return (0.0 if step < self.critic_warmup else 1.0, self.value_lr_scale)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "max_new_tokens", "kl_horizon", "kl_limit_window"):
            check(getattr(self, name) >= 1, name, getattr(self, name), ">= 1")
        check(self.temperature > 0, "temperature", self.temperature, "> 0, e.g. 1.0")
        check(self.kl_coef >= 0, "kl_coef", self.kl_coef, ">= 0 (it is beta, the weight of the KL penalty)")
        check(self.kl_target > 0, "kl_target", self.kl_target, "> 0 nats, e.g. 6")
        check(self.kl_in in ("reward", "loss"), "kl_in", self.kl_in, "reward or loss")
        check(self.kl_estimator in ("auto", *KL_ESTIMATORS), "kl_estimator", self.kl_estimator, "auto, k1, k2 or k3")
        check(
            not (self.kl_in == "loss" and self.kl_estimator == "k1"),
            "kl_estimator",
            self.kl_estimator,
            "k2 or k3 with --kl_in loss (k1's gradient as a loss term is zero in expectation)",
        )
        check(self.dynamic_sampling_rounds >= 1, "dynamic_sampling_rounds", self.dynamic_sampling_rounds, ">= 1")
        check(0 <= self.overlong_buffer < 1, "overlong_buffer", self.overlong_buffer, "a share in [0, 1), e.g. 0.25")
        check(self.overlong_penalty >= 0, "overlong_penalty", self.overlong_penalty, ">= 0")
        check(self.kl_limit is None or self.kl_limit > 0, "kl_limit", self.kl_limit, "> 0 nats (or None)")
        check(self.value_lr_scale > 0, "value_lr_scale", self.value_lr_scale, "> 0, e.g. 50")
        check(0 <= self.critic_warmup < self.steps, "critic_warmup", self.critic_warmup, ">= 0 and below --steps")
        check(self.bf16 in BF16, "bf16", self.bf16, "auto, on or off")
        check(self.reward_reads in ("auto", "ids", "text"), "reward_reads", self.reward_reads, "auto, ids or text")
        check(self.group_size >= 1, "group_size", self.group_size, ">= 1 (RLOO and GRPO: >= 2)")
        check(self.save_every >= 0, "save_every", self.save_every, ">= 0 (0: only at the end)")
        check(self.eval_every >= 0, "eval_every", self.eval_every, ">= 0 (0: never)")
        check(
            self.staleness in (0, 1),
            "staleness",
            self.staleness,
            "0 or 1 (one sampling process beside one updating process has nothing deeper to overlap)",
        )
        if self.staleness != 1 and not self.async_rollouts:  # a setting nothing reads is refused, never ignored
            raise UserError(
                f"--staleness {self.staleness} is read only with --async_rollouts; add it or drop --staleness"
            )
        check(self.eval_prompts >= 1, "eval_prompts", self.eval_prompts, ">= 1")

    @property
    def penalty_estimator(self) -> str:
        """The KL estimator of the penalty: `kl_estimator`, or (auto) k1 in the reward and k3 in the loss."""
        if self.kl_estimator != "auto":
            return self.kl_estimator
        return "k3" if self.kl_in == "loss" else "k1"
