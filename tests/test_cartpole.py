"""The CartPole agent: rollouts and autoreset, unsupported envs, save/load, determinism, learning, CLI."""

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from cartpole import MLPActorCritic, TrainConfig, evaluate, load_agent, save_agent, train
from cartpole.envs import AutoresetMode, make_vec_env
from cartpole.rollout import RolloutCollector
from rlhf_toy import UserError

pytestmark = pytest.mark.integration  # trains or loads models, or runs whole commands

ROOT = Path(__file__).resolve().parents[1]


def quick(tmp_path, **kw):
    base = dict(
        total_steps=2048,
        num_envs=8,
        n_steps=32,
        out=str(tmp_path),
        progress=False,
        tensorboard=False,
        plot=False,
        eval_every=1024,
        eval_episodes=3,
    )
    return TrainConfig(**{**base, **kw})


def test_next_step_autoreset_steps_are_masked():
    envs = make_vec_env("CartPole-v1", 3)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    collector = RolloutCollector(envs, seed=0)
    g = torch.Generator().manual_seed(0)
    r = collector.collect(MLPActorCritic(4, 2), 200, g)
    done = r.terminated | r.truncated
    assert done.any()
    # The step after each episode end is the autoreset step: masked, reward 0.
    t, n = torch.nonzero(done[:-1], as_tuple=True)
    assert (~r.mask[t + 1, n]).all() and (r.rewards[t + 1, n] == 0).all()
    assert int(r.mask.sum()) == int(r.rewards.sum())  # CartPole pays 1 per real step
    assert sum(e.length for e in r.episodes) <= int(r.mask.sum())
    envs.close()


def test_same_step_truncation_bootstraps_from_the_final_observation():
    envs = gym.make_vec(
        "CartPole-v1",
        num_envs=2,
        vectorization_mode="sync",
        max_episode_steps=5,
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
    )
    collector = RolloutCollector(envs, seed=0)
    agent = MLPActorCritic(4, 2)
    r = collector.collect(agent, 12, torch.Generator().manual_seed(0))
    assert r.mask.all() and r.truncated.any()
    t, n = torch.nonzero(r.truncated, as_tuple=True)
    # After a truncation the next observation is the reset one, so next_value must differ from values[t + 1].
    for ti, ni in zip(t.tolist(), n.tolist()):
        if ti + 1 < 12:
            assert r.next_values[ti, ni] != r.values[ti + 1, ni]
    envs.close()


@pytest.mark.parametrize(
    "env_id,match",
    [
        ("Pendulum-v1", "not Discrete"),
        ("NoSuchEnv-v0", "unknown environment"),
    ],
)
def test_unsupported_envs_are_refused(env_id, match, tmp_path):
    with pytest.raises(UserError, match=match):
        train(quick(tmp_path, env_id=env_id))


@pytest.mark.parametrize("kw", [dict(num_envs=0), dict(total_steps=10), dict(eval_every=-1)])
def test_bad_train_config(kw, tmp_path):
    with pytest.raises(UserError):
        quick(tmp_path, **kw)


def test_save_load_gives_identical_actions(tmp_path):
    agent = MLPActorCritic(4, 2)
    save_agent(tmp_path / "a.pt", agent, {"env_id": "CartPole-v1"})
    loaded, meta = load_agent(tmp_path / "a.pt")
    obs = np.random.default_rng(0).normal(size=(100, 4)).astype(np.float32)
    assert np.array_equal(agent.predict(obs), loaded.predict(obs)) and meta["env_id"] == "CartPole-v1"
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert np.array_equal(agent.predict(obs, False, g1), loaded.predict(obs, False, g2))


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="not a readable cartpole checkpoint"):
        load_agent(tmp_path / "bad.pt")


def test_same_seed_same_metrics(tmp_path):
    rows = []
    for run in ("a", "b"):
        train(quick(tmp_path / run, seed=3))
        lines = [json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        rows.append([{k: v for k, v in row.items() if k != "charts/SPS"} for row in lines])
    assert rows[0] == rows[1]
    a, _ = load_agent(tmp_path / "a" / "final.pt")
    b, _ = load_agent(tmp_path / "b" / "final.pt")
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_other_discrete_env_runs(tmp_path):
    s = train(quick(tmp_path, env_id="Acrobot-v1", total_steps=1024, eval_episodes=2, eval_every=0))
    assert s["env_steps"] == 1024 and s["eval_mean"] <= 0


def test_cartpole_solves_on_the_default_config(tmp_path):
    """The essential learning test: default hyperparameters, seed 0, 100k steps (about 5 s here)."""
    s = train(TrainConfig(seed=0, out=str(tmp_path), progress=False, tensorboard=False))
    assert s["solved_step"] is not None and s["solved_step"] <= 100_000
    assert s["last20_mean"] >= 475 and s["eval_mean"] >= 475
    assert (tmp_path / "best.pt").exists() and (tmp_path / "learning_curve.png").exists()
    agent, _ = load_agent(tmp_path / "best.pt")
    assert np.mean(evaluate(agent, "CartPole-v1", 5)) >= 475


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_cartpole_solves_other_seeds(seed, tmp_path):
    s = train(TrainConfig(seed=seed, out=str(tmp_path), progress=False, tensorboard=False, plot=False))
    assert s["solved_step"] is not None and s["eval_mean"] >= 475


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "cartpole", *args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def test_cli_train_then_eval(tmp_path):
    p = run_cli(
        "train",
        "--total_steps",
        "2048",
        "--num_envs",
        "8",
        "--out",
        str(tmp_path),
        "--progress",
        "False",
        "--eval_episodes",
        "2",
    )
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    for key in ("seed", "env_steps", "wall_s", "solved_step", "solved_s", "last20_mean", "eval_mean"):
        assert key in summary
    assert (tmp_path / "learning_curve.png").stat().st_size > 1000
    p = run_cli("eval", "--checkpoint", str(tmp_path), "--episodes", "3")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["episodes"] == 3


@pytest.mark.parametrize(
    "args,match",
    [
        (["train", "--clip_range", "-1"], "clip_range must be > 0"),
        (["train", "--env_id", "Pendulum-v1"], "not supported"),
        (["train", "--n_epochs", "0"], "n_epochs must be"),
        (["eval", "--checkpoint", "/no/such/file.pt"], "no checkpoint at"),
        (["fly"], "unknown command"),
    ],
)
def test_cli_bad_input_is_one_line_and_nonzero(args, match):
    p = run_cli(*args)
    assert p.returncode != 0
    assert match in p.stderr and "Traceback" not in p.stderr


def test_the_agents_tanh_matches_torchs_in_value_and_gradient():
    """`cartpole.agent.tanh` (2 sigmoid(2x) - 1, for speed) against float64 tanh: values within 2e-7, and its
    backward is tanh's derivative at the computed value."""
    from cartpole.agent import Tanh, tanh

    x = torch.cat([torch.randn(10_000) * 3, torch.linspace(-1e-6, 1e-6, 101), torch.tensor([-40.0, 40.0, 0.0])])
    x.requires_grad_(True)
    y = tanh(x)
    assert (y.double() - torch.tanh(x.double())).abs().max() < 2e-7
    (grad,) = torch.autograd.grad(y, x, torch.ones_like(y))
    torch.testing.assert_close(grad.double(), 1 - torch.tanh(x.detach().double()) ** 2, atol=5e-7, rtol=0)
    with torch.no_grad():
        assert torch.equal(tanh(x), y) and torch.equal(Tanh()(x), y)
