"""`python -m rlhf_toy.lm STAGE [flags]` (also installed as `rlhf-toy`): the toy RLHF pipeline's stages."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field

from rlhf_toy.cli import Command, dispatch
from rlhf_toy.errors import UserError, run_cli
from rlhf_toy.ppo import PPOConfig

from .model import ModelConfig
from .overopt import OveroptConfig, run_overoptimization
from .pipeline import RunConfig, TokenizerConfig, stage_preferences, stage_reward, stage_sft, stage_tokenizer
from .preferences import PreferenceConfig
from .reward import RewardConfig
from .rlhf import LM_PPO, RLHFConfig
from .sft import SFTConfig
from .stages_rl import EvalConfig, ResumeConfig, stage_evaluate, stage_ppo


@dataclass
class SampleConfig:
    """Chat with a saved model: one prompt per line on stdin (or --prompt), replies on stdout."""

    model_dir: str = field(default="runs/helpdesk/sft", metadata={"help": "A saved causal LM with its tokenizer."})
    prompt: str | None = field(default=None, metadata={"help": "One prompt (otherwise read lines from stdin)."})
    n: int = field(default=1, metadata={"help": "Replies per prompt."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    max_new_tokens: int = field(default=32, metadata={"help": "Longest reply."})
    seed: int = field(default=0, metadata={"help": "Sampling seed."})

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_new_tokens < 1 or self.temperature <= 0:
            raise UserError("n and max_new_tokens must be >= 1 and temperature > 0")


def _print(metrics: dict) -> int:
    print(json.dumps({k: v for k, v in metrics.items() if k not in ("history", "samples", "config", "ppo")}))
    return 0


def _all(run: RunConfig) -> int:
    """Every stage on its defaults, in order, ending with the evaluation table."""
    from .pipeline import stage_preferences, stage_reward, stage_sft, stage_tokenizer

    t0 = time.perf_counter()
    _print(stage_tokenizer(run, TokenizerConfig()))
    _print(stage_sft(run, ModelConfig(), SFTConfig()))
    _print(stage_preferences(run, PreferenceConfig()))
    _print(stage_reward(run, RewardConfig()))
    _print(stage_ppo(run, RLHFConfig(), LM_PPO, ResumeConfig()))
    stage_evaluate(run, EvalConfig())
    print(json.dumps({"stage": "all", "wall_s": time.perf_counter() - t0}))
    return 0


def _sample(cfg: SampleConfig) -> int:
    from pathlib import Path

    import torch

    from .pipeline import load_causal_lm, quiet_libraries
    from .sampling import sample

    quiet_libraries()
    model, tok = load_causal_lm(Path(cfg.model_dir), "chat")
    torch.manual_seed(cfg.seed)
    interactive = cfg.prompt is None and sys.stdin.isatty()
    lines = [cfg.prompt] if cfg.prompt is not None else sys.stdin
    if interactive:
        print("Type a message (Ctrl-D to quit).", file=sys.stderr)
    for line in lines:
        prompt = line.strip()
        if not prompt:
            continue
        for reply in sample(model, tok, [prompt] * cfg.n, cfg.max_new_tokens, cfg.temperature).texts:
            print(f"user: {prompt}\nbot:  {reply}")
    return 0


COMMANDS = {
    "tokenizer": Command("Stage 1: train the BPE tokenizer on the task's text.", (RunConfig, TokenizerConfig),
                         lambda r, c: _print(stage_tokenizer(r, c))),
    "sft": Command("Stage 2: supervised fine-tuning of a tiny GPT-2 (the reference model).",
                   (RunConfig, ModelConfig, SFTConfig), lambda r, m, c: _print(stage_sft(r, m, c))),
    "preferences": Command("Stage 3: sample k replies per prompt, score them with the gold judge, pair them.",
                           (RunConfig, PreferenceConfig), lambda r, c: _print(stage_preferences(r, c))),
    "reward": Command("Stage 4: train the reward model (Bradley-Terry) and report held-out accuracy.",
                      (RunConfig, RewardConfig), lambda r, c: _print(stage_reward(r, c))),
    "ppo": Command("Stage 5: PPO against the reward model with a KL penalty to the frozen SFT reference.",
                   (RunConfig, RLHFConfig, PPOConfig, ResumeConfig), lambda r, c, p, x: _print(stage_ppo(r, c, p, x)),
                   defaults=LM_PPO),
    "evaluate": Command("Stage 6: SFT vs best-of-n vs PPO on held-out prompts (table in run_dir/eval.md).",
                        (RunConfig, EvalConfig), lambda r, c: _print(stage_evaluate(r, c))),
    "all": Command("Every stage on the defaults (tokenizer .. evaluate), ending with the evaluation table.",
                   (RunConfig,), _all),
    "overopt": Command("The lesson's warning: PPO at several betas vs best-of-n, gold and proxy against sqrt(KL).",
                       (RunConfig, OveroptConfig), lambda r, c: 0 if run_overoptimization(r, c) else 1),
    "sample": Command("Chat with any saved model from the terminal.", (SampleConfig,), _sample),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("rlhf-toy", COMMANDS, argv)


def console_main() -> None:
    raise SystemExit(run_cli(main))
