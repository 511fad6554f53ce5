#!/usr/bin/env python
"""Peer: TRL 1.16's ``GRPOTrainer(environment_factory=...)`` on FrozenLake played through a tool, CPU only.

Benchmark harness, not product code (``scripts/bench_agents.py`` runs it beside rlhf-toy's ``agent`` command).
The policy starts from ``--model-dir``: the tiny GPT-2 that ``bench_agents.py`` fine-tuned on demonstrations in the
Qwen 2.5 chat template (so TRL's response parser reads its tool calls), the same directory rlhf-toy's side starts
from. The environment is ``frozenlake_tools.FrozenLakeTools`` (its ``move`` method is the tool, ``get_reward`` the
reward); every rollout resets with its dataset row's ``seed``, one seed per group of ``--group-size`` rollouts.

Settings matched to rlhf-toy's GRPO on an agent (``--algorithm grpo --loss_aggregation token --kl_in loss``):
generation batches of ``--batch-size`` rollouts = batch / group prompts x group replies, ``num_iterations`` 4 passes
of minibatches of ``--minibatch-size`` rollouts, group-normalised advantages, the clipped loss averaged over the
tokens of the batch (``loss_type="dapo"``, TRL's default: the mean over the batch's tokens, rlhf-toy's
``--loss_aggregation token``), k3 KL in the loss with ``beta``, learning rate decayed linearly to 0 (rlhf-toy's
agents anneal it), temperature ``--temperature``, each reply at most ``--max-new-tokens`` (TRL's own limit is the
whole rollout's, for every turn); a rollout ends when a reply calls no tool or after ``--max-turns`` replies
(``max_tool_calling_iterations`` = turns - 1); tool results are masked out of the loss.

Only ``trainer.train()`` is timed. stdout carries one JSON line: ``trl_version, episodes, train_s,
episodes_per_s, success`` (the sampled success of each generation batch) ``, turns, model_dir`` (the trained policy,
saved for the held-out evaluation). Everything else goes to stderr.
"""

import argparse
import sys

from peer_common import configure, cpu_run_args, logger, peak_rss_mb, pretrained_tokenizer, quiet_libraries


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", required=True, help="the fine-tuned tiny model (model + tokenizer)")
    p.add_argument("--out", required=True, help="where the trained policy is saved")
    p.add_argument("--instructions", required=True, help="the user turn before the first observation")
    p.add_argument("--steps", type=int, required=True, help="generation batches (rlhf-toy's RL steps)")
    p.add_argument("--batch-size", type=int, default=64, help="rollouts per generation batch")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--minibatch-size", type=int, default=16)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens of one reply")
    p.add_argument(
        "--max-completion-length", type=int, required=True, help="tokens of a whole rollout after its prompt"
    )
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--beta", type=float, default=0.01)
    p.add_argument("--learning-rate", type=float, default=3e-4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", action="store_true")
    return p.parse_args()


ARGS = parse_args()
configure(ARGS.threads)  # before torch / transformers are imported

import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(ARGS.threads)
torch.set_num_interop_threads(1)

import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from frozenlake_tools import FrozenLakeTools  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from trl.chat_template_utils import add_response_schema, supports_tool_calling  # noqa: E402

quiet_libraries(ARGS.verbose, Warning)
log = logger("trl_env_bench")
FINISHED: list[tuple[bool, int]] = []  # (success, tool calls) of every scored rollout, in order


class CountedFrozenLake(FrozenLakeTools):
    """The same game, keeping each rollout's success and number of calls for the report (TRL logs only rewards)."""

    def reset(self, seed=None, **row):
        self.calls = 0
        return super().reset(seed=seed)

    def move(self, direction: str) -> str:
        """Move one square on the frozen lake.

        Args:
            direction: Where to move: left, down, right or up.
        """
        self.calls += 1
        return super().move(direction)

    def get_reward(self) -> float:
        FINISHED.append((self.success, self.calls))
        return self.reward


def main():
    a = ARGS
    tokenizer = add_response_schema(pretrained_tokenizer(a.model_dir))
    if not supports_tool_calling(tokenizer):
        sys.exit("error: the model directory's chat template cannot render tool calls")
    policy = AutoModelForCausalLM.from_pretrained(a.model_dir)
    rng = np.random.default_rng(a.seed)
    n_prompts = a.steps * a.batch_size // a.group_size
    seeds = [2 * int(s) for s in rng.integers(0, 2**30, size=n_prompts)]  # even: training seeds, as rlhf-toy's
    rows = {"prompt": [[{"role": "user", "content": a.instructions + "\n"}]] * n_prompts, "seed": seeds}
    steps_per_generation = a.batch_size // a.minibatch_size
    cfg = trl.GRPOConfig(
        output_dir=os.path.join(a.out, "trainer"),
        per_device_train_batch_size=a.minibatch_size,
        gradient_accumulation_steps=1,
        steps_per_generation=steps_per_generation,
        num_generations=a.group_size,
        num_iterations=a.epochs,
        max_steps=a.steps * steps_per_generation * a.epochs,
        max_completion_length=a.max_completion_length,
        max_tool_calling_iterations=a.max_turns - 1,
        # each reply at most --max-new-tokens, as rlhf-toy's (TRL's own limit is the whole rollout's, every turn)
        generation_kwargs={"max_new_tokens": a.max_new_tokens},
        temperature=a.temperature,
        beta=a.beta,
        loss_type="dapo",  # TRL's default: the loss over every token of the batch (rlhf-toy's "token")
        learning_rate=a.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=0,
        shuffle_dataset=False,
        disable_dropout=True,
        bf16=False,
        gradient_checkpointing=False,
        **cpu_run_args(a.seed),
    )
    trainer = trl.GRPOTrainer(
        model=policy,
        args=cfg,
        train_dataset=Dataset.from_dict(rows),
        processing_class=tokenizer,
        environment_factory=CountedFrozenLake,
    )
    log(
        f"trl {trl.__version__} GRPOTrainer(environment_factory) vocab={len(tokenizer)} steps={a.steps} "
        f"optimizer_steps={cfg.max_steps} generation_batch={cfg.generation_batch_size} "
        f"threads={torch.get_num_threads()}"
    )
    with contextlib.redirect_stdout(sys.stderr):  # TRL's metric dicts
        t0 = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - t0
    trainer.model.save_pretrained(os.path.join(a.out, "model"))
    tokenizer.save_pretrained(os.path.join(a.out, "model"))
    episodes = a.steps * a.batch_size
    batches = [FINISHED[i : i + a.batch_size] for i in range(0, len(FINISHED), a.batch_size)]
    print(
        json.dumps(
            {
                "trl_version": trl.__version__,
                "episodes": episodes,
                "scored": len(FINISHED),
                "train_s": round(train_s, 3),
                "episodes_per_s": round(episodes / train_s, 3),
                "success": [round(float(np.mean([s for s, _ in b])), 4) for b in batches],
                "turns": [round(float(np.mean([c + 1 for _, c in b])), 3) for b in batches],
                "peak_rss_mb": peak_rss_mb(),
                "model_dir": os.path.join(a.out, "model"),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
