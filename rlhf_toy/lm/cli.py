"""`python -m rlhf_toy.lm STAGE [flags]` (also installed as `rlhf-toy`): the toy RLHF pipeline's stages."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

from rlhf_toy.cli import Command, dispatch
from rlhf_toy.errors import UserError, run_cli

from .model import ModelConfig
from .pipeline import RunConfig, TokenizerConfig, stage_preferences, stage_reward, stage_sft, stage_tokenizer
from .preferences import PreferenceConfig
from .reward import RewardConfig
from .sft import SFTConfig


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
    print(json.dumps({k: v for k, v in metrics.items() if k not in ("history", "samples", "config")}))
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
    "sample": Command("Chat with any saved model from the terminal.", (SampleConfig,), _sample),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("rlhf-toy", COMMANDS, argv)


def console_main() -> None:
    raise SystemExit(run_cli(main))
