"""PPO throughput for language models: this project's RLHF step against TRL's PPO trainer.

Both sides: a randomly initialised tiny GPT-2 (policy, reference, reward model), batch 64 prompts per update,
exactly `response_length` generated tokens (no stop at EOS), 4 PPO epochs of one 64-sequence minibatch,
one torch thread. An episode = one prompt's generation + scoring + its share of the update.
TRL runs in its own virtual environment through the runners in `scripts/peers/` (trl 1.12 pins its own
versions); the docs' Results pages give the setup.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForSequenceClassification, GPT2Config, GPT2ForSequenceClassification

from rlhf_toy.lm.algorithms.online import ALGORITHMS
from rlhf_toy.lm.algorithms.rlhf import RLHFTrainer
from rlhf_toy.lm.data.tasks import helpdesk_task
from rlhf_toy.lm.models.base import load_base
from rlhf_toy.lm.models.causal_lm import ModelConfig, new_causal_lm
from rlhf_toy.lm.models.chat import prompt_text, train_tokenizer
from rlhf_toy.lm.pipeline.run import quiet_libraries
from rlhf_toy.report.page import PHASES

from . import SCRIPTS
from .floor import floors, value_head_weights, weights

# The TRL runner of each algorithm that TRL has (in scripts/peers/, beside this harness).
TRL_RUNNERS = {
    "ppo": "trl_ppo_bench.py",
    "rloo": "trl_critic_free_bench.py",
    **{name: "trl_critic_free_bench.py" for name in ("grpo", "dr_grpo", "dapo", "gspo")},
}
# The GRPO family's settings on TRL's GRPOTrainer (as scripts/peers/trl_grpo_loss_check.py matches the losses).
TRL_GRPO_FAMILY = {
    "grpo": ["--loss-type", "grpo"],
    "dr_grpo": ["--loss-type", "dr_grpo"],
    "dapo": ["--loss-type", "dapo", "--epsilon-high", "0.28"],
    "gspo": [
        "--loss-type",
        "grpo",
        "--importance-sampling-level",
        "sequence",
        "--epsilon",
        "3e-4",
        "--epsilon-high",
        "4e-4",
    ],
}


def ours(
    episodes: int,
    batch_size: int,
    response_length: int,
    n_layer: int,
    n_embd: int,
    threads: int,
    model_dir: str | None = None,
    algorithm: str = "ppo",
    count_flops: bool = False,
    async_rollouts: bool = False,
    bf16: str = "auto",
) -> dict[str, Any]:
    """This project's PPO (or RLOO / GRPO with 4 replies per prompt and the algorithm's own preset: RLOO one
    pass of 4 minibatches, GRPO 4 clipped epochs of them and the KL as a k3 term in the loss, as TRL's
    trainers do) on a random tiny GPT-2 of the given size, or on the pretrained model in `model_dir` (policy
    from it, reward model = its trunk with a fresh scalar head, as the TRL runners build them). `count_flops` runs
    the steps under torch's `FlopCounterMode` and reports their matrix-multiply GFLOPs per step (`gflops_per_step`,
    as the TRL runners' `--count-flops`; the counter slows the run, so its times are no measurement).
    `async_rollouts`: sample each batch in a second process beside the update (one more thread; `--async_rollouts`).
    `bf16`: `--bf16` (on: CPU autocast)."""
    torch.set_num_threads(threads)
    quiet_libraries()
    task = bench_task()
    if model_dir:
        policy, tok = load_base(model_dir)
        torch.manual_seed(0)
        rm = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1).eval()
    else:
        tok = bench_tokenizer()
        cfg = ModelConfig(n_layer=n_layer, n_embd=n_embd, n_head=2, n_positions=64)
        policy = new_causal_lm(tok, cfg, seed=0)
        rm_cfg = GPT2Config(
            vocab_size=len(tok),
            n_positions=64,
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=2,
            num_labels=1,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            pad_token_id=tok.pad_token_id,
            activation_function="gelu_pytorch_tanh",
        )
        rm = GPT2ForSequenceClassification(rm_cfg).eval()
    alg = ALGORITHMS[algorithm]
    # One minibatch of the whole batch at the TRL runner's learning rate for PPO; the algorithm's own preset in 4
    # minibatches of whole groups for RLOO and GRPO, as TRL's trainers.
    update = {"minibatch_size": batch_size, "learning_rate": 3e-6} if algorithm == "ppo" else {}
    rl, preset = alg.configs(
        steps=episodes // batch_size,
        batch_size=batch_size,
        temperature=0.7,
        max_new_tokens=response_length,
        stop_at_eos=False,
        kl_coef=0.05,
        # As TRL's trainers: GRPOTrainer puts beta x k3 in the loss, RLOO and PPO keep the KL in the reward.
        kl_in="loss" if alg.grouped and alg.policy_loss == "clipped" else "reward",
        **(update or {"minibatch_size": batch_size // 4}),
        async_rollouts=async_rollouts,
        bf16=bf16,
    )
    trainer = RLHFTrainer(policy, rm, tok, rl, preset, task.train_prompts, seed=0, algorithm=algorithm)
    t0 = time.perf_counter()
    rows = []
    with FlopCounterMode(display=False) if count_flops else contextlib.nullcontext() as counter:
        for _ in range(rl.steps):
            rows.append(trainer.step())
    train_s = time.perf_counter() - t0
    trainer.close()
    assert all(r["policy/response_length"] == response_length for r in rows), rows
    n = rl.steps * batch_size
    later = rows[1:] or rows  # the first step pays one-time costs (allocations, thread pools)
    times = {p: statistics.median(r[f"time/{p}_s"] for r in later) for p in PHASES if f"time/{p}_s" in later[0]}
    floor = floors(
        times,
        weights(policy),
        weights(rm),
        batch_size,
        round(statistics.mean(r["policy/prompt_tokens"] for r in later)),
        response_length,
        statistics.mean(r["ppo/epochs"] for r in later),
        preset.minibatch_size,
        alg.needs_values(preset),
        rl.group_size,
        value_head_weights(trainer.policy),
    )
    return {
        "peer": "rlhf-toy" + ("-async" if async_rollouts else "") + ("-bf16" if bf16 == "on" else ""),
        "algorithm": algorithm,
        "episodes": n,
        "batch_size": batch_size,
        "response_length": response_length,
        "n_layer": n_layer,
        "n_embd": n_embd,
        "train_s": train_s,
        "episodes_per_s": n / train_s,
        "tokens_per_s": n * response_length / train_s,
        "step_s": statistics.median(r["time/step_s"] for r in later),
        "phases": floor,
        "gflops_per_step": None if counter is None else counter.get_total_flops() / 1e9 / rl.steps,
    }


def trl(
    python: str,
    peers: Path,
    episodes: int,
    batch_size: int,
    response_length: int,
    n_layer: int,
    n_embd: int,
    threads: int,
    skip_gc: bool = False,
    model_dir: str | None = None,
    algorithm: str = "ppo",
    count_flops: bool = False,
) -> dict[str, Any]:
    """TRL on the same settings in its own venv, through the runner in the folder `peers` (`TRL_RUNNERS`): PPO
    through `trl_ppo_bench.py` (trl 1.12, the last with PPO), RLOO / GRPO through `trl_critic_free_bench.py`
    (the newest trl's RLOOTrainer / GRPOTrainer). `count_flops`: count the run's matrix-multiply FLOPs
    (`gflops`; its times are no measurement)."""
    runner = peers / TRL_RUNNERS[algorithm]
    common = [
        "--episodes",
        str(episodes),
        "--batch-size",
        str(batch_size),
        "--response-length",
        str(response_length),
        "--n-layer",
        str(n_layer),
        "--n-embd",
        str(n_embd),
        "--threads",
        str(threads),
    ]
    if algorithm == "ppo":
        cmd = [python, str(runner), *common, *same_job(model_dir)]
        if skip_gc:
            cmd.append("--skip-gc-collect")
    else:
        cmd = [
            python,
            str(runner),
            "--trainer",
            "rloo" if algorithm == "rloo" else "grpo",
            *TRL_GRPO_FAMILY.get(algorithm, []),
            *same_job(model_dir),
            "--group-size",
            str(ALGORITHMS[algorithm].default_group_size),
            "--minibatch-size",
            str(batch_size // 4),
            *common,
        ]
    if model_dir:
        cmd += ["--model-dir", str(model_dir)]
    if count_flops:
        cmd.append("--count-flops")
    return run_json(cmd, threads, "trl" + ("-nogc" if skip_gc else ""))


def work_comparison(
    gflops_per_step: dict[str, float],
    episodes_per_s: dict[str, float],
    batch_size: int,
    gflop_per_s: float,
    target: float = 3.0,
) -> dict[str, Any]:
    """How much of a speed ratio is less work and how much faster work, from each side's matrix-multiply GFLOPs per
    step (`gflops_per_step`, counted by torch's `FlopCounterMode` on one step: "rlhf-toy" and "trl") and its
    measured episodes/s.

    Per side: the step's seconds (`batch_size` / episodes/s), its floor at `gflop_per_s` (the rate this machine's
    matrix multiplies reach at the update's shapes) and the distance to it. Then `work_ratio` (TRL's FLOPs over
    ours: the speed ratio if both sides ran their FLOPs equally fast), `speed_ratio`, `efficiency_ratio` (=
    speed / work: how much faster our FLOPs run than TRL's) and `efficiency_for_target`, the efficiency ratio
    that a speed ratio of `target` would take.
    """
    out: dict[str, Any] = {}
    for peer in ("rlhf-toy", "trl"):
        step_s = batch_size / episodes_per_s[peer]
        floor_s = gflops_per_step[peer] / gflop_per_s
        out[peer] = {
            "gflops_per_step": gflops_per_step[peer],
            "step_s": step_s,
            "floor_s": floor_s,
            "distance": step_s / floor_s,
        }
    work = gflops_per_step["trl"] / gflops_per_step["rlhf-toy"]
    speed = episodes_per_s["rlhf-toy"] / episodes_per_s["trl"]
    out.update(
        work_ratio=work,
        speed_ratio=speed,
        efficiency_ratio=speed / work,
        target=target,
        efficiency_for_target=target / work,
    )
    return out


def ours_in_subprocess(**kw: Any) -> dict[str, Any]:
    code = (
        f"import json, sys; sys.path.insert(0, {str(SCRIPTS)!r}); from benchlib.rlhf import ours; "
        f"print(json.dumps(ours(**{kw!r})))"
    )
    return run_json([sys.executable, "-c", code], kw["threads"], "rlhf-toy")


def bench_task():
    """The help-desk prompts both sides train on."""
    return helpdesk_task(n_train=4000, n_eval=10)


@functools.cache
def bench_tokenizer():
    """The tiny models' tokenizer: a 512-token BPE of the task's prompts and replies (one per process)."""
    task = bench_task()
    return train_tokenizer([p for p, _ in task.train] + [r for _, r in task.train], 512)


@functools.cache
def same_job(model_dir: str | None) -> tuple[str, ...]:
    """The TRL runners' arguments that give them `ours`' job (written once per process): the same prompts and, for
    the tiny models, this project's tokenizer (`--tokenizer-dir`) and its prompt format, so that both sides
    sample from the same token ids. A pretrained model's runner uses the model's own tokenizer and chat template,
    as `ours` does."""
    folder = Path(tempfile.mkdtemp())
    prompts = bench_task().train_prompts
    args: tuple[str, ...] = ("--prompts-file", str(folder / "prompts.json"))
    if not model_dir:
        prompts = [prompt_text(p) for p in prompts]  # ids equal `encode_prompts`' under this tokenizer
        bench_tokenizer().save_pretrained(str(folder / "tokenizer"))
        args += ("--tokenizer-dir", str(folder / "tokenizer"))
    (folder / "prompts.json").write_text(json.dumps(prompts))
    return args


def run_json(cmd: list[str], threads: int, peer: str) -> dict[str, Any]:
    """Run one benchmark process on `threads` threads, offline: its last stdout line (JSON), or its last error
    line, labelled with `peer`."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if p.returncode != 0:
        return {"peer": peer, "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return {"peer": peer, **json.loads(p.stdout.strip().splitlines()[-1])}
