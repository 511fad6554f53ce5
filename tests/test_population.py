"""Populations: N agents as one batched network, updated per agent by the core (rlhf_toy.population)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from cartpole.agent import MLPActorCritic
from cartpole.envs import make_vec_env
from cartpole.population import train_population
from cartpole.rollout import RolloutCollector
from cartpole.stacked import _StackedMLP, build_population, by_agent
from cartpole.train import CARTPOLE_PPO, TrainConfig, cartpole_ppo_config, run_training, train
from rlhf_toy.advantages import gae
from rlhf_toy.population import clip_grad_norm_per_agent, population_ppo_update
from rlhf_toy.ppo import RolloutBatch, make_optimizer, ppo_update
from rlhf_toy.seeding import seed_everything

pytestmark = pytest.mark.integration  # trains or loads models, or runs whole commands

ROOT = Path(__file__).resolve().parents[1]


def quick(tmp_path, **kw):
    return TrainConfig(
        **{
            "total_steps": 4096,
            "out": str(tmp_path),
            "progress": False,
            "tensorboard": False,
            "plot": False,
            "eval_every": 0,
            "eval_episodes": 3,
            **kw,
        }
    )


def rollout_batch(seed, agent, generator, population=None):
    """One rollout of 16 CartPole envs x 32 steps as a single run's flat batch (or a population's `[1, n]`)."""
    envs = make_vec_env("CartPole-v1", 16)
    r = RolloutCollector(envs, seed).collect(population or agent, 32, generator)
    envs.close()
    adv, ret = gae(r.rewards, r.values, r.next_values, r.terminated, r.truncated, gamma=0.98, lam=0.8, mask=r.mask)
    fields = (r.observations, r.actions, r.logprobs, r.values, adv, ret, r.mask)
    if population is not None:
        return RolloutBatch(*[by_agent(x, 1) for x in fields])
    return RolloutBatch(*[x.reshape(-1, *x.shape[2:]) for x in fields])


def test_a_population_of_one_starts_and_steps_as_a_single_run():
    g = seed_everything(3, 1)
    agent = MLPActorCritic(4, 2)
    pop, gens = build_population([3], 4, 2, 64, 1)
    for a, b in zip(agent.parameters(), pop.agent(0).parameters()):
        assert torch.equal(a, b)  # the same initial network ...
    single, stacked = rollout_batch(3, agent, g), rollout_batch(3, None, gens, population=pop)
    for a, b in zip(single[:7], stacked[:7]):  # every field but the (absent) reference log-probs
        assert torch.equal(a, b[0])  # ... the same first rollout, action for action ...
    s1 = ppo_update(agent, make_optimizer(agent.parameters(), CARTPOLE_PPO), single, CARTPOLE_PPO, generator=g)
    s2 = population_ppo_update(
        pop, make_optimizer(pop.parameters(), CARTPOLE_PPO), stacked, CARTPOLE_PPO, generators=gens
    )
    for a, b in zip(agent.parameters(), pop.agent(0).parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)  # ... and the same update, to float rounding
    for k in ("policy_loss", "value_loss", "approx_kl", "clip_fraction", "gradient_steps", "epochs"):
        assert s2[k][0].item() == pytest.approx(s1[k], rel=1e-5, abs=1e-7)


def test_each_agent_is_updated_as_the_core_updates_it_alone():
    """Three agents, three different batches and generators: the population update equals three ppo_updates."""
    seeds = [0, 1, 2]
    pop, gens = build_population(seeds, 4, 2, 64, 1)
    singles = [pop.agent(k).train() for k in range(3)]
    cfg = cartpole_ppo_config(n_epochs=3, minibatch_size=128)
    batches = [rollout_batch(10 + k, singles[k], torch.Generator().manual_seed(k)) for k in range(3)]
    stacked = RolloutBatch(*[torch.stack(f) for f in zip(*[b[:7] for b in batches])])
    stats = population_ppo_update(
        pop,
        make_optimizer(pop.parameters(), cfg),
        stacked,
        cfg,
        progress=0.3,
        generators=[torch.Generator().manual_seed(100 + k) for k in range(3)],
    )
    for k, (agent, batch) in enumerate(zip(singles, batches)):
        s = ppo_update(
            agent,
            make_optimizer(agent.parameters(), cfg),
            batch,
            cfg,
            progress=0.3,
            generator=torch.Generator().manual_seed(100 + k),
        )
        for a, b in zip(agent.parameters(), pop.agent(k).parameters()):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
        assert stats["policy_loss"][k].item() == pytest.approx(s["policy_loss"], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("sizes,rows", [((4, 64, 64, 2), 7), ((4, 64, 64, 1), 300), ((64, 3), 5)])
def test_stacked_mlp_gradients_equal_autograds(sizes, rows):
    """The hand-written backward of the stacked MLP (each weight gradient in its faster layout, tanh fused)
    against autograd through `bmm(x, w^T) + b` and torch.tanh, in float64, with and without a gradient for the
    input; 300 rows take the activation's sigmoid form (more than `agent.SMALL` elements), 7 rows torch.tanh."""
    g = torch.Generator().manual_seed(rows)
    shapes = [(3, rows, sizes[0])]
    for n_in, n_out in zip(sizes, sizes[1:]):
        shapes += [(3, n_out, n_in), (3, 1, n_out)]
    tensors = [torch.randn(*shape, generator=g, dtype=torch.float64) for shape in shapes]
    grad_out = torch.randn(3, rows, sizes[-1], generator=g, dtype=torch.float64)
    for x_needs_grad in (True, False):
        ours = [t.clone().requires_grad_(i > 0 or x_needs_grad) for i, t in enumerate(tensors)]
        ref = [t.clone().requires_grad_(i > 0 or x_needs_grad) for i, t in enumerate(tensors)]
        out = _StackedMLP.apply(*ours)
        expected = ref[0]
        for i in range(1, len(ref), 2):
            expected = torch.bmm(expected, ref[i].transpose(1, 2)) + ref[i + 1]
            expected = torch.tanh(expected) if i + 2 < len(ref) else expected
        torch.testing.assert_close(out, expected)
        out.backward(grad_out)
        expected.backward(grad_out)
        for a, r in zip(ours, ref):
            assert (a.grad is None) == (r.grad is None)
            if r.grad is not None:
                torch.testing.assert_close(a.grad, r.grad)


def test_in_place_tanh_gives_the_agents_tanh():
    from cartpole.agent import tanh, tanh_

    for shape in ((5, 64), (32, 256, 64)):  # below and above agent.SMALL
        x = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3
        assert torch.equal(tanh_(x.clone()), tanh(x))


def test_per_agent_gradient_clip_equals_torchs_clip_on_each_agent():
    torch.manual_seed(0)
    grads = [torch.randn(3, 5, 4) * torch.tensor([0.01, 1.0, 10.0]).view(3, 1, 1), torch.randn(3, 7)]
    params = [nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    clip_grad_norm_per_agent(params, 0.5)
    for k in range(3):
        ref = [nn.Parameter(torch.zeros_like(g[k])) for g in grads]
        for p, g in zip(ref, grads):
            p.grad = g[k].clone()
        torch.nn.utils.clip_grad_norm_(ref, 0.5)
        for p, r in zip(params, ref):
            torch.testing.assert_close(p.grad[k], r.grad)


def test_kl_early_stop_is_per_agent():
    pop, gens = build_population([0, 1], 4, 2, 64, 1)
    batches = [rollout_batch(20 + k, pop.agent(k), torch.Generator().manual_seed(k)) for k in range(2)]
    stacked = RolloutBatch(*[torch.stack(f) for f in zip(*[b[:7] for b in batches])])
    cfg = cartpole_ppo_config(learning_rate=0.05, anneal_lr=False, n_epochs=20, target_kl=0.002)
    before = [p.detach().clone() for p in pop.parameters()]
    stats = population_ppo_update(pop, make_optimizer(pop.parameters(), cfg), stacked, cfg, generators=gens)
    assert stats["early_stop"].tolist() == [1.0, 1.0] and (stats["epochs"] < 20).all()
    assert all(not torch.equal(a, b) for a, b in zip(before, pop.parameters()))


def test_population_learns_on_the_default_budget_and_saves_each_agent(tmp_path):
    from cartpole.agent import load_agent

    s = train_population(quick(tmp_path, total_steps=100_000), [0, 1, 2], CARTPOLE_PPO)["summary"]
    assert s["fraction_solved"] == 1.0 and len(s["per_seed"]) == 3
    assert s["last20_mean"]["median"] >= 475 and s["eval_mean"]["median"] >= 475
    agent, meta = load_agent(tmp_path / "seed_2" / "final.pt")
    assert meta["seed"] == 2 and meta["population"] == [0, 1, 2]


def test_population_is_reproducible(tmp_path):
    runs = [train_population(quick(tmp_path / r), [4, 7], CARTPOLE_PPO) for r in "ab"]
    a, b = ([{k: v for k, v in p.items() if k != "solved_s"} for p in r["summary"]["per_seed"]] for r in runs)
    assert a == b
    for x, y in zip(runs[0]["policy"].parameters(), runs[1]["policy"].parameters()):
        assert torch.equal(x, y)


def test_workers_train_contiguous_shares_each_as_its_own_population(tmp_path):
    """`--workers 2` over seeds 4, 7, 9 gives exactly what populations [4, 7] and [9] give, each trained alone:
    the same per-seed figures, and the same networks, rebuilt into one population in seed order."""
    split = train_population(quick(tmp_path / "split", seeds="4,7,9", workers=2), [4, 7, 9], CARTPOLE_PPO)
    alone = [
        train_population(quick(tmp_path / f"alone{i}"), seeds, CARTPOLE_PPO) for i, seeds in enumerate([[4, 7], [9]])
    ]

    def figures(per_seed):
        return [{k: v for k, v in p.items() if k != "solved_s"} for p in per_seed]

    s = split["summary"]
    assert s["workers"] == 2 and s["seeds"] == [4, 7, 9] and len(split["trackers"]) == 3
    assert figures(s["per_seed"]) == figures(alone[0]["summary"]["per_seed"] + alone[1]["summary"]["per_seed"])
    singles = [r["policy"].agent(k) for r in alone for k in range(r["policy"].n)]
    for k, single in enumerate(singles):
        for x, y in zip(split["policy"].agent(k).parameters(), single.parameters()):
            assert torch.equal(x, y)
    assert (tmp_path / "split" / "part_1" / "metrics.jsonl").is_file()
    assert json.loads((tmp_path / "split" / "summary.json").read_text())["seeds"] == [4, 7, 9]


def test_workers_need_seeds_and_one_thread(tmp_path):
    from rlhf_toy.errors import UserError

    with pytest.raises(UserError, match="workers must be 1 for a single run"):
        quick(tmp_path, workers=2)
    with pytest.raises(UserError, match="threads must be 1 with --workers"):
        quick(tmp_path, seeds="0-3", workers=2, threads=2)
    with pytest.raises(UserError, match="workers must be >= 1"):
        quick(tmp_path, seeds="0-3", workers=0)


def test_population_cli_and_bad_seeds(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "cartpole",
        "train",
        "--seeds",
        "0-1",
        "--total_steps",
        "1024",
        "--out",
        str(tmp_path),
        "--progress",
        "False",
        "--eval_episodes",
        "2",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout.strip().splitlines()[-1])
    assert s["seeds"] == [0, 1] and {"median", "q25", "q75"} <= set(s["eval_mean"])
    assert json.loads((tmp_path / "summary.json").read_text())["seeds"] == [0, 1]
    p = subprocess.run(cmd[:4] + ["--seeds", "3-x"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 2 and "seeds must be a range" in p.stderr and "Traceback" not in p.stderr


def test_train_runs_a_population_when_given_seeds_and_run_training_refuses_them(tmp_path):
    from rlhf_toy.errors import UserError

    cfg = quick(tmp_path / "pop", seeds="3,5", total_steps=1024)
    s = train(cfg)
    assert s["seeds"] == [3, 5] and len(s["per_seed"]) == 2
    with pytest.raises(UserError, match="trains one agent"):
        run_training(cfg)


def test_single_run_is_unchanged_by_the_population_code(tmp_path):
    """The single-run path stays the reference: same seed, same metrics (a population does not replace it)."""
    a = run_training(quick(tmp_path / "a", seed=5)).episode_returns
    b = run_training(quick(tmp_path / "b", seed=5)).episode_returns
    assert a == b and len(a) > 10


def test_vector_evaluation_equals_one_episode_at_a_time():
    """All episodes at once, one forward per step: the same returns as playing each seeded episode alone."""
    import gymnasium as gym

    from cartpole.evaluate import evaluate

    torch.manual_seed(1)
    agent = MLPActorCritic(4, 2)
    with torch.no_grad():
        agent.actor[4].weight.mul_(300.0)  # a decisive policy, so that episodes differ in length
    batched = evaluate(agent, "CartPole-v1", n_episodes=6, seed=50)
    alone = []
    for i in range(6):
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=50 + i)
        total, done = 0.0, False
        while not done:
            obs, r, term, trunc, _ = env.step(int(agent.predict(obs)))
            total, done = total + r, term or trunc
        alone.append(total)
    assert batched == alone and len(set(alone)) > 1


def test_population_benchmark_alternates_and_reports_medians():
    """`scripts/bench_population.py`'s report on a tiny budget: a single run and each size, alternated per round,
    medians and their ratio (the populations split over two worker processes)."""
    from scripts.benchlib.cartpole import population_curve

    r = population_curve([2], threads=1, total_steps=1024, repeats=2, workers=2)  # the two seeds on two workers
    assert len(r["single_run_walls_s"]) == 2 and r["single_run_median_wall_s"] > 0 and r["workers"] == 2
    [row] = r["populations"]
    assert row["seeds"] == 2 and len(row["walls_s"]) == 2 and all(w > 0 for w in row["walls_s"])
    assert row["ratio_to_single_run"] == pytest.approx(row["median_wall_s"] / r["single_run_median_wall_s"])
