#!/usr/bin/env python
"""An agent against TRL's environment GRPO: the same tiny model, tokenizer and game, alternated rounds, medians.

The game is FrozenLake 4x4 (not slippery) played through a tool (`scripts/peers/frozenlake_tools.py`): the model
calls `move(direction)` in the Qwen 2.5 chat template's tool-call format, because TRL 1.16's
`GRPOTrainer(environment_factory=...)` reads tool calls only through a response parser it ships for known chat
templates. Preparation, once: the Qwen 2.5 template (read from TRL's own package), a byte-level BPE trained on
demonstrated conversations with that template's special tokens, a fresh tiny GPT-2, and SFT on a noisy walker's
demonstrations (the shortest-path move half of the time) with the whole conversation in the context, as TRL's tool
loop keeps it. Then each round runs, from that one model and one thread each:

* ours: `python -m rlhf_toy.lm agent --env frozenlake_tools:make --base_model <sft> --sft_epochs 0 --algorithm
  grpo --kl_in loss --history -1 ...` (GAE-free trajectory GRPO on the agent loop), its RL time from `eval.json`;
* TRL: `scripts/peers/trl_env_bench.py` (GRPOTrainer with `environment_factory`, the matched settings), its
  `trainer.train()` time.

Reported: episodes per second (median over rounds) and their ratio; the sampled success of each step's batch on
both sides (its mean over the last quarter of the steps); and the greedy held-out success of both trained policies
under this project's evaluation (the same held-out episodes for both).

    .venv-trl-new/bin/pip install gymnasium      # the TRL venv of scripts/bench_rlhf.py, plus the game's library
    python scripts/bench_agents.py --trl-python .venv-trl-new/bin/python --repeats 3 --steps 5
    python scripts/bench_agents.py --trl-python .venv-trl-new/bin/python --repeats 3 --steps 5 \\
        --async-rollouts --trl-two-threads      # also ours beside its update, and TRL on two threads
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
sys.path.insert(0, str(PEERS))

import frozenlake_tools  # noqa: E402

from rlhf_toy.lm.agents.registry import ALL_HISTORY, user_record  # noqa: E402
from rlhf_toy.lm.agents.rollout import RolloutSettings, demo_pairs, demonstrate, render_context  # noqa: E402
from rlhf_toy.lm.agents.trainer import held_out  # noqa: E402
from rlhf_toy.lm.algorithms.sft import SFTConfig, train_sft  # noqa: E402
from rlhf_toy.lm.models.causal_lm import ModelConfig, new_causal_lm  # noqa: E402
from rlhf_toy.lm.models.chat import BOT, USER, train_tokenizer  # noqa: E402
from rlhf_toy.lm.models.checkpoints import load_causal_lm, save_model  # noqa: E402

ENV = "frozenlake_tools:make"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trl-python", required=True, help="python of a venv with trl 1.16 and gymnasium")
    p.add_argument("--out", default="runs/bench_agents")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="RL steps (generation batches) on each side")
    p.add_argument("--batch-size", type=int, default=64, help="episodes per step (16 starts x 4)")
    p.add_argument("--max-turns", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens of one reply, on both sides")
    p.add_argument("--n-positions", type=int, default=1024)
    p.add_argument("--demos", type=int, default=240)
    p.add_argument("--sft-epochs", type=int, default=4)
    p.add_argument("--prepare-threads", type=int, default=2, help="torch threads of the (untimed) preparation")
    p.add_argument("--learning-rate", type=float, default=3e-4, help="RL (the agents' rate)")
    p.add_argument("--beta", type=float, default=0.01, help="KL coefficient (k3 in the loss on both sides)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature on both sides")
    p.add_argument("--eval-episodes", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--async-rollouts", action="store_true",
        help="also run ours with --async_rollouts True (a second process samples beside the update: two cores)",
    )  # fmt: skip
    p.add_argument("--trl-two-threads", action="store_true", help="also run TRL on two torch threads (two cores)")
    a = p.parse_args()
    for name in ("repeats", "steps", "batch_size", "max_turns", "max_new_tokens", "demos", "eval_episodes"):
        if getattr(a, name) < 1:  # one error line (argparse's, exit 2), not a traceback after the preparation
            p.error(f"--{name.replace('_', '-')} must be >= 1, not {getattr(a, name)}")
    return a


def qwen_template(trl_python: str) -> str:
    code = "import trl.chat_template_utils as m; print(m.qwen2_5_chat_template, end='')"
    return subprocess.run([trl_python, "-c", code], check=True, capture_output=True, text=True).stdout


def prepare(a, out: Path) -> Path:
    """The fine-tuned tiny model both sides start from (reused when it exists)."""
    sft_dir = out / "sft"
    if (sft_dir / "config.json").is_file():
        return sft_dir
    template = qwen_template(a.trl_python)
    torch.set_num_threads(a.prepare_threads)
    env = frozenlake_tools.make()
    rng = np.random.default_rng(a.seed)
    seeds = [2 * int(s) for s in rng.integers(0, 2**30, size=a.demos)]
    demos = demonstrate(env, seeds, "random", a.max_turns, ENV, rng)
    # The tokenizer learns the text the model will read: conversations rendered by the template.
    scratch = train_tokenizer([env.instructions], 300)
    scratch.chat_template = template
    texts = []
    for d in demos[:100]:
        messages = []
        for i, (obs, action) in enumerate(d.steps):
            messages += [{"role": "user", "content": f"{env.instructions}\n{obs}" if i == 0 else obs}]
            messages += [{"role": "assistant", "content": action}]
        texts.append(scratch.apply_chat_template(messages, tools=env.tools, tokenize=False))
    tok = train_tokenizer(texts, 600)
    tok.add_special_tokens({"additional_special_tokens": [USER, BOT, IM_START, IM_END]})
    tok.add_tokens(TOOL_TAGS)  # one token each, as in Qwen's own vocabulary (not special: the text keeps them)
    tok.eos_token = IM_END
    tok.chat_template = template
    model = new_causal_lm(tok, ModelConfig(n_positions=a.n_positions), seed=a.seed)
    held = max(1, a.demos // 10)
    pairs = [
        demo_pairs(tok, part, env.instructions, ALL_HISTORY, env.tools, a.n_positions)
        for part in (demos[held:], demos[:held])
    ]
    longest = max(len(x[0]) + len(x[1]) for x in pairs[0])
    print(f"[bench_agents] SFT on {len(pairs[0])} rows, the longest {longest} tokens", file=sys.stderr, flush=True)
    train_sft(model, tok, pairs[0], pairs[1], SFTConfig(epochs=a.sft_epochs, learning_rate=2e-3), a.seed, False)
    save_model(sft_dir, model, tok)
    torch.set_num_threads(1)
    return sft_dir


def ours(a, sft: Path, run_dir: Path, sampler: bool = False) -> dict:
    cmd = [
        sys.executable, "-m", "rlhf_toy.lm", "agent", "--env", ENV, "--base_model", str(sft), "--sft_epochs", "0",
        "--demos", "1", "--algorithm", "grpo", "--loss_aggregation", "token", "--kl_in", "loss",
        "--kl_coef", str(a.beta), "--history", "-1",
        "--max_turns", str(a.max_turns), "--max_new_tokens", str(a.max_new_tokens), "--temperature", str(a.temperature),
        "--steps", str(a.steps), "--batch_size", str(a.batch_size), "--minibatch_size", "16",
        "--learning_rate", str(a.learning_rate), "--eval_episodes", str(a.eval_episodes), "--save_every", "0",
        "--threads", "1", "--seed", str(a.seed), "--run_dir", str(run_dir), "--async_rollouts", str(sampler),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{PEERS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    figures = json.loads((run_dir / "eval.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    episodes = a.steps * a.batch_size
    return {
        "train_s": figures["rl_s"],
        "episodes_per_s": episodes / figures["rl_s"],
        "success": [r["agent/success"] for r in rows],
        "turns": [r["agent/turns"] for r in rows],
        "held_out": figures["eval"]["GRPO"]["success"],
    }


def theirs(a, sft: Path, run_dir: Path, context: int, threads: int = 1) -> dict:
    cmd = [
        a.trl_python, str(PEERS / "trl_env_bench.py"), "--model-dir", str(sft), "--out", str(run_dir),
        "--instructions", frozenlake_tools.INSTRUCTIONS, "--steps", str(a.steps), "--batch-size", str(a.batch_size),
        "--max-turns", str(a.max_turns), "--max-new-tokens", str(a.max_new_tokens),
        "--max-completion-length", str(a.n_positions - context),
        "--beta", str(a.beta), "--learning-rate", str(a.learning_rate), "--temperature", str(a.temperature),
        "--seed", str(a.seed), "--threads", str(threads),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"error: TRL's runner failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    model, tok = load_causal_lm(out["model_dir"], "TRL's trained policy")
    out["held_out"] = evaluate(a, model, tok)
    return out


def evaluate(a, model, tok) -> float:
    """Greedy success on this project's held-out episodes (what `agent` reports for its own policy)."""
    record = user_record(ENV)
    settings = RolloutSettings(a.max_turns, ALL_HISTORY, a.max_new_tokens, a.temperature)
    envs = [record.make() for _ in range(a.eval_episodes)]
    return held_out(model, tok, record, settings, envs, a.eval_episodes, a.seed)[0]["success"]


def late(xs: list[float]) -> float:
    """The mean over the last quarter of the steps."""
    return float(np.mean(xs[-max(1, len(xs) // 4) :]))


def main():
    a = parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    sft = prepare(a, out)
    model, tok = load_causal_lm(sft, "the benchmark's SFT model")
    env = frozenlake_tools.make()
    context = len(render_context(tok, env.instructions, [], env.reset(seed=0)[0], ALL_HISTORY, env.tools))
    sft_success = evaluate(a, model, tok)
    prepared = f"prepared in {time.perf_counter() - t0:.0f} s; SFT held-out success {sft_success}"
    print(f"[bench_agents] {prepared}", file=sys.stderr)
    sides = {"ours": lambda d: ours(a, sft, d)}
    if a.async_rollouts:
        sides["ours_async"] = lambda d: ours(a, sft, d, sampler=True)
    sides["trl"] = lambda d: theirs(a, sft, d, context)
    if a.trl_two_threads:
        sides["trl_2threads"] = lambda d: theirs(a, sft, d, context, threads=2)
    rounds = []
    for r in range(a.repeats):
        row = {}
        for name in list(sides)[:: 1 if r % 2 == 0 else -1]:  # alternated: neither side always runs first
            row[name] = sides[name](out / f"{name}_{r}")
            print(f"[bench_agents] round {r} {name}: {row[name]['episodes_per_s']:.2f} episodes/s", file=sys.stderr)
        rounds.append(row)
    med = {s: statistics.median(x[s]["episodes_per_s"] for x in rounds) for s in sides}
    report = {
        "job": {k: v for k, v in vars(a).items() if k != "trl_python"},
        "prompt_tokens": context,
        "sft_held_out_success": sft_success,
        "episodes_per_s": med,
        "ours_over_trl": med["ours"] / med["trl"],
        # every side of ours against every side of TRL: one thread against one, two cores against two
        "ratios": {f"{o}/{t}": med[o] / med[t] for o in med if o.startswith("ours") for t in med if t[:3] == "trl"},
        "late_sampled_success": {s: [late(x[s]["success"]) for x in rounds] for s in sides},
        "held_out_success": {s: [x[s]["held_out"] for x in rounds] for s in sides},
        "late_turns": {s: [late(x[s]["turns"]) for x in rounds] for s in sides},
        "rounds": rounds,
    }
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "rounds"}))


if __name__ == "__main__":
    main()
