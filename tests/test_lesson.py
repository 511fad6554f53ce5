"""The lesson's exercises: scripts on a tiny budget, reproducibility, the baseline's variance reduction, GIFs."""

import csv
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from PIL import Image

from cartpole.agent import MLPActorCritic
from cartpole.reinforce import ReinforceConfig, gradient_variance, run_episode, train_reinforce
from cartpole.watch import record_episode, write_gif

pytestmark = pytest.mark.integration  # trains or loads models, or runs whole commands

ROOT = Path(__file__).resolve().parents[1]


def run_script(name, out, *extra):
    """The lesson's script for `name` (the same as `cartpole lesson NAME`), on a tiny budget."""
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / f"lesson_{name}.py"),
            "--tiny",
            "--seeds",
            "2",
            "--out",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


@pytest.mark.parametrize("name,workers", [("build", "1"), ("break_baseline", "2"), ("break_clip", "1")])
def test_script_writes_table_csv_and_png(name, workers, tmp_path):
    p = run_script(name, tmp_path, "--workers", workers)
    assert p.returncode == 0, p.stderr
    assert "| variant |" in p.stdout
    md = (tmp_path / f"{name}.md").read_text()
    assert md.count("\n| ") == 4  # header, separator, 2 variants
    rows = list(csv.DictReader((tmp_path / f"{name}.csv").open()))
    assert len(rows) == 2 and all(r["seeds"] == "2" for r in rows)
    png = (tmp_path / f"{name}.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_same_command_same_table(tmp_path):
    tables = []
    for run in ("a", "b"):
        assert run_script("break_baseline", tmp_path / run, "--workers", "1").returncode == 0
        rows = list(csv.DictReader((tmp_path / run / "break_baseline.csv").open()))
        tables.append([{k: v for k, v in r.items() if not k.startswith("wall_s")} for r in rows])
    assert tables[0] == tables[1]


def test_bad_seeds_value_is_one_line():
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "lesson_build.py"), "--seeds", "0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert p.returncode == 2 and "seeds must be >= 1" in p.stderr and "Traceback" not in p.stderr


def test_lesson_is_a_subcommand_of_the_installed_cli(tmp_path):
    """`cartpole lesson break-clip` (the console script) gives the same table as the script."""
    import shutil

    exe = shutil.which("cartpole", path=str(Path(sys.executable).parent))
    assert exe, "the cartpole console script is installed beside python"
    p = subprocess.run(
        [exe, "lesson", "break-clip", "--tiny", "--seeds", "1", "--workers", "1", "--out", str(tmp_path / "cli")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert run_script("break_clip", tmp_path / "script", "--seeds", "1", "--workers", "1").returncode == 0
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("wall_s")} for r in rows]  # noqa: E731
    a, b = (strip(csv.DictReader((tmp_path / d / "break_clip.csv").open())) for d in ("cli", "script"))
    assert a == b and len(a) == 2


def test_reinforce_is_reproducible_and_counts_steps():
    a = train_reinforce(ReinforceConfig(episodes=5, seed=1))
    b = train_reinforce(ReinforceConfig(episodes=5, seed=1))
    assert a.returns == b.returns and a.env_steps[-1] == sum(a.returns)  # CartPole pays 1 per step


@pytest.mark.parametrize("baseline", [True, False])
def test_a_reinforce_population_learns_as_its_single_runs(baseline):
    """Three seeds as one population (lockstep episodes, batched forward passes, one stacked Adam) play the same
    episodes as three single runs and end with the same networks, to float rounding."""
    from cartpole.reinforce import train_reinforce_population

    cfg = ReinforceConfig(episodes=30, baseline=baseline)
    pop = train_reinforce_population(cfg, [0, 1, 2])
    for seed, log in zip([0, 1, 2], pop):
        single = train_reinforce(ReinforceConfig(episodes=30, baseline=baseline, seed=seed))
        assert log.returns == single.returns and log.env_steps == single.env_steps
    assert len({tuple(log.returns) for log in pop}) == 3  # three different agents, not one copied


@pytest.mark.parametrize("baseline", [True, False])
def test_reinforce_equals_the_lessons_loop(baseline):
    """The lesson's `reinforce()` written plainly (one env, one agent, a Python loop over the steps, its loss
    `-(log_probs * advantage).mean() + ((v - returns) ** 2).mean() * baseline`), sampling with the same uniform
    numbers: the same episodes as `train_reinforce` (a population of one)."""
    from cartpole.reinforce import UNIFORMS_CHUNK
    from rlhf_toy.seeding import seed_everything

    episodes, gamma = 25, 0.99
    g = seed_everything(4)
    agent = MLPActorCritic(4, 2)
    opt = torch.optim.Adam(agent.parameters(), lr=3e-3)
    env = gym.make("CartPole-v1")
    naive = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=4 + ep)
        u = torch.rand(UNIFORMS_CHUNK, generator=g)
        states, actions, rewards, done = [], [], [], False
        while not done:
            o = torch.as_tensor(obs, dtype=torch.float32)
            p0 = torch.softmax(agent.actor(o), -1)[0]
            a = int(u[len(rewards)] >= p0)
            obs, r, term, trunc, _ = env.step(a)
            states.append(o), actions.append(a), rewards.append(r)
            done = term or trunc
        returns, g_t = [], 0.0
        for r in reversed(rewards):
            g_t = r + gamma * g_t
            returns.insert(0, g_t)
        returns = torch.tensor(returns)
        logits, v = agent.actor(torch.stack(states)), agent.critic(torch.stack(states)).squeeze(-1)
        log_probs = torch.log_softmax(logits, -1)[torch.arange(len(actions)), torch.tensor(actions)]
        advantage = returns - v.detach() if baseline else returns
        loss = -(log_probs * advantage).mean() + ((v - returns) ** 2).mean() * baseline
        opt.zero_grad()
        loss.backward()
        opt.step()
        naive.append(sum(rewards))
    ours = train_reinforce(ReinforceConfig(episodes=episodes, baseline=baseline, seed=4))
    assert ours.returns == naive


def test_baseline_reduces_gradient_variance_on_a_fixed_batch():
    """A statistical test with a fixed seed: the same 60 episodes, the same policy, two gradient estimators."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    agent = MLPActorCritic(4, 2)
    env = gym.make("CartPole-v1")
    episodes = [run_episode(env, agent, g, seed=i) for i in range(60)]
    env.close()
    # Fit the critic to the episodes' returns (the learned baseline), leaving the policy as it is.
    from rlhf_toy.advantages import discounted_returns

    obs = torch.cat([e[0] for e in episodes])
    rets = torch.cat([discounted_returns(e[2], torch.arange(len(e[2])) == len(e[2]) - 1, gamma=0.99) for e in episodes])
    opt = torch.optim.Adam(agent.critic.parameters(), lr=1e-2)
    for _ in range(300):
        opt.zero_grad()
        ((agent.value(obs) - rets) ** 2).mean().backward()
        opt.step()
    with_baseline = gradient_variance(agent, episodes, 0.99, baseline=True)
    without = gradient_variance(agent, episodes, 0.99, baseline=False)
    # About half here (0.35 to 0.59 over seeds 0-5 of this test); a useless baseline would give about 1.
    assert with_baseline < 0.7 * without, (with_baseline, without)


def test_gif_writer_produces_the_expected_frames(tmp_path):
    torch.manual_seed(0)
    agent = MLPActorCritic(4, 2)
    for max_steps, every in ((40, 3), (7, 2)):
        frames, steps, ret = record_episode(agent, "CartPole-v1", "untrained", seed=0, max_steps=max_steps, every=every)
        assert 0 < steps <= max_steps and ret == steps  # CartPole pays 1 per step
        assert len(frames) == 1 + -(-steps // every)
        write_gif(frames, tmp_path / "a.gif")
        with Image.open(tmp_path / "a.gif") as im:
            assert im.format == "GIF" and im.is_animated and im.n_frames == len(frames)
            assert im.size == (300, 200)


def test_watch_cli_writes_both_gifs(tmp_path):
    from cartpole.agent import save_agent

    save_agent(tmp_path / "a.pt", MLPActorCritic(4, 2), {"env_id": "CartPole-v1"})
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "cartpole",
            "watch",
            "--checkpoint",
            str(tmp_path / "a.pt"),
            "--out",
            str(tmp_path / "gifs"),
            "--max_steps",
            "20",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    for name in ("trained", "untrained"):
        with Image.open(tmp_path / "gifs" / f"{name}.gif") as im:
            assert im.is_animated


def test_lesson_ppo_is_the_lessons_ppo_field_by_field():
    """The lesson's Build answer: `ppo(iterations=40, steps=2048, epochs=10, clip=0.2, lr=3e-4)`, constant lr and
    clip, minibatches of 256, gamma 0.99, lambda 0.95, value loss weight 0.5, no gradient clipping, no entropy."""
    from cartpole.lesson import LESSON_BREAK_CLIP_PPO, LESSON_PPO, lesson_train_config

    expected = dict(
        learning_rate=3e-4,
        anneal_lr=False,
        n_epochs=10,
        minibatch_size=256,
        gamma=0.99,
        gae_lambda=0.95,
        clip=True,
        clip_range=0.2,
        anneal_clip=False,
        clip_range_vf=None,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=None,
        target_kl=None,
    )
    assert {k: getattr(LESSON_PPO, k) for k in expected} == expected
    # Break the clip: the same, but 10x the learning rate and 30 epochs (still constant, still unannealed).
    assert {k: getattr(LESSON_BREAK_CLIP_PPO, k) for k in expected} == {
        **expected,
        "learning_rate": 3e-3,
        "n_epochs": 30,
    }
    run = lesson_train_config(seed=0, iterations=40, out="unused")
    assert (run.num_envs, run.n_steps, run.total_steps) == (1, 2048, 40 * 2048)


def test_lesson_ppo_schedule_is_constant():
    from cartpole.lesson import LESSON_BREAK_CLIP_PPO, LESSON_PPO
    from rlhf_toy.ppo import current_schedule

    for cfg in (LESSON_PPO, LESSON_BREAK_CLIP_PPO):
        assert current_schedule(cfg, 0.0) == current_schedule(cfg, 0.99) == (cfg.learning_rate, 0.2)
