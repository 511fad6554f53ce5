"""Data parallelism on CPU with gloo, 2 processes: DDP's averaged gradient equals one process's on the same
samples; PPO ranks stay identical with uneven reply lengths; logs are the ranks' average; torchrun runs the
stages, rank 0 alone writes, and --resume continues under 2 processes."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from rlhf_toy.distributed import data_parallel
from rlhf_toy.ppo import PPOConfig, RolloutBatch, minibatch_loss

pytestmark = pytest.mark.integration  # trains or loads models, or runs whole commands

ROOT = Path(__file__).resolve().parents[1]
CFG = PPOConfig(normalize_advantages=False)  # per-shard normalization would differ from the whole batch's


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def leave() -> None:
    """The worker's last call. Both ranks reach this point before either tears gloo down: a rank that destroyed the
    group while its peer was still writing once aborted the peer in CI ("terminate called without an active
    exception"). The same abort came back at the interpreter's exit, after the barrier (2 CI walks in a row,
    2026-12-07): gloo's threads, still held through the DDP wrapper, outlive the teardown. The worker has written
    its output by now, so it leaves without the teardown (exit status 0, as `mp.spawn` expects)."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class TinyActorCritic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.pi, self.v = nn.Linear(4, 3), nn.Linear(4, 1)

    def forward(self, obs, actions):
        d = torch.distributions.Categorical(logits=self.pi(obs))
        return d.log_prob(actions), d.entropy(), self.v(obs).squeeze(-1)

    evaluate = forward


def batch(n: int) -> RolloutBatch:
    g = torch.Generator().manual_seed(1)
    obs = torch.randn(n, 4, generator=g)
    return RolloutBatch(
        obs,
        torch.randint(0, 3, (n,), generator=g),
        torch.randn(n, generator=g) - 1,
        torch.randn(n, generator=g),
        torch.randn(n, generator=g),
        torch.randn(n, generator=g),
    )


def loss_of(model, b: RolloutBatch) -> torch.Tensor:
    logp, ent, values = model.evaluate(b.observations, b.actions)
    return minibatch_loss(logp, ent, values, b, CFG, 0.2)[0]


def _grad_worker(rank: int, world: int, port: int, out: str) -> None:
    join(rank, world, port)
    model = TinyActorCritic()
    ddp = data_parallel(model, actor_critic=True)
    full = batch(16)
    mine = RolloutBatch(*[x[rank * 8 : (rank + 1) * 8] for x in full[:6]])
    loss_of(ddp, mine).backward()
    if rank == 0:
        torch.save({k: p.grad for k, p in model.named_parameters()}, out)
    leave()


def test_ddp_gradient_of_2_x_b_equals_one_process_gradient_of_2b(tmp_path):
    out = str(tmp_path / "grads.pt")
    mp.spawn(_grad_worker, args=(2, free_port(), out), nprocs=2)
    model = TinyActorCritic()
    loss_of(model, batch(16)).backward()
    ddp_grads = torch.load(out)
    for k, p in model.named_parameters():
        torch.testing.assert_close(ddp_grads[k], p.grad, atol=1e-6, rtol=1e-5)


def _cli_worker(rank: int, world: int, port: int, argv: list[str], out: str) -> None:
    join(rank, world, port)
    from rlhf_toy.lm.pipeline.cli import console_main

    sys.argv = ["rlhf-toy", *argv]
    try:
        console_main()
    except SystemExit as exc:
        Path(f"{out}.{rank}").write_text(json.dumps([exc.code, dist.is_initialized()]))
    os._exit(0)


@pytest.mark.parametrize(("argv", "status"), [(["--help"], 0), (["ppo", "--no_such_flag", "1"], 2)])
def test_the_command_leaves_the_process_group_before_it_exits(tmp_path, argv, status):
    """A rank that exits with gloo's group alive can abort in interpreter finalization: the command destroys the
    group itself, after a barrier when it succeeded, at once after an error."""
    out = str(tmp_path / "left")
    mp.spawn(_cli_worker, args=(2, free_port(), argv, out), nprocs=2)
    for r in (0, 1):
        assert json.loads(Path(f"{out}.{r}").read_text()) == [status, False]


def _ppo_worker(rank: int, world: int, port: int, run_dir: str, out: str) -> None:
    join(rank, world, port)
    from rlhf_toy.lm.algorithms.rlhf import RLHFConfig, RLHFTrainer, lm_ppo_config
    from rlhf_toy.lm.data.tasks import helpdesk_task
    from rlhf_toy.lm.pipeline.rundir import RunDir

    rd = RunDir(run_dir)
    model, tok = rd.load_sft()
    trainer = RLHFTrainer(
        model,
        rd.load_reward_model(tok),
        tok,
        RLHFConfig(steps=3, batch_size=8, max_new_tokens=16),
        lm_ppo_config(minibatch_size=4),
        helpdesk_task(n_train=400, n_eval=10).train_prompts,
        seed=0,
    )
    rows = []
    for _ in range(3):
        averaged = trainer.step()
        weights = sum(float(p.double().sum()) for p in trainer.policy.parameters())
        rows.append({"averaged": averaged, "local": trainer.last_local_metrics, "weights": weights})
    Path(f"{out}.{rank}").write_text(json.dumps(rows))
    leave()


def test_two_ranks_stay_identical_and_log_the_average(run_dir, tmp_path):
    out = str(tmp_path / "rows")
    mp.spawn(_ppo_worker, args=(2, free_port(), str(run_dir), out), nprocs=2)
    r0, r1 = (json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1))
    for a, b in zip(r0, r1):
        assert a["weights"] == b["weights"]  # the same weights on both ranks after every step
        assert a["averaged"] == b["averaged"]
        for key in ("objective/score", "objective/kl", "policy/response_length"):
            assert a["averaged"][key] == pytest.approx((a["local"][key] + b["local"][key]) / 2)
    # The ranks drew different prompts and replies of different lengths, and still ran in lockstep.
    assert any(a["local"]["policy/response_length"] != b["local"]["policy/response_length"] for a, b in zip(r0, r1))


def torchrun(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "rlhf_toy.lm",
        *args,
        "--progress",
        "False",
        "--threads",
        "1",
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)


@pytest.mark.parametrize("rollouts", ["synchronous", "async"])
def test_torchrun_ppo_writes_once_and_resumes(run_dir, tmp_path, rollouts):
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    ppo = [
        "ppo",
        "--run_dir",
        str(out),
        "--batch_size",
        "8",
        "--minibatch_size",
        "4",
        "--max_new_tokens",
        "16",
        "--save_every",
        "1",
        "--judge",
        "tests.judges:length",
        *(["--async_rollouts", "True"] if rollouts == "async" else []),
    ]
    p = torchrun(*ppo, "--steps", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    (line,) = [line for line in p.stdout.splitlines() if line.startswith("{")]  # rank 0 prints the summary
    assert json.loads(line)["world_size"] == 2
    state = torch.load(out / "ppo" / "checkpoint" / "trainer_state.pt", weights_only=True)
    assert state["world_size"] == 2 and len(state["rng"]) == 2 and len(state["pending"]) == 2
    assert not [f for f in (out / "ppo").iterdir() if ".tmp-" in f.name]
    p = torchrun(*ppo, "--steps", "3", "--resume", "True")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    if rollouts == "async":  # each rank's sampler one version behind after the first step, resumed included
        assert [r["policy/staleness"] for r in rows] == [0.0, 1.0, 1.0]
    assert json.loads((out / "ppo" / "summary.json").read_text())["steps"] == 3


def test_torchrun_sft_and_reward(run_dir, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    p = torchrun(
        "sft",
        "--run_dir",
        str(out),
        "--n_layer",
        "2",
        "--n_embd",
        "64",
        "--n_head",
        "2",
        "--epochs",
        "1",
        "--batch_size",
        "32",
        "--max_train_pairs",
        "256",
        "--sample_prompts",
        "8",
        "--judge",
        "tests.judges:length",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    p = torchrun(
        "reward", "--run_dir", str(out), "--batch_size", "16", "--min_steps", "4", "--judge", "tests.judges:length"
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert (out / "reward_model" / "config.json").is_file()


def test_a_stopped_rank_ends_the_run_after_the_collective_timeout_instead_of_hanging_it(tmp_path):
    script = tmp_path / "stalls.py"
    script.write_text(
        "import time, torch\n"
        "from rlhf_toy.distributed import barrier, init_distributed, rank_and_world\n"
        "init_distributed(torch.device('cpu'), timeout_s=3)\n"
        "if rank_and_world()[0] == 1:\n"
        "    time.sleep(120)  # a stopped rank\n"
        "barrier()\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=110, cwd=tmp_path)
    assert p.returncode != 0 and time.perf_counter() - t0 < 60, p.stderr[-2000:]
    assert "Timed out waiting 3000ms" in p.stderr  # the waiting rank failed on the timeout it was given


def test_under_torchrun_a_bad_value_is_said_once(tmp_path):
    p = torchrun("ppo", "--run_dir", str(tmp_path / "run"), "--kl_coef", "-1")
    said = [line for line in p.stderr.splitlines() if line.startswith("error: kl_coef")]
    assert p.returncode != 0 and len(said) == 1, p.stderr[-2000:]
