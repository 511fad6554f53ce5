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
from dataclasses import asdict, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlhf_toy.advantages import equal_groups
from rlhf_toy.distributed import check_in_sync, data_parallel, gather, mean_across_ranks, rank_and_world
from rlhf_toy.errors import UserError
from rlhf_toy.masks import masked_mean, masked_whiten
from rlhf_toy.ppo import NonFiniteUpdate, PPOConfig, RolloutBatch, make_optimizer, ppo_update
from rlhf_toy.runtime import PhaseClock

from ..data.rewards import RewardFunctions, function_name
from ..data.scores import check_scores
from ..data.text import distinct_2
from ..models.base import context_length
from ..models.causal_lm import response_logprobs
from ..models.chat import encode_prompts
from ..models.devices import autocast, check_bf16, model_device
from ..models.lora import is_lora, reference_mode, trainable_parameters
from ..models.policy import PolicyWithValueHead
from ..models.reward_ensemble import ScoredReward
from ..models.reward_model import RewardModel
from ..models.sampling import Samples, concat_samples, sample, select_samples
from .async_rollouts import AsyncSampling, on_cpu
from .experience import Experience, experience_from_state, experience_state
from .kl import AdaptiveKLController, FixedKLController, MovingAverage, overlong_penalty, per_token_kl, shaped_rewards
from .online import LM_PPO, OnlineAlgorithm, Signals, get_algorithm
from .rlhf_config import RLHFConfig

# A batch sampled ahead (`--async_rollouts`): the experience (with its beta and policy version), the sampler's phase
# times, and the gold judge's values of its last sampling round (None: no checker).
Reply = tuple[Experience, dict[str, float], Any]
SAMPLES_KEPT = 5  # replies of each step kept with their figures (`last_samples`: the report's table)


def lm_ppo_config(**overrides: Any) -> PPOConfig:
    """`LM_PPO` with the given fields changed (`dataclasses.replace`)."""
    return replace(LM_PPO, **overrides)


def score_responses(reward_model, tok, s: Samples) -> Tensor:
    """Scores `[B]` (CPU) of sampled replies, checked (`checked_scores`). A `RewardModel` (or a `ScoredReward`:
    an ensemble, a length penalty) reads token ids or text as it was loaded to; a bare scalar-head module shares
    the policy's tokenizer and reads the generated tokens;
    any callable `(prompts, texts) -> [B]` (a rule reward, say) reads the decoded text."""
    if isinstance(reward_model, (RewardModel, ScoredReward)):  # one model, or an ensemble under its objective
        return checked_scores(reward_model.score_samples(s, tok), len(s.texts), reward_model)
    if isinstance(reward_model, torch.nn.Module):
        scores = RewardModel(reward_model, tok, reads_ids=True).score_samples(s, tok)
        return checked_scores(scores, len(s.texts), reward_model)
    return checked_scores(reward_model(s.prompts, s.texts), len(s.texts), reward_model)


def describe(fn: Any) -> str:
    """A reward function or model as the user would recognize it in an error."""
    if isinstance(fn, (torch.nn.Module, RewardModel, ScoredReward)):
        return f"the reward model ({type(fn).__name__})"
    if isinstance(fn, RewardFunctions):  # --reward_fn: the weighted sum of the user's functions
        return f"the sum of the reward functions {' + '.join(function_name(f) for f in fn.fns)}"
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"the reward function {getattr(fn, '__module__', None) or '?'}.{name}"


def checked_scores(values: Any, n: int, source: Any) -> Tensor:
    """`values` as a float `[n]` tensor, checked (`check_scores`) and naming `source` as the user knows it."""
    return check_scores(values, n, describe(source))


def reference_logprobs(policy: PolicyWithValueHead, ref_model, s: Samples, temperature: float) -> Tensor:
    """`[B, R]` log-probs under the frozen reference: `ref_model`, or (None) the LoRA policy with adapters off; under
    the policy's reply constraint where it has one (the KL is then between the two constrained policies)."""
    args = (s.prompt_ids, s.prompt_mask, s.response_ids, temperature)
    if ref_model is None:
        with reference_mode(policy.lm):
            return response_logprobs(policy.lm, *args, constraint=policy.constraint)[0]
    return response_logprobs(ref_model, *args, constraint=policy.constraint)[0]


def sample_and_score(
    policy: PolicyWithValueHead,
    reward_model,
    tok,
    prompts: list[str],
    cfg: RLHFConfig,
    with_hidden: bool = False,
    clock: PhaseClock | None = None,
) -> tuple[Samples, Tensor]:
    """Sample one reply per prompt (torch's global RNG) and score it: the reward model's or the rule's score `[B]`
    (on the policy's device), less any missing-EOS or overlong penalty. The samples keep their log-probs (and with
    `with_hidden` the hidden states a value head reads); `clock` times the two phases."""
    clock = clock or PhaseClock()
    with clock("sample"):
        s = sample(
            policy.lm,
            tok,
            prompts,
            cfg.max_new_tokens,
            cfg.temperature,
            stop_at_eos=cfg.stop_at_eos,
            with_logprobs=True,
            with_hidden=with_hidden,
        )
    with clock("reward"):
        scores = score_responses(reward_model, tok, s).to(s.response_ids.device)
    return s, reply_penalties(scores, s.eos, s.response_mask.sum(1), cfg)


def reply_penalties(scores: Tensor, eos: Tensor, lengths: Tensor, cfg: RLHFConfig) -> Tensor:
    """`scores [B]` of replies less `cfg`'s missing-EOS penalty where a reply never ended (`eos [B]`) and plus DAPO's
    overlong shaping of their `lengths [B]` (an agent's turns are penalized the same way)."""
    if cfg.missing_eos_penalty is not None:
        scores = scores - cfg.missing_eos_penalty * (~eos).float()
    if cfg.overlong_buffer:
        buffer = max(1, round(cfg.overlong_buffer * cfg.max_new_tokens))
        scores = scores + overlong_penalty(lengths, cfg.max_new_tokens, buffer, cfg.overlong_penalty)
    return scores


def frozen_reference(model, ref_model=None):
    """The frozen reference of a policy that starts as `model`: `ref_model` (given on resume, say) or a copy of
    `model`, in eval mode without gradients; None for a LoRA model (its adapters off are the reference)."""
    if ref_model is None and not is_lora(model):
        ref_model = copy.deepcopy(model)
    return None if ref_model is None else ref_model.eval().requires_grad_(False)


def policy_optimizer(policy: PolicyWithValueHead, ppo: PPOConfig) -> torch.optim.Optimizer:
    """Two param groups: the language model's trainable weights, and the fresh value head (trained at
    `value_lr_scale` times the learning rate: `ppo_update`'s `lr_scales`)."""
    return make_optimizer(
        [{"params": trainable_parameters(policy.lm)}, {"params": list(policy.value_head.parameters())}], ppo
    )


def kl_controller(cfg: RLHFConfig) -> AdaptiveKLController | FixedKLController:
    """beta's controller: adaptive toward `kl_target` (Ziegler et al.) or fixed."""
    if cfg.adaptive_kl:
        return AdaptiveKLController(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon)
    return FixedKLController(cfg.kl_coef)


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
    """One batch of rollouts of `prompts`, on the policy's device (`ref_model=None`: the LoRA policy with adapters
    off). Groups are consecutive prompts."""
    # 1. Sample from the current policy: its logits give the policy's log-probs (and its hidden states a critic's
    #    values), so the forward pass of step 2 is saved. 3. Scores from the reward model or a rule on the text.
    s, scores = sample_and_score(policy, reward_model, tok, prompts, cfg, algorithm.needs_values(ppo))
    return experience_from(policy, ref_model, s, scores, beta, cfg, ppo, algorithm, {})


def experience_from(
    policy: PolicyWithValueHead,
    ref_model,
    s: Samples,
    scores: Tensor,
    beta: float,
    cfg: RLHFConfig,
    ppo: PPOConfig,
    algorithm: OnlineAlgorithm,
    sampling: dict[str, float],
    clock: PhaseClock | None = None,
) -> Experience:
    """Steps 2, 4 and 5 on sampled, scored replies: log-probs, per-token rewards, the algorithm's advantages
    (`clock` times the policy's and the reference's forward passes)."""
    clock = clock or PhaseClock()
    critic = algorithm.needs_values(ppo)
    obs, mask = (s.prompt_ids, s.prompt_mask), s.response_mask.float()
    with torch.no_grad():
        # 2. Log-probs under policy and reference at the sampling temperature; values from the head.
        if s.logprobs is None or (critic and s.hidden is None):
            with clock("policy_forward"):
                logprobs, entropy, values = policy.evaluate(obs, s.response_ids)
            values = values if critic else torch.zeros_like(mask)
        else:  # what sampling computed: the same numbers as that forward pass, to float rounding (tests check)
            logprobs, entropy = s.logprobs, s.entropy
            values = policy.value_head(s.hidden).squeeze(-1) if critic else torch.zeros_like(mask)
        with clock("reference_forward"):
            ref_logprobs = reference_logprobs(policy, ref_model, s, cfg.temperature)
        # 4. Per-token rewards: -beta * KL (the penalty's estimator; none when the KL is a loss term), plus the score
        #    on the last real token.
        in_reward = cfg.kl_in == "reward"
        penalty = per_token_kl(logprobs, ref_logprobs, cfg.penalty_estimator) * mask
        rewards = shaped_rewards(scores, penalty, mask, beta if in_reward else 0.0)
        if cfg.whiten_rewards:
            rewards = masked_whiten(rewards, mask, shift_mean=False)
        # 5. Advantages: the algorithm's own function (GAE for PPO, group baselines for RLOO and GRPO, ...).
        values = values * mask
        signals = Signals(rewards, scores, penalty, values, mask, beta if in_reward else 0.0)
        adv, ret = algorithm.advantages(signals, ppo, cfg.group_size)
        kl = per_token_kl(logprobs, ref_logprobs, "k1") * mask
    # Under `mask_truncated`, replies cut at the limit teach nothing (DAPO): out of the loss, not out of the logs.
    loss_mask = mask * s.eos[:, None].to(mask.dtype) if cfg.mask_truncated and cfg.stop_at_eos else mask
    batch = RolloutBatch(obs, s.response_ids, logprobs, values, adv * loss_mask, ret, loss_mask, ref_logprobs)
    return Experience(batch, scores.float(), kl, s.texts, s.eos, entropy, s.prompts, mask, sampling)


class RLHFTrainer:
    """Holds the three roles (policy with its value head, frozen reference, reward model) and runs steps of an
    online algorithm (`algorithm`: a name in `online.ALGORITHMS`). The algorithm's record decides the settings:
    `cfg` and `ppo` (None: the record's own) change only the fields they were given (`OnlineAlgorithm.settle`), so
    `RLHFTrainer(..., RLHFConfig(batch_size=16), None, prompts, 0, algorithm="dapo")` runs DAPO: its group size,
    its dynamic sampling, no KL penalty. `self.cfg` and `self.ppo` are what runs.

    `sft_model` is any transformers causal LM (on any device: everything follows its device), or a peft LoRA
    model: then only the adapters train and the reference is the same network with the adapters off (no copy).
    `reward_model`: a `RewardModel`, a scalar-head module that shares `tok`, or a callable
    `(prompts, texts) -> scores`.

    With `RLHFConfig(async_rollouts=True)` the first `step()` forks the sampling process (`async_rollouts.py`);
    call `close()` when done with the trainer (the process is a daemon: it also ends with this one).
    """

    def __init__(
        self,
        sft_model,
        reward_model,
        tok,
        cfg: RLHFConfig | None,
        ppo: PPOConfig | None,
        prompts: list[str],
        seed: int,
        judge=None,
        ref_model=None,
        algorithm: str = "ppo",
    ) -> None:
        self.algorithm = get_algorithm(algorithm)
        # The record decides what runs: its preset, group size and rollout, with the caller's own fields on top
        # (None: the record's; a setting the algorithm does not read is refused).
        cfg, ppo = self.algorithm.settle(cfg, ppo)
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
        self.round_gold: tuple[list[str], Tensor] | None = None  # the last sampling round's replies and gold
        seed = seed + rank_and_world()[0]  # data-parallel ranks draw different prompts and samples
        torch.manual_seed(seed)  # first: the value head's initialization draws from it
        # The frozen reference: the SFT model (a copy of the starting policy unless given, e.g. on resume), or
        # for a LoRA policy the same network with its adapters off (None).
        self.ref_model = frozen_reference(sft_model, ref_model)
        self.device = model_device(sft_model)
        check_bf16(self.device, cfg.bf16)
        if isinstance(reward_model, torch.nn.Module):
            reward_model = reward_model.eval().requires_grad_(False)
        self.reward_model = reward_model
        # eval(): dropout stays off. A critic-free algorithm keeps the value head frozen and never runs it.
        self.policy = PolicyWithValueHead(sft_model.eval(), cfg.temperature, critic=self.algorithm.needs_values(ppo))
        # Two param groups: the language model, and the fresh value head at `value_lr_scale` times its lr.
        self.optimizer = policy_optimizer(self.policy, ppo)
        # Under torchrun: DDP averages the update's gradients across ranks (and broadcasts rank 0's weights now).
        self.update_policy = data_parallel(self.policy, actor_critic=True)
        self.kl_ctl = kl_controller(cfg)
        self.kl_average = MovingAverage(cfg.kl_limit_window)
        self.step_count = 0
        self.prompt_generator = torch.Generator().manual_seed(seed)
        self.update_generator = torch.Generator().manual_seed(seed + 1)
        self.stopped_by_kl_limit = False
        self.last_samples: list[dict[str, Any]] = []
        self.clock = PhaseClock()  # each step's time per phase: time/sample_s, ..., time/update_s
        self.cfg = cfg = on_cpu(cfg, self.device)
        self.ahead = AsyncSampling()  # --async_rollouts: the sampling process and a checkpoint's batch sampled ahead

    def next_prompts(self) -> list[str]:
        """batch_size / group_size distinct prompts, each repeated group_size times in a row."""
        k = self.cfg.group_size
        idx = torch.randperm(len(self.prompts), generator=self.prompt_generator)[: self.cfg.batch_size // k]
        return [self.prompts[i] for i in idx.tolist() for _ in range(k)]

    def rollouts(self, beta: float) -> Experience:
        """This step's experience: one batch of prompts; under dynamic sampling (DAPO), rounds of batches whose
        groups of all-equal rewards are dropped, until `batch_size` replies are kept (the first ones, in order).
        After `dynamic_sampling_rounds` rounds a batch that kept some groups is filled with dropped ones (their
        advantages are zero: they add no gradient; `sampling/filled_groups` counts them); one that kept none stops
        the run with an error (no endless loop). Its forward passes run under bf16 autocast where `--bf16` asks for
        it (the weights fixed: `autocast`), here or in the `--async_rollouts` sampler."""
        cfg, k = self.cfg, self.cfg.group_size
        precision = lambda: autocast(self.device, cfg.bf16, weights_fixed=True)  # noqa: E731
        # Sampling keeps the log-probs, and for a critic the hidden states its value head reads: no algorithm then
        # runs a forward pass of the policy before its update (the lean loop's; `generate` keeps no hidden states).
        critic = self.algorithm.needs_values(self.ppo)
        parts: list[tuple[Samples, Tensor]] = []
        dropped: list[tuple[Samples, Tensor]] = []  # equal groups, to fill a batch the rounds could not
        kept = groups = equal = rounds = filled = 0
        outcomes: list[int] | None = [0, 0] if k > 1 and self.judge is not None else None  # all right, all wrong
        for _ in range(cfg.dynamic_sampling_rounds):
            rounds += 1
            with precision():
                s, scores = sample_and_score(
                    self.policy, self.reward_model, self.tok, self.next_prompts(), cfg, critic, self.clock
                )
            flat = equal_groups(scores.cpu(), k) if k > 1 else torch.zeros(len(scores), dtype=torch.bool)
            groups, equal = groups + len(flat), equal + int(flat.sum())
            if outcomes is not None:
                outcomes = self.group_outcomes(s, k, outcomes)
            if not cfg.dynamic_sampling:
                parts.append((s, scores))
                break
            rows = [g * k + j for g in (~flat).nonzero().flatten().tolist() for j in range(k)]
            rows = rows[: cfg.batch_size - kept]
            if rows:
                parts.append((select_samples(s, rows), scores[rows]))
                kept += len(rows)
            if kept == cfg.batch_size:
                break
            spare = [g * k + j for g in flat.nonzero().flatten().tolist() for j in range(k)]
            if spare:
                dropped.append((select_samples(s, spare), scores[spare]))
        else:
            if kept == 0:
                raise UserError(
                    f"step {self.step_count + 1}: dynamic sampling kept 0 of {cfg.batch_size // k} groups in "
                    f"{cfg.dynamic_sampling_rounds} rounds: every group's rewards were all equal (the task is too "
                    "easy or too hard for this policy); raise --dynamic_sampling_rounds or --group_size, or drop "
                    "--dynamic_sampling"
                )
            pool = concat_samples([d[0] for d in dropped], self.tok.pad_token_id)
            pool_scores = torch.cat([d[1] for d in dropped])
            rows = list(range(cfg.batch_size - kept))  # every round drew a full batch: enough dropped replies
            parts.append((select_samples(pool, rows), pool_scores[rows]))
            filled = len(rows) // k
        s = concat_samples([p[0] for p in parts], self.tok.pad_token_id)
        scores = torch.cat([p[1] for p in parts])
        sampling = {"equal_groups": equal / groups, "rounds": float(rounds)} if k > 1 else {}
        if outcomes is not None:  # the gold judge is a checker: equal groups told apart, all right or all wrong
            sampling["solved_groups"], sampling["failed_groups"] = outcomes[0] / groups, outcomes[1] / groups
        if cfg.dynamic_sampling:
            sampling["filled_groups"] = float(filled)
        with precision():
            exp = experience_from(
                self.policy, self.ref_model, s, scores, beta, cfg, self.ppo, self.algorithm, sampling, self.clock
            )
        exp.beta, exp.version = beta, self.step_count
        return exp

    def group_outcomes(self, s: Samples, k: int, counts: list[int]) -> list[int] | None:
        """`counts` plus this round's groups that the gold judge marks all right and all wrong, when it is a checker
        (every value 0 or 1); None when it is not (a judge of degree: equal rewards cannot be told apart by it).
        The judge's values are kept for the step's own gold, so a checker runs once per reply."""
        gold = torch.as_tensor(self.judge(s.prompts, s.texts), dtype=torch.float64)  # type: ignore[misc]
        self.round_gold = (s.texts, gold)
        if not bool(((gold == 0) | (gold == 1)).all()):
            return None
        g = gold.view(-1, k)
        return [counts[0] + int((g == 1).all(1).sum()), counts[1] + int((g == 0).all(1).sum())]

    def experience(self) -> tuple[Experience, dict[str, float]]:
        """This step's batch and the phase times of its sampling when another process did it (`--async_rollouts`:
        sampled by the worker, staleness 1 with the weights before the last update)."""
        if not self.cfg.async_rollouts:
            return self.rollouts(self.kl_ctl.beta), {}
        exp, phases, self.round_gold = self.ahead.next(self, self.cfg.staleness, self.kl_ctl.beta)
        return exp, phases

    # What the sampling process of --async_rollouts calls (`async_rollouts.Sampled`).
    def sample_ahead(self, beta: float, version: int) -> Reply:
        exp = self.rollouts(beta)
        exp.version = version
        reply, self.round_gold = (exp, self.clock.take(), self.round_gold), None
        return reply

    def sampling_states(self) -> tuple[Tensor, Tensor]:
        """The states sampling draws from: torch's global generator (the tokens) and the prompt generator."""
        return torch.get_rng_state(), self.prompt_generator.get_state()

    def set_sampling_states(self, states: tuple[Tensor, Tensor]) -> None:
        torch.set_rng_state(states[0])
        self.prompt_generator.set_state(states[1])

    def close(self) -> None:
        """Stop the sampling process of `--async_rollouts` (none otherwise). A batch in flight is dropped: stepping
        on samples it afresh (a checkpoint, `state()`, receives it first and is exact)."""
        self.ahead.close()

    def step(self) -> dict[str, float]:
        t0 = time.perf_counter()
        exp, sampler_phases = self.experience()
        beta, prompts = exp.beta, exp.prompts  # the batch's own beta (the step before's, when sampled ahead)
        t_rollout = time.perf_counter() - t0
        mask = exp.response_mask
        seq_kl = exp.kl.sum(1)
        # --kl_limit decides before the update: once the sampled policies' moving-average KL is over the limit,
        # this step's update is not applied, so the policy kept is the last one updated under it (nothing copied).
        ma = self.kl_average.add(mean_across_ranks({"kl": seq_kl.mean().item()})["kl"])
        self.stopped_by_kl_limit = self.cfg.kl_limit is not None and ma > self.cfg.kl_limit
        with self.clock("update"):
            with autocast(self.device, self.cfg.bf16):  # the weights change: each forward casts them afresh
                stats = {} if self.stopped_by_kl_limit else self._update(exp, beta)
        cached, self.round_gold = self.round_gold, None
        if cached is not None and cached[0] == exp.texts:  # one round: its replies, judged already
            gold = cached[1].tolist()
        else:
            gold = self.judge(prompts, exp.texts) if self.judge is not None else None
        # A few of the step's replies with what was measured of each (the run's report shows them by step).
        lengths = mask.sum(1)
        self.last_samples = [
            {
                "prompt": prompts[i],
                "response": exp.texts[i],
                "score": exp.scores[i].item(),
                "gold": None if gold is None else float(gold[i]),
                "kl": seq_kl[i].item(),
                "tokens": int(lengths[i].item()),
            }
            for i in range(min(SAMPLES_KEPT, len(prompts)))
        ]
        self.step_count += 1
        # Namespaced as CleanRL's and TRL's logs: objective/ (what is optimized), policy/ (what the policy does),
        # ppo/ (the update's diagnostics), sampling/ (grouped algorithms: groups of equal rewards), time/.
        metrics = {
            "step": self.step_count,
            "objective/score": exp.scores.mean().item(),
            "objective/kl": seq_kl.mean().item(),
            "objective/beta": beta,
            "objective/non_score_reward": (-beta * seq_kl).mean().item(),
            "policy/entropy": masked_mean(exp.entropy, mask).item(),
            "policy/response_length": lengths.float().mean().item(),
            "policy/length_limit": float(self.cfg.max_new_tokens),  # what the length alarms measure against
            "policy/prompt_tokens": float(exp.batch.observations[0].shape[1]),  # the batch's padded prompt length
            "policy/eos_rate": exp.eos.float().mean().item(),
            "policy/distinct_2": distinct_2(exp.texts),
            **{f"ppo/{k}": v for k, v in stats.items()},
            **{f"sampling/{k}": v for k, v in exp.sampling.items()},
            "time/rollout_s": t_rollout,  # under --async_rollouts: the wait for the sampler, not its phases
            "time/step_s": time.perf_counter() - t0,
            **{f"time/{phase}_s": v for phase, v in {**sampler_phases, **self.clock.take()}.items()},  # sample, ...
        }
        if self.cfg.async_rollouts:
            metrics["policy/staleness"] = float(self.step_count - 1 - exp.version)  # updates since its sampling
        metrics["time/episodes_per_s"] = len(prompts) / metrics["time/step_s"]
        if gold is not None:
            metrics["objective/gold"] = float(np.mean(gold))
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
                lr_scales=self.cfg.lr_scales(self.step_count),
                policy_loss=self.algorithm.policy_loss,
                kl_loss_coef=beta if self.cfg.kl_in == "loss" else 0.0,
                group_size=self.cfg.group_size,
                kl_estimator=self.cfg.penalty_estimator,
                length=self.cfg.max_new_tokens,
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
        pending = self.pending_state()  # first: receiving the batch in flight advances the sampling RNG states
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
            "pending": gather(pending),  # every rank's batch sampled ahead, in rank order (each is None without one)
        }

    def pending_state(self) -> dict[str, Any] | None:
        """The batch sampled ahead under `--async_rollouts` (received first if in flight), as plain types: a resumed
        run consumes the same batch."""
        pending = self.ahead.pending(self)
        if pending is None:
            return None
        exp, phases, gold = pending
        return {"experience": experience_state(exp), "phases": phases, "gold": gold}

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
        pending = state.get("pending", [None] * world)[rank]
        if pending is not None:  # the RNG states just loaded are those after it was sampled
            exp = experience_from_state(pending["experience"])
            self.ahead.resumed = (exp, pending["phases"], pending["gold"])
