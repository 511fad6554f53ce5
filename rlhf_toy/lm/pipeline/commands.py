"""What the commands of `rlhf-toy` run, where a stage needs more than its configs: `all`, `sample`, the recipes and
the comparisons, and the one JSON line each stage prints. The command table (`cli.py`) names these by reference,
so that `rlhf-toy --help` imports none of them (nor torch's model libraries)."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass

import torch

from rlhf_toy.cli import print_summary
from rlhf_toy.config import check, check_seed, option
from rlhf_toy.errors import UserError

from ..algorithms.reward import RewardConfig
from ..algorithms.sft import SFTConfig
from ..data.preferences import PreferenceConfig
from ..models.base import context_length
from ..models.causal_lm import ModelConfig
from ..models.chat import check_fits, encode_prompts
from ..models.checkpoints import load_causal_lm
from ..models.devices import resolve_device
from ..models.sampling import sample
from .compare import CompareConfig, run_comparison
from .policy_stage import OutputConfig, stage_policy
from .recipes import run_reasoning, run_smollm2, run_smollm2_arithmetic
from .reward_stage import stage_reward
from .run import RunConfig, quiet_libraries
from .stages import EvalConfig, TokenizerConfig, stage_evaluate, stage_preferences, stage_sft, stage_tokenizer


@dataclass
class SampleConfig:
    """Chat with a saved model: one prompt per line on stdin (or --prompt), replies on stdout."""

    model_dir: str = option("A saved causal LM with its tokenizer.", "runs/helpdesk/sft")
    prompt: str | None = option("One prompt (otherwise read lines from stdin).", None)
    n: int = option("Replies per prompt.", 1)
    temperature: float = option("Sampling temperature.", 1.0)
    max_new_tokens: int = option("Longest reply.", 32)
    seed: int = option("Sampling seed.", 0)
    device: str = option("auto (a GPU when there is one), cpu or cuda.", "auto")

    def __post_init__(self) -> None:
        check_seed(self.seed)
        check(self.n >= 1, "n", self.n, ">= 1")
        check(self.max_new_tokens >= 1, "max_new_tokens", self.max_new_tokens, ">= 1")
        check(self.temperature > 0, "temperature", self.temperature, "> 0, e.g. 1.0")


@dataclass
class RecipeConfig:
    steps: int | None = option("RL steps (default: the recipe's own).", None)

    def __post_init__(self) -> None:
        check(self.steps is None or self.steps >= 1, "steps", self.steps, ">= 1")


def run_all(run: RunConfig) -> int:
    """Every stage on its defaults, in order, ending with the evaluation table (a program reward: the reasoning
    recipe's stages, no preferences and no reward model)."""
    if run.checkable_task or run.reward_fn:
        run_reasoning(run)
        return 0
    t0 = time.perf_counter()
    print_summary(stage_tokenizer(run, TokenizerConfig()))
    print_summary(stage_sft(run, ModelConfig(), SFTConfig()))
    print_summary(stage_preferences(run, PreferenceConfig()))
    print_summary(stage_reward(run, RewardConfig()))
    print_summary(stage_policy(run, None, None, OutputConfig()))  # the ppo record, as `rlhf-toy ppo` runs it
    stage_evaluate(run, EvalConfig())
    print(json.dumps({"stage": "all", "wall_s": time.perf_counter() - t0, "threads": run.threads}))
    return 0


def stdin_lines():
    """Standard input's lines, decoded as UTF-8 one at a time: other bytes are one error naming the line."""
    for i, raw in enumerate(sys.stdin.buffer, 1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:
            raise UserError(f"line {i} of standard input is not UTF-8 text; send UTF-8") from None


def run_sample(cfg: SampleConfig) -> int:

    quiet_libraries()
    device = resolve_device(cfg.device)
    model, tok = load_causal_lm(cfg.model_dir, "chat")
    model.to(device)
    torch.manual_seed(cfg.seed)
    interactive = cfg.prompt is None and sys.stdin.isatty()
    lines = [cfg.prompt] if cfg.prompt is not None else stdin_lines()
    if interactive:
        print("Type a message (Ctrl-D to quit).", file=sys.stderr)
    for line in lines:
        prompt = line.strip()
        if not prompt:
            continue
        # As `ppo` does: refuse a reply length that does not fit, rather than shorten it without a word.
        check_fits(encode_prompts(tok, [prompt]), context_length(model.config), cfg.max_new_tokens + 1, "--prompt")
        for reply in sample(model, tok, [prompt] * cfg.n, cfg.max_new_tokens, cfg.temperature).texts:
            print(f"user: {prompt}\nbot:  {reply}")
    return 0


def compare(run: RunConfig, cfg: CompareConfig) -> int:
    """`compare` and its presets: 0 when the comparison produced its report."""
    return 0 if run_comparison(run, cfg) else 1


def smollm2(run: RunConfig, cfg: RecipeConfig) -> int:
    return 0 if run_smollm2(run, cfg.steps) else 1


def reasoning(run: RunConfig, cfg: RecipeConfig) -> int:
    return 0 if run_reasoning(run, cfg.steps) else 1


def smollm2_arithmetic(run: RunConfig, cfg: RecipeConfig) -> int:
    return 0 if run_smollm2_arithmetic(run, cfg.steps) else 1
