"""Shared by the language-model tests: the tiny settings of each stage, and running a stage through the CLI."""

import os
import textwrap

import pytest

from rlhf_toy.cli import parse_configs
from rlhf_toy.errors import run_cli
from rlhf_toy.lm.agents.command import AgentRunConfig, agent_command, start_agent
from rlhf_toy.lm.agents.registry import get_env
from rlhf_toy.lm.models.causal_lm import ModelConfig
from rlhf_toy.lm.models.devices import cpu_bf16_native
from rlhf_toy.lm.pipeline.cli import main

THREADS = os.environ.get("RLHF_TOY_TEST_THREADS", "1")  # tests/conftest.py: the suite under other numerics
TINY = {
    "tokenizer": ["--vocab_size", "400", "--max_train_pairs", "2000"],
    "sft": [
        "--n_layer",
        "2",
        "--n_embd",
        "64",
        "--n_head",
        "2",
        "--epochs",
        "2",
        "--batch_size",
        "32",
        "--learning_rate",
        "5e-3",
        "--max_train_pairs",
        "2000",
    ],
    "preferences": ["--n_prompts", "40", "--k", "3", "--n_eval_prompts", "10", "--max_new_tokens", "24"],
    "reward": ["--epochs", "1", "--batch_size", "16", "--min_steps", "10"],
}
PPO_TINY = [
    "--steps",
    "2",
    "--batch_size",
    "8",
    "--minibatch_size",
    "4",
    "--max_new_tokens",
    "16",
    "--judge",
    "tests.judges:length",
]


def stage(name, run_dir, *extra):
    """Run one stage in-process through the CLI (exit status as `rlhf-toy` would return it)."""
    return run_cli(
        main,
        [name, "--run_dir", str(run_dir), "--progress", "False", "--threads", THREADS, *TINY.get(name, []), *extra],
    )


# --bf16 on needs a CPU that multiplies bf16 natively (AVX512-BF16 or AMX); elsewhere it is refused (tested).
NEEDS_BF16 = pytest.mark.skipif(not cpu_bf16_native(), reason="this CPU has no native bf16 (AVX512-BF16 or AMX)")

# A command's process that dies (SIGKILL) as it saves the trainer state of step {step}: that step's policy is
# written, its state is not, so the checkpoint directory's temporary never lands. `python -c` it with the CLI's args.
KILL_AT_STEP = textwrap.dedent("""
    import os, signal, sys, torch
    real_save = torch.save
    def save(obj, f, *a, **k):  # the policy of step {step} is already written when the state is saved: die here
        if isinstance(obj, dict) and obj.get("step") == {step}:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_save(obj, f, *a, **k)
    torch.save = save
    from rlhf_toy.lm.pipeline.cli import main
    main(sys.argv[1:])
""")


def check_critic_warmup(trainer) -> None:
    """A trainer with `critic_warmup=1`: its first step moves the value head and not the policy, its second the
    policy."""
    import torch

    lm = [p.detach().clone() for p in trainer.policy.lm.parameters()]
    head = [p.detach().clone() for p in trainer.policy.value_head.parameters()]
    trainer.step()
    assert all(torch.equal(a, b) for a, b in zip(lm, trainer.policy.lm.parameters())), "the policy moved"
    assert not all(torch.equal(a, b) for a, b in zip(head, trainer.policy.value_head.parameters()))
    trainer.step()
    assert not all(torch.equal(a, b) for a, b in zip(lm, trainer.policy.lm.parameters()))


TINY_MODEL = ModelConfig(n_layer=2, n_embd=64, n_head=2, n_positions=128)


def tiny_agent(
    env: str,
    demos: int = 20,
    epochs: int = 1,
    seed: int = 0,
    history: int | None = None,
    demonstrator: str | None = None,
):
    """A tiny GPT-2 and its tokenizer after SFT on `demos` demonstrated episodes of `env` (as the agent command; by
    `demonstrator`, else the environment's)."""
    record = get_env(env)
    run = AgentRunConfig(seed=seed, demos=demos, sft_epochs=epochs, vocab_size=300, demonstrator=demonstrator)
    h = record.history if history is None else history
    model, tok, _ = start_agent(record, run, h, record.max_turns, TINY_MODEL)
    return model, tok


def agent_configs(argv: list[str]) -> tuple:
    """`(AgentRunConfig, AgentConfig, RLHFConfig, PPOConfig, LoraConfig)` as `rlhf-toy agent ARGV` parses them (its
    defaults: the algorithm's and environment's records that ARGV names)."""
    cmd = agent_command(argv)
    return parse_configs(cmd.load()[0], argv, "agent", cmd.help, cmd.defaults, cmd.unread)
