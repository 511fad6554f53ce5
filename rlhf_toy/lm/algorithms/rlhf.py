"""The online RLHF step with a KL penalty to the frozen reference, in numbered stages, on the shared core.

One step: (1) sample responses for a batch of prompts; (2) log-probs of policy and reference at the sampling
temperature, and values; (3) reward-model scores (and gold scores, for logging only); (4) per-token rewards
-beta * KL plus the score at the last real token; (5) advantages by the algorithm's own function (`online.py`:
the core's `gae` for PPO, group baselines for RLOO and GRPO, ...); (6) the core's `ppo_update` with the
algorithm's policy loss (clipped surrogate or plain policy gradient, value loss, minibatch epochs).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlhf_toy.config import check, option
from rlhf_toy.distributed import check_in_sync, data_parallel, gather, mean_across_ranks, rank_and_world
from rlhf_toy.errors import UserError
from rlhf_toy.masks import masked_mean, masked_whiten
from rlhf_toy.ppo import NonFiniteUpdate, PPOConfig, RolloutBatch, make_optimizer, ppo_update

from ..models.base import context_length
from ..models.causal_lm import response_logprobs
from ..models.chat import encode_prompts
from ..models.devices import autocast, model_device
from ..models.lora import is_lora, reference_mode, trainable_parameters
from ..models.policy import PolicyWithValueHead
from ..models.reward_model import RewardModel
from ..models.sampling import Samples, sample
from .kl import AdaptiveKLController, FixedKLController, MovingAverage, per_token_kl, shaped_rewards
from .online import LM_PPO, OnlineAlgorithm, Signals, get_algorithm


def lm_ppo_config(**overrides: Any) -> PPOConfig:
    """`LM_PPO` with the given fields changed (`dataclasses.replace`)."""
    return replace(LM_PPO, **overrides)


@dataclass
class RLHFConfig:
    """The RLHF loop around the PPO update."""

    steps: int = option("PPO steps (one batch of prompts each).", 200)
    batch_size: int = option("Prompts (episodes) per step.", 64)
    temperature: float = option("Sampling temperature (also used for log-probs).", 1.0)
    max_new_tokens: int = option("Longest response.", 32)
    kl_coef: float = option("beta: weight of the per-token KL penalty.", 0.1)
    adaptive_kl: bool = option("Adapt beta toward kl_target (Ziegler et al.).", False)
    kl_target: float = option("KL target in nats for the adaptive controller.", 6.0)
    kl_horizon: int = option("Horizon (episodes) of the adaptive controller.", 10_000)
    kl_estimator: str = option("Per-token KL estimator: k1 or k3.", "k1")
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
    stop_at_eos: bool = option("Stop generation at EOS (off: fixed length).", True)
    save_every: int = option("Checkpoint every this many steps (0: only at the end).", 25)
    group_size: int = option(
        "Replies sampled per prompt (RLOO, GRPO: k >= 2); a step draws batch_size / group_size prompts.", 1
    )
    kl_in_loss: bool = option(
        "The KL penalty as a k3 term in the loss (DeepSeekMath) instead of in the reward; "
        "only for algorithms that place it there (GRPO).",
        False,
    )
    reward_reads: str = option(
        "How the reward model reads replies: auto (token ids when it shares the policy's "
        "tokenizer, else text), ids, or text.",
        "auto",
    )

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "max_new_tokens", "kl_horizon", "kl_limit_window"):
            check(getattr(self, name) >= 1, name, getattr(self, name), ">= 1")
        check(self.temperature > 0, "temperature", self.temperature, "> 0, e.g. 1.0")
        check(self.kl_coef >= 0, "kl_coef", self.kl_coef, ">= 0 (it is beta, the weight of the KL penalty)")
        check(self.kl_target > 0, "kl_target", self.kl_target, "> 0 nats, e.g. 6")
        check(self.kl_estimator in ("k1", "k3"), "kl_estimator", self.kl_estimator, "k1 or k3")
        check(self.kl_limit is None or self.kl_limit > 0, "kl_limit", self.kl_limit, "> 0 nats (or None)")
        check(self.value_lr_scale > 0, "value_lr_scale", self.value_lr_scale, "> 0, e.g. 50")
        check(self.reward_reads in ("auto", "ids", "text"), "reward_reads", self.reward_reads, "auto, ids or text")
        check(self.group_size >= 1, "group_size", self.group_size, ">= 1 (RLOO and GRPO: >= 2)")
        check(self.save_every >= 0, "save_every", self.save_every, ">= 0 (0: only at the end)")


@dataclass
class Experience:
    """One step's rollouts: everything `ppo_update` and the logs need. Tensors are `[B, R]` unless noted."""

    batch: RolloutBatch
    scores: Tensor  # [B] reward-model scores (after any EOS penalty)
    kl: Tensor  # [B, R] per-token KL (0 on padding)
    texts: list[str]
    eos: Tensor  # [B]
    entropy: Tensor


def score_responses(reward_model, tok, s: Samples) -> Tensor:
    """Scores `[B]` (CPU) of sampled replies, checked (`checked_scores`). A `RewardModel` reads token ids or text
    as it was loaded to; a bare scalar-head module shares the policy's tokenizer and reads the generated tokens;
    any callable `(prompts, texts) -> [B]` (a rule reward, say) reads the decoded text."""
    if isinstance(reward_model, RewardModel):
        return checked_scores(reward_model.score_samples(s, tok), len(s.texts), reward_model)
    if isinstance(reward_model, torch.nn.Module):
        scores = RewardModel(reward_model, tok, reads_ids=True).score_samples(s, tok)
        return checked_scores(scores, len(s.texts), reward_model)
    return checked_scores(reward_model(s.prompts, s.texts), len(s.texts), reward_model)


def describe(fn: Any) -> str:
    """A reward function or model as the user would recognize it in an error."""
    if isinstance(fn, torch.nn.Module):
        return f"the reward model ({type(fn).__name__})"
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"the reward function {getattr(fn, '__module__', None) or '?'}.{name}"


def checked_scores(values: Any, n: int, source: Any) -> Tensor:
    """`values` as a float `[n]` tensor, or a `UserError` naming `source` and what it returned: one finite
    number per reply, not a scalar to broadcast, not a table, not text or None. Runs once per step, before
    any update, so that a bad reward never reaches the policy's weights."""
    where = describe(source)
    try:
        scores = torch.as_tensor(values, dtype=torch.float32).detach().cpu()
    except (TypeError, ValueError, RuntimeError):
        shown = repr(values)[:80]
        raise UserError(f"{where} returned {shown}, not numbers; return one float per reply ({n})") from None
    if scores.dim() != 1 or scores.shape[0] != n:
        raise UserError(
            f"{where} returned shape {tuple(scores.shape)} for {n} replies; return a list of {n} floats, one per reply"
        )
    bad = (~torch.isfinite(scores)).nonzero().flatten()
    if len(bad):
        i = int(bad[0])
        raise UserError(
            f"{where} returned {scores[i].item()} for reply {i} ({len(bad)} of {n} not finite); return "
            "finite numbers (nothing was updated)"
        )
    return scores


def reference_logprobs(policy: PolicyWithValueHead, ref_model, s: Samples, temperature: float) -> Tensor:
    """`[B, R]` log-probs under the frozen reference: `ref_model`, or (None) the LoRA policy with adapters off."""
    if ref_model is None:
        with reference_mode(policy.lm):
            return response_logprobs(policy.lm, s.prompt_ids, s.prompt_mask, s.response_ids, temperature)[0]
    return response_logprobs(ref_model, s.prompt_ids, s.prompt_mask, s.response_ids, temperature)[0]


def make_experience(
    policy: PolicyWithValueHead,
    ref_model,
    reward_model,
    tok,
    prompts: list[str],
    beta: float,
    cfg: RLHFConfig,
    ppo: PPOConfig,
    algorithm: OnlineAlgorithm,
) -> Experience:
    """One batch of rollouts, on the policy's device. `ref_model=None`: the LoRA policy with adapters off.
    `algorithm` (a record of `online.ALGORITHMS`) decides how rewards become advantages; groups are consecutive
    prompts."""
    # 1. Sample from the current policy (torch's global RNG). Without a critic, the sampler's own logits give the
    #    policy's log-probs, and the forward pass of step 2 is saved.
    critic = algorithm.needs_values(ppo)
    s = sample(
        policy.lm,
        tok,
        prompts,
        cfg.max_new_tokens,
        cfg.temperature,
        stop_at_eos=cfg.stop_at_eos,
        with_logprobs=not critic,
    )
    obs, mask = (s.prompt_ids, s.prompt_mask), s.response_mask.float()
    with torch.no_grad():
        # 2. Log-probs under policy and reference at the sampling temperature; values from the head.
        if critic:
            logprobs, entropy, values = policy.evaluate(obs, s.response_ids)
        else:
            logprobs, entropy, values = s.logprobs, s.entropy, torch.zeros_like(mask)
        ref_logprobs = reference_logprobs(policy, ref_model, s, cfg.temperature)
        # 3. Scores from the reward model (EOS-terminated input) or a rule on the text.
        scores = score_responses(reward_model, tok, s).to(mask.device)
        if cfg.missing_eos_penalty is not None:
            scores = scores - cfg.missing_eos_penalty * (~s.eos).float()
        # 4. Per-token rewards: -beta * KL, plus the score on the last real token.
        kl = per_token_kl(logprobs, ref_logprobs, cfg.kl_estimator) * mask
        rewards = shaped_rewards(scores, kl, mask, beta)
        if cfg.whiten_rewards:
            rewards = masked_whiten(rewards, mask, shift_mean=False)
        # 5. Advantages: the algorithm's own function (GAE for PPO, group baselines for RLOO and GRPO, ...).
        values = values * mask
        signals = Signals(rewards, scores, kl, values, mask, beta, cfg.kl_in_loss)
        adv, ret = algorithm.advantages(signals, ppo, cfg.group_size)
    batch = RolloutBatch(obs, s.response_ids, logprobs, values, adv, ret, mask, ref_logprobs)
    return Experience(batch, scores.float(), kl, s.texts, s.eos, entropy)


class RLHFTrainer:
    """Holds the three roles (policy with its value head, frozen reference, reward model) and runs steps of an
    online algorithm (`algorithm`: a name in `online.ALGORITHMS`).

    `sft_model` is any transformers causal LM (on any device: everything follows its device), or a peft LoRA
    model: then only the adapters train and the reference is the same network with the adapters off (no copy).
    `reward_model`: a `RewardModel`, a scalar-head module that shares `tok`, or a callable
    `(prompts, texts) -> scores`.
    """

    def __init__(
        self,
        sft_model,
        reward_model,
        tok,
        cfg: RLHFConfig,
        ppo: PPOConfig,
        prompts: list[str],
        seed: int,
        judge=None,
        ref_model=None,
        algorithm: str = "ppo",
    ) -> None:
        self.algorithm = get_algorithm(algorithm)
        self.algorithm.check(cfg.group_size, cfg.batch_size, ppo.minibatch_size, cfg.kl_in_loss)
        if cfg.batch_size // cfg.group_size > len(prompts):
            raise UserError(
                f"batch_size ({cfg.batch_size}) is larger than the prompt set ({len(prompts)}); "
                "lower --batch_size or use more prompts"
            )
        if ppo.minibatch_size > cfg.batch_size:
            raise UserError(
                f"minibatch_size ({ppo.minibatch_size}) is larger than the batch ({cfg.batch_size} "
                "episodes per step); lower --minibatch_size or raise --batch_size"
            )
        longest = max(len(p) for p in encode_prompts(tok, prompts))
        context = context_length(sft_model.config)
        if longest + cfg.max_new_tokens + 1 > context:
            raise UserError(
                f"prompt ({longest} tokens) + max_new_tokens ({cfg.max_new_tokens}) + EOS exceeds the "
                f"context of {context}; lower --max_new_tokens"
            )
        self.cfg, self.ppo, self.tok, self.prompts, self.judge = cfg, ppo, tok, prompts, judge
        seed = seed + rank_and_world()[0]  # data-parallel ranks draw different prompts and samples
        torch.manual_seed(seed)  # first: the value head's initialization draws from it
        # The frozen reference: the SFT model (a copy of the starting policy unless given, e.g. on resume), or
        # for a LoRA policy the same network with its adapters off (None).
        if ref_model is None and not is_lora(sft_model):
            ref_model = copy.deepcopy(sft_model)
        self.ref_model = None if ref_model is None else ref_model.eval().requires_grad_(False)
        self.device = model_device(sft_model)
        if isinstance(reward_model, torch.nn.Module):
            reward_model = reward_model.eval().requires_grad_(False)
        self.reward_model = reward_model
        self.policy = PolicyWithValueHead(sft_model.eval(), cfg.temperature)  # eval(): dropout stays off
        # Two param groups: the language model, and the fresh value head at `value_lr_scale` times its lr.
        self.optimizer = make_optimizer(
            [{"params": trainable_parameters(self.policy.lm)}, {"params": list(self.policy.value_head.parameters())}],
            ppo,
        )
        self.lr_scales = (1.0, cfg.value_lr_scale)
        # Under torchrun: DDP averages the update's gradients across ranks (and broadcasts rank 0's weights now).
        self.update_policy = data_parallel(self.policy, actor_critic=True)
        self.kl_ctl = (
            AdaptiveKLController(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon)
            if cfg.adaptive_kl
            else FixedKLController(cfg.kl_coef)
        )
        self.kl_average = MovingAverage(cfg.kl_limit_window)
        self.step_count = 0
        self.prompt_generator = torch.Generator().manual_seed(seed)
        self.update_generator = torch.Generator().manual_seed(seed + 1)
        self.stopped_by_kl_limit = False
        self.last_samples: list[dict[str, str]] = []

    def next_prompts(self) -> list[str]:
        """batch_size / group_size distinct prompts, each repeated group_size times in a row."""
        k = self.cfg.group_size
        idx = torch.randperm(len(self.prompts), generator=self.prompt_generator)[: self.cfg.batch_size // k]
        return [self.prompts[i] for i in idx.tolist() for _ in range(k)]

    def step(self) -> dict[str, float]:
        with autocast(self.device):  # bf16 on a GPU that has it; nothing on the CPU
            return self._step()

    def _step(self) -> dict[str, float]:
        t0 = time.perf_counter()
        prompts = self.next_prompts()
        beta = self.kl_ctl.beta
        exp = make_experience(
            self.policy, self.ref_model, self.reward_model, self.tok, prompts, beta, self.cfg, self.ppo, self.algorithm
        )
        t_rollout = time.perf_counter() - t0
        mask = exp.batch.mask
        seq_kl = exp.kl.sum(1)
        # --kl_limit decides before the update: once the sampled policies' moving-average KL is over the limit,
        # this step's update is not applied, so the policy kept is the last one updated under it (nothing copied).
        ma = self.kl_average.add(mean_across_ranks({"kl": seq_kl.mean().item()})["kl"])
        self.stopped_by_kl_limit = self.cfg.kl_limit is not None and ma > self.cfg.kl_limit
        stats = {} if self.stopped_by_kl_limit else self._update(exp, beta)
        self.last_samples = [{"prompt": p, "response": r} for p, r in list(zip(prompts, exp.texts))[:5]]
        self.step_count += 1
        # Namespaced as CleanRL's and TRL's logs: objective/ (what is optimized), policy/ (what the policy does),
        # ppo/ (the update's diagnostics), time/.
        metrics = {
            "step": self.step_count,
            "objective/score": exp.scores.mean().item(),
            "objective/kl": seq_kl.mean().item(),
            "objective/beta": beta,
            "objective/non_score_reward": (-beta * seq_kl).mean().item(),
            "policy/entropy": masked_mean(exp.entropy, mask).item(),
            "policy/response_length": mask.sum(1).mean().item(),
            "policy/eos_rate": exp.eos.float().mean().item(),
            **{f"ppo/{k}": v for k, v in stats.items()},
            "time/rollout_s": t_rollout,
            "time/step_s": time.perf_counter() - t0,
        }
        if self.judge is not None:
            metrics["objective/gold"] = float(np.mean(self.judge(prompts, exp.texts)))
        self.last_local_metrics = dict(metrics)  # this rank's own figures, before averaging
        metrics = mean_across_ranks(metrics)
        check_in_sync(self.policy)  # DDP keeps the ranks' weights identical; a cheap check that it did
        self.kl_ctl.update(metrics["objective/kl"], self.cfg.batch_size)
        metrics["objective/kl_moving_average"] = ma
        return metrics

    def _update(self, exp: Experience, beta: float) -> dict[str, float]:
        """The core's `ppo_update` with this algorithm's loss; groups stay whole in minibatches."""
        try:
            return ppo_update(
                self.update_policy,
                self.optimizer,
                exp.batch,
                self.ppo,
                progress=self.step_count / max(1, self.cfg.steps),
                generator=self.update_generator,
                lr_scales=self.lr_scales,
                policy_loss=self.algorithm.policy_loss,
                kl_loss_coef=beta if self.cfg.kl_in_loss else 0.0,
                group_size=self.cfg.group_size,
            )
        except NonFiniteUpdate as exc:
            raise UserError(
                f"step {self.step_count + 1}: {exc}; lower --learning_rate (or set --max_grad_norm), or check the "
                "reward's scale"
            ) from None

    # Checkpoints: the policy in Hugging Face format, the rest (value head, optimizer, controller, RNG) beside it.
    def state(self) -> dict[str, Any]:
        """The trainer's state; a collective call under torchrun (the RNG states are every rank's, in rank order,
        so that a resumed run draws what each rank would have drawn)."""
        return {
            "step": self.step_count,
            "value_head": self.policy.value_head.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "beta": float(self.kl_ctl.beta),
            "kl_values": list(self.kl_average.values),
            "world_size": rank_and_world()[1],
            "rng": gather(
                {
                    "torch": torch.get_rng_state(),
                    "prompt": self.prompt_generator.get_state(),
                    "update": self.update_generator.get_state(),
                }
            ),
            "config": asdict(self.cfg),
            "ppo": self.ppo.to_dict(),
            "stopped_by_kl_limit": self.stopped_by_kl_limit,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        rank, world = rank_and_world()
        if int(state.get("world_size", 1)) != world:
            raise UserError(
                f"the checkpoint was written by {state.get('world_size', 1)} process(es), this run has "
                f"{world}; resume with the same --nproc_per_node"
            )
        self.step_count = int(state["step"])
        self.policy.value_head.load_state_dict(state["value_head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.kl_ctl.beta = float(state["beta"])
        for v in state["kl_values"]:
            self.kl_average.add(float(v))
        rng = state["rng"][rank]
        torch.set_rng_state(rng["torch"])
        self.prompt_generator.set_state(rng["prompt"])
        self.update_generator.set_state(rng["update"])
        self.stopped_by_kl_limit = bool(state.get("stopped_by_kl_limit", False))
