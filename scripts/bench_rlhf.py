#!/usr/bin/env python
"""Episodes per second: rlhf-toy against TRL, same model sizes, batch 64, response length 24, one torch thread,
alternated in one session. PPO (4 epochs of one minibatch) against TRL's PPO trainer (trl 1.12, the last release
that has it; as shipped, and with its gc.collect() calls skipped); RLOO / GRPO (16 prompts x 4 replies,
minibatches of 16, 1 / 4 epochs) against the newest trl's RLOOTrainer / GRPOTrainer; Dr. GRPO, DAPO and GSPO
against GRPOTrainer with the matching loss_type / epsilon_high / importance_sampling_level.

    python3 -m venv .venv-trl && .venv-trl/bin/pip install torch==2.13.0 && \\
        .venv-trl/bin/pip install trl==1.12.0 transformers datasets accelerate
    python scripts/bench_rlhf.py --trl-python .venv-trl/bin/python
    python scripts/bench_rlhf.py --trl-python .venv-trl/bin/python --model smollm2 --batch-size 16 --episodes 32
    python3 -m venv .venv-trl-new && .venv-trl-new/bin/pip install torch==2.13.0 && \\
        .venv-trl-new/bin/pip install trl==1.16.0 transformers datasets accelerate "torch<2.14"
    python scripts/bench_rlhf.py --trl-python .venv-trl-new/bin/python --algorithm rloo --repeats 3
    python scripts/bench_rlhf.py --trl-python .venv-trl-new/bin/python --algorithm grpo --repeats 3
    python scripts/bench_rlhf.py --trl-python .venv-trl-new/bin/python --algorithm dapo --sizes 4x128
    python scripts/bench_rlhf.py --algorithm grpo --async-rollouts --repeats 3   # rollouts beside updates vs not
    python scripts/bench_rlhf.py --algorithm ppo --bf16 --repeats 3             # bf16 autocast on the CPU vs fp32

`--async-rollouts` adds, in every round, our run with `--async_rollouts` (the sampler in a second process on one
more thread); `--bf16` our run with `--bf16 on` (CPU autocast; needs AVX512-BF16 or AMX): each one's ratio to the
plain run (and to TRL) is printed beside the others.

Each size also gets a table of the phases of our step (sampling, the reward model, the policy's and the
reference's forward passes, the update): seconds per step, FLOPs counted from the model's weights, the GFLOP/s
this machine's matrix multiplies reach at that phase's shapes (measured in the same process), the floor
(FLOPs / that rate) and the distance to it (`scripts/benchlib/floor.py`). With TRL beside it, one more step on
each side runs under torch's FlopCounterMode: each side's matrix-multiply work per step, its distance to its
floor, and how much of the speed ratio is less work and how much faster work (`work_comparison`). Both sides get
the same prompts and, for the tiny models, the same tokenizer (the same token ids).

`--model` runs both on a pretrained model instead (a directory, a .gguf file or smollm2, converted once into
runs/bench_base): full-weight PPO on both sides, reward (and TRL's value) model = its trunk with a new head.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchlib.rlhf import TRL_RUNNERS, ours_in_subprocess, trl, work_comparison

from rlhf_toy.errors import UserError
from rlhf_toy.lm.algorithms.online import ALGORITHMS
from rlhf_toy.lm.models.base import resolve_base_model

PEERS = Path(__file__).resolve().parent / "peers"  # the TRL runners
VARIANTS = {"async": {"async_rollouts": True}, "bf16": {"bf16": "on"}}  # ours with one setting changed

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--trl-python",
        default=None,
        help="python of a venv with trl==1.12.0 (ppo) or the newest trl (rloo, grpo); omit: ours only",
    )
    p.add_argument(
        "--algorithm",
        choices=list(ALGORITHMS),
        default="ppo",
        help=f"any online algorithm; TRL runs beside it for {', '.join(TRL_RUNNERS)}",
    )
    p.add_argument("--repeats", type=int, default=1, help="alternate ours and TRL this many times; report medians")
    p.add_argument("--sizes", nargs="+", default=["2x64", "4x128"], help="n_layer x n_embd")
    p.add_argument("--episodes", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--response-length", type=int, default=24)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--async-rollouts", action="store_true", help="also time ours with --async_rollouts each round")
    p.add_argument("--bf16", action="store_true", help="also time ours with --bf16 on (CPU autocast) each round")
    p.add_argument("--model", default=None, help="pretrained model: directory, .gguf or smollm2 (default: tiny GPT-2s)")
    a = p.parse_args()
    model_dir = None
    if a.model:
        try:
            model_dir = str(resolve_base_model(a.model, Path("runs/bench_base")))
        except UserError as exc:
            sys.exit(f"error: {exc}")
        a.sizes = ["pretrained"]
    if a.trl_python and not Path(a.trl_python).exists():
        sys.exit(f"error: no python at {a.trl_python}; create the TRL venv first (see --help)")
    report = {}
    for size in a.sizes:
        n_layer, n_embd = (0, 0) if model_dir else (int(x) for x in size.split("x"))
        kw = dict(
            episodes=a.episodes,
            batch_size=a.batch_size,
            response_length=a.response_length,
            n_layer=n_layer,
            n_embd=n_embd,
            threads=a.threads,
            model_dir=model_dir,
            algorithm=a.algorithm,
        )
        seen: dict[str, list[float]] = {}
        phases: list[dict] = []
        for _ in range(a.repeats):
            rows = [ours_in_subprocess(**kw)]
            phases.append(rows[0].pop("phases"))
            # The variants' phases are not the table's (async ones overlap; the floors are fp32's).
            for variant in [v for v, on in (("async", a.async_rollouts), ("bf16", a.bf16)) if on]:
                rows.append(ours_in_subprocess(**kw, **VARIANTS[variant]))
                rows[-1].pop("phases", None)
            if a.trl_python and a.algorithm in TRL_RUNNERS:
                rows.append(trl(a.trl_python, PEERS, **kw, skip_gc=False))
                if a.algorithm == "ppo":
                    rows.append(trl(a.trl_python, PEERS, **kw, skip_gc=True))
            for r in rows:
                print(json.dumps(r), flush=True)
                if r.get("episodes_per_s"):
                    seen.setdefault(r["peer"], []).append(r["episodes_per_s"])
        eps = {peer: statistics.median(v) for peer, v in seen.items()}
        report[size] = {
            "algorithm": a.algorithm,
            "threads": a.threads,
            "repeats": a.repeats,
            "median_episodes_per_s": eps,
        }
        for peer in ("trl", "trl-nogc"):
            if eps.get(peer) and eps.get("rlhf-toy"):
                report[size][f"ratio_vs_{peer}"] = eps["rlhf-toy"] / eps[peer]
            for variant in VARIANTS:
                if eps.get(peer) and eps.get(f"rlhf-toy-{variant}"):
                    report[size][f"{variant}_ratio_vs_{peer}"] = eps[f"rlhf-toy-{variant}"] / eps[peer]
        for variant in VARIANTS:  # async_over_plain, bf16_over_plain
            if eps.get(f"rlhf-toy-{variant}") and eps.get("rlhf-toy"):
                report[size][f"{variant}_over_plain"] = eps[f"rlhf-toy-{variant}"] / eps["rlhf-toy"]
        # Each phase's distance to its compute floor (scripts/benchlib/floor.py), medians over the repeats.
        report[size]["phases"] = {
            p: {k: statistics.median(r[p][k] for r in phases) for k in phases[0][p]} for p in phases[0]
        }
        # How much of the ratio is less work: each side's matrix-multiply FLOPs, counted on one step.
        if a.trl_python and a.algorithm in TRL_RUNNERS and eps.get("trl") and eps.get("rlhf-toy"):
            one = {**kw, "episodes": a.batch_size}
            mine = ours_in_subprocess(**one, count_flops=True)
            theirs = trl(a.trl_python, PEERS, **one, count_flops=True)
            if mine.get("gflops_per_step") and theirs.get("gflops"):
                gflops = {"rlhf-toy": mine["gflops_per_step"], "trl": theirs["gflops"] / theirs["updates"]}
                rate = report[size]["phases"]["update"]["gflop_per_s_at_shapes"]
                report[size]["work"] = work_comparison(gflops, eps, a.batch_size, rate)
            else:
                print(f"note: no FLOP count ({mine.get('error') or theirs.get('error')})", file=sys.stderr)
        print(f"\n{size}: per step, medians of {a.repeats} run(s)")
        print(f"{'phase':<18}{'seconds':>9}{'GFLOPs':>9}{'GFLOP/s':>9}{'floor s':>9}{'distance':>9}")
        for p, f in report[size]["phases"].items():
            print(
                f"{p:<18}{f['seconds']:>9.4f}{f['gflops']:>9.2f}{f['gflop_per_s_at_shapes']:>9.1f}"
                f"{f['floor_s']:>9.4f}{f['distance']:>8.2f}x"
            )
        if "work" in report[size]:
            w = report[size]["work"]
            print(f"{'work per step':<18}{'seconds':>9}{'GFLOPs':>9}{'floor s':>9}{'distance':>9}")
            for peer in ("rlhf-toy", "trl"):
                print(
                    f"{peer:<18}{w[peer]['step_s']:>9.4f}{w[peer]['gflops_per_step']:>9.2f}{w[peer]['floor_s']:>9.4f}"
                    f"{w[peer]['distance']:>8.2f}x"
                )
            print(
                f"TRL does {w['work_ratio']:.2f}x our matrix-multiply work; we are {w['speed_ratio']:.2f}x as fast, so "
                f"our FLOPs run {w['efficiency_ratio']:.2f}x as fast as TRL's; {w['target']:g}x would take "
                f"{w['efficiency_for_target']:.2f}x"
            )
    print(json.dumps(report, indent=2))
