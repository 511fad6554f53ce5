#!/usr/bin/env python
"""Throughput anchor: TRL's critic-free trainers (``RLOOTrainer`` / ``GRPOTrainer`` of trl 1.16) on a tiny GPT-2
or a pretrained model, CPU only.

Benchmark harness, not product code. Everything is built offline:

* prompts: ``--prompts-file`` (a JSON list of texts; ``scripts/bench_rlhf.py`` writes rlhf-toy's helpdesk
  prompts), given to TRL as its ``prompt`` column: plain text, or one user turn (conversational format, so that
  TRL applies the tokenizer's chat template) when the tokenizer has a chat template;
* tiny mode: ``--tokenizer-dir`` (rlhf-toy's, from ``scripts/bench_rlhf.py``: the same token ids on both sides),
  or else a byte-level BPE (vocab ~512, [PAD] distinct from EOS, left padding) trained with ``tokenizers`` on
  a generated corpus plus the prompts; ``GPT2LMHeadModel`` policy and ``GPT2ForSequenceClassification(num_labels=1)``
  reward model, random init (this measures throughput, not learning);
* ``--model-dir``: policy from the pretrained directory, reward model = its trunk with a fresh scalar head.

Settings matched to rlhf-toy's RLOO / GRPO presets as ``scripts/bench_rlhf.py --algorithm`` runs them: a
generation batch of ``--batch-size`` completions (64) = batch / ``--group-size`` prompts x ``--group-size`` (4)
replies, exactly ``--response-length`` tokens each (``min_new_tokens`` = ``max_completion_length``: EOS cannot end
a reply early, as rlhf-toy's ``stop_at_eos=False``), temperature 0.7, KL coefficient ``beta`` 0.05 (so both load
a reference model), optimizer steps on minibatches of ``--minibatch-size`` (16) completions
(``per_device_train_batch_size``; ``steps_per_generation`` = batch / minibatch), ``num_iterations`` passes over
each generation batch (RLOO: 1, GRPO: 4 = rlhf-toy's epochs). Plain fp32, no gradient checkpointing, no dropout.
Everything else is the trainer's default (RLOO: leave-one-out baseline, KL in the reward; GRPO: group-scaled
advantages, k3 KL in the loss, ``loss_type="dapo"``).

Only ``trainer.train()`` is timed. stdout carries exactly one JSON line: ``trl_version, trainer, episodes,
batch_size, group_size, response_length, n_layer, n_embd, train_s, episodes_per_s, tokens_per_s, peak_rss_mb,
updates, gflops``
(an episode = one sampled completion, as in rlhf-toy; ``gflops``: the run's matrix-multiply GFLOPs under
``--count-flops``, else null). Everything else goes to stderr.

Usage (its own venv: the newest trl pins its own versions):
    python3 -m venv .venv-trl-new && .venv-trl-new/bin/pip install torch==2.13.0 && \\
        .venv-trl-new/bin/pip install "trl==1.16.0" transformers datasets accelerate "torch<2.14"
    .venv-trl-new/bin/python trl_critic_free_bench.py --trainer rloo --prompts-file P.json [--episodes 512]
"""

import argparse
import sys

from peer_common import (
    add_common_args,
    configure,
    cpu_run_args,
    flop_counter,
    gflops,
    logger,
    peak_rss_mb,
    pretrained_tokenizer,
    quiet_libraries,
    scalar_head_model,
    tiny_gpt2_config,
    tiny_tokenizer,
)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trainer", choices=["rloo", "grpo"], required=True)
    p.add_argument("--prompts-file", required=True, help="JSON list of prompt texts")
    add_common_args(p)
    p.add_argument("--group-size", type=int, default=4, help="completions per prompt (num_generations)")
    p.add_argument("--minibatch-size", type=int, default=16, help="completions per optimizer step")
    p.add_argument("--epochs", type=int, default=None, help="num_iterations (default: rloo 1, grpo 4)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--beta", type=float, default=0.05)
    p.add_argument("--learning-rate", type=float, default=2e-5)
    p.add_argument("--model-dir", default=None, help="a pretrained causal LM directory (model + tokenizer)")
    # The GRPO family (GRPOTrainer only): rlhf-toy's grpo / dr_grpo / dapo / gspo map to these.
    p.add_argument("--loss-type", default=None, help="GRPOConfig.loss_type (default: TRL's own)")
    p.add_argument("--importance-sampling-level", default=None, help="token or sequence (GSPO)")
    p.add_argument("--epsilon", type=float, default=None, help="GRPOConfig.epsilon (eps_low)")
    p.add_argument("--epsilon-high", type=float, default=None, help="GRPOConfig.epsilon_high (DAPO's clip-higher)")
    a = p.parse_args()
    if a.epochs is None:
        a.epochs = 1 if a.trainer == "rloo" else 4
    for name, n in (("batch-size", a.batch_size), ("minibatch-size", a.minibatch_size)):
        if n % a.group_size or n <= 0:
            p.error(f"--{name} {n} must be a positive multiple of --group-size {a.group_size}")
    if a.batch_size % a.minibatch_size or a.episodes % a.batch_size:
        p.error("--batch-size must divide --episodes and be a multiple of --minibatch-size")
    return a


ARGS = parse_args()
configure(ARGS.threads)  # before torch / transformers are imported

import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

torch.set_num_threads(ARGS.threads)
torch.set_num_interop_threads(1)

import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, GPT2ForSequenceClassification, GPT2LMHeadModel  # noqa: E402

quiet_libraries(ARGS.verbose, Warning)

log = logger("trl_critic_free_bench")


def tiny_models(tmp, prompts, a):
    tokenizer = tiny_tokenizer(os.path.join(tmp, "tokenizer"), random.Random(a.seed), a, prompts)
    cfg = tiny_gpt2_config(tokenizer, a.n_positions, a.n_embd, a.n_layer, a.n_head)
    torch.manual_seed(a.seed)
    path = os.path.join(tmp, "policy")  # TRL loads the reference model from the policy's name_or_path
    GPT2LMHeadModel(cfg).save_pretrained(path)
    tokenizer.save_pretrained(path)
    # TRL scores decoded text re-encoded for the reward model, which can take more tokens than were sampled:
    # room for 4x (position embeddings only; the compute is the same)
    rm_cfg = tiny_gpt2_config(tokenizer, 4 * a.n_positions, a.n_embd, a.n_layer, a.n_head)
    return tokenizer, GPT2LMHeadModel.from_pretrained(path), GPT2ForSequenceClassification(rm_cfg)


def pretrained_models(model_dir, a):
    tokenizer = pretrained_tokenizer(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(a.seed)
    return tokenizer, policy, scalar_head_model(model_dir, tokenizer)


def main():
    a = ARGS
    prompts = json.loads(open(a.prompts_file).read())
    with tempfile.TemporaryDirectory(prefix="trl_critic_free_bench_") as tmp:
        tokenizer, policy, reward = pretrained_models(a.model_dir, a) if a.model_dir else tiny_models(tmp, prompts, a)
        chat = bool(getattr(tokenizer, "chat_template", None))
        rows = [[{"role": "user", "content": p}] for p in prompts] if chat else prompts
        lengths = [len(tokenizer.encode(p)) for p in prompts]
        if not a.model_dir and max(lengths) + a.response_length > a.n_positions:
            sys.exit(f"error: prompts up to {max(lengths)} tokens + {a.response_length} exceed --n-positions")
        updates = a.episodes // a.batch_size
        steps_per_generation = a.batch_size // a.minibatch_size
        common = dict(
            output_dir=os.path.join(tmp, "out"),
            per_device_train_batch_size=a.minibatch_size,
            gradient_accumulation_steps=1,
            steps_per_generation=steps_per_generation,
            num_generations=a.group_size,
            num_iterations=a.epochs,
            max_steps=updates * steps_per_generation * a.epochs,
            max_completion_length=a.response_length,
            generation_kwargs={"min_new_tokens": a.response_length},
            temperature=a.temperature,
            beta=a.beta,
            learning_rate=a.learning_rate,
            disable_dropout=True,
            bf16=False,
            gradient_checkpointing=False,
            **cpu_run_args(a.seed),
        )
        if a.trainer == "rloo":
            cfg, cls = trl.RLOOConfig(**common), trl.RLOOTrainer
        else:
            family = {
                "loss_type": a.loss_type,
                "importance_sampling_level": a.importance_sampling_level,
                "epsilon": a.epsilon,
                "epsilon_high": a.epsilon_high,
            }
            cfg = trl.GRPOConfig(**common, **{k: v for k, v in family.items() if v is not None})
            cls = trl.GRPOTrainer
        trainer = cls(
            model=policy,
            reward_funcs=reward,
            args=cfg,
            train_dataset=Dataset.from_dict({"prompt": rows}),
            processing_class=tokenizer,
            reward_processing_classes=tokenizer,
        )
        log(
            f"trl {trl.__version__} {cls.__name__} vocab={len(tokenizer)} chat_template={chat} prompts={len(rows)} "
            f"prompt tokens min/mean/max={min(lengths)}/{sum(lengths) / len(lengths):.1f}/{max(lengths)} "
            f"updates={updates} optimizer_steps={cfg.max_steps} generation_batch={cfg.generation_batch_size} "
            f"threads={torch.get_num_threads()} device={trainer.accelerator.device}"
        )
        with contextlib.redirect_stdout(sys.stderr), flop_counter(a.count_flops) as counter:  # TRL's metric dicts
            t0 = time.perf_counter()
            trainer.train()
            train_s = time.perf_counter() - t0
        key = "completions/mean_length"
        lengths_seen = [h[key] for h in trainer.state.log_history if key in h]
        log(f"mean completion length per step: {sorted(set(lengths_seen))}")
    episodes = updates * a.batch_size
    print(
        json.dumps(
            {
                "trl_version": trl.__version__,
                "trainer": a.trainer,
                "loss_type": getattr(cfg, "loss_type", None),
                "importance_sampling_level": getattr(cfg, "importance_sampling_level", None),
                "episodes": episodes,
                "batch_size": a.batch_size,
                "group_size": a.group_size,
                "response_length": a.response_length,
                "n_layer": a.n_layer,
                "n_embd": a.n_embd,
                "train_s": round(train_s, 3),
                "episodes_per_s": round(episodes / train_s, 3),
                "tokens_per_s": round(episodes * a.response_length / train_s, 1),
                "peak_rss_mb": peak_rss_mb(),
                "updates": updates,
                "gflops": gflops(counter),  # with --count-flops: the run's matrix-multiply GFLOPs, else None
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
