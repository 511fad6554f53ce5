"""Issue 39: rollouts beside updates (`--async_rollouts`), in the RLHF loop and the agent loop. With staleness 0 the
forked sampler gives the synchronous run's numbers bit for bit; with staleness 1 each batch is sampled with the
weights before the last update; a kill during a handover loses nothing on resume; what it cannot do is refused in
one line."""

import copy
import json
import math
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlhf_toy.errors import UserError
from rlhf_toy.lm.agents.trainer import AgentConfig, AgentTrainer
from rlhf_toy.lm.algorithms.online import get_algorithm
from rlhf_toy.lm.algorithms.rlhf import RLHFConfig, RLHFTrainer
from rlhf_toy.lm.models.base import load_base
from rlhf_toy.lm.models.causal_lm import response_logprobs
from rlhf_toy.lm.models.lora import LoraConfig, add_lora
from rlhf_toy.ppo import PPOConfig
from tests.helpers import NEEDS_BF16, PPO_TINY, THREADS, stage, tiny_agent

pytestmark = pytest.mark.integration  # forks a sampling process beside tiny models

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [f"user: question number {i} about the printer\nassistant:" for i in range(24)]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from tests.hf_models import tiny_model_dir

    return tiny_model_dir("llama", tmp_path_factory.mktemp("llama"))


def length_reward(prompts, texts):
    return [len(t) / 10 for t in texts]


def nan_reward(prompts, texts):
    return [float("nan")] * len(texts)


def make(llama, algorithm="ppo", reward=length_reward, lora=False, **rollout):
    """A trainer of `algorithm` on its record with a small budget; synchronous unless `rollout` says otherwise."""
    model, tok = load_base(llama)
    if lora:  # adapters only train; the reference is the same network with them off
        model = add_lora(model, LoraConfig(lora_r=4), "CAUSAL_LM", seed=0)
    cfg, ppo = get_algorithm(algorithm).configs()
    cfg = replace(cfg, batch_size=8, max_new_tokens=6, steps=4, **{"async_rollouts": False, **rollout})
    ppo = replace(ppo, minibatch_size=4, learning_rate=1e-3)
    return RLHFTrainer(model, reward, tok, cfg, ppo, PROMPTS, seed=0, algorithm=algorithm)


def comparable(row):
    """A logged row without its wall times, NaN as a string (NaN != NaN; a critic-free run logs NaN explained
    variance)."""
    return {k: "nan" if v != v else v for k, v in row.items() if not k.startswith("time/")}


def run(trainer, steps):
    """The logged rows of `steps` steps (`comparable`) and the final weights."""
    try:
        rows = [comparable(trainer.step()) for _ in range(steps)]
    finally:
        trainer.close()
    return rows, [p.detach().clone() for p in trainer.policy.parameters()]


@pytest.mark.parametrize(
    "algorithm,bf16",
    [("ppo", "auto"), ("grpo", "auto"), ("dapo", "auto"), pytest.param("ppo", "on", marks=NEEDS_BF16)],
)
def test_staleness_zero_equals_the_synchronous_run_bit_for_bit(llama, algorithm, bf16):
    """... under --bf16 on as well: the sampling process autocasts as the synchronous step does."""
    extra = {"overlong_buffer": 0.0} if algorithm == "dapo" else {}
    extra["bf16"] = bf16
    sync_rows, sync_weights = run(make(llama, algorithm, **extra), 3)
    async_rows, async_weights = run(make(llama, algorithm, async_rollouts=True, staleness=0, **extra), 3)
    for row in async_rows:
        assert row.pop("policy/staleness") == 0.0
    assert async_rows == sync_rows
    assert all(torch.equal(a, b) for a, b in zip(sync_weights, async_weights))


def test_staleness_zero_equals_the_synchronous_run_with_lora_adapters_to_float_rounding(llama):
    """With peft adapters the forked sampler's log-probs differ from the synchronous ones in the last bits (1e-7 in
    the first step's KL; the same model copied and shared in one process gives equal logits, so it is the fork's:
    not found further). The replies, and everything they decide, are the same."""
    sync_rows, sync_weights = run(make(llama, lora=True), 3)
    async_rows, async_weights = run(make(llama, lora=True, async_rollouts=True, staleness=0), 3)
    for a, b in zip(async_rows, sync_rows):
        assert a.pop("policy/staleness") == 0.0 and a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6, nan_ok=True), k
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(sync_weights, async_weights))
    assert sync_rows[-1]["objective/kl"] > 1e-4  # the adapters moved the policy away from the reference


def test_staleness_one_samples_with_the_weights_before_the_last_update(llama):
    sync_rows, _ = run(make(llama), 3)
    trainer = make(llama, async_rollouts=True)
    start = copy.deepcopy(trainer.policy.lm)  # version 0
    batches = []
    real_update = trainer._update
    trainer._update = lambda exp, beta: batches.append(exp) or real_update(exp, beta)
    rows, weights = run(trainer, 3)
    assert trainer.ahead.worker is None and not mp.active_children()  # close() ended the sampling process
    assert [r["policy/staleness"] for r in rows] == [0.0, 1.0, 1.0]
    assert [b.version for b in batches] == [0, 0, 1]
    # Batch 1 is the synchronous run's (version 0, the same RNG); batch 2 was drawn by version 0 as well: its
    # pi_old log-probs are version 0's, not those of the policy updated on batch 1.
    assert {k: v for k, v in rows[0].items() if k != "policy/staleness"} == sync_rows[0]
    b = batches[1]
    ids, mask = b.batch.observations
    old = response_logprobs(start, ids, mask, b.batch.actions, 1.0)[0] * b.response_mask
    assert torch.allclose(old, b.batch.logprobs * b.response_mask, atol=1e-5)
    assert rows[1] != sync_rows[1]
    again, again_weights = run(make(llama, async_rollouts=True), 3)  # reproducible: the same seed, the same run
    assert again == rows and all(torch.equal(a, b) for a, b in zip(weights, again_weights))


def test_the_sampler_takes_one_thread_and_close_gives_it_back(llama):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    trainer = make(llama, async_rollouts=True)
    try:
        trainer.step()
        assert torch.get_num_threads() == 1  # the update's, while the sampler has the other
        trainer.close()
        assert torch.get_num_threads() == 2
        trainer.step()  # a closed trainer steps on with a new sampler (the batch in flight sampled afresh)
        assert trainer.step_count == 2 and torch.get_num_threads() == 1
    finally:
        trainer.close()
        torch.set_num_threads(threads)


def test_grpo_samples_beside_its_update_by_its_record_and_the_others_do_not(llama):
    """The frontier comparison made it GRPO's default (docs/results/algorithms.md); a caller naming GRPO gets it,
    and one who says False gets the synchronous loop."""
    model, tok = load_base(llama)
    ppo = PPOConfig(minibatch_size=4)
    grpo = RLHFTrainer(model, length_reward, tok, RLHFConfig(batch_size=8), ppo, PROMPTS, seed=0, algorithm="grpo")
    assert grpo.cfg.async_rollouts and get_algorithm("grpo").defaults["async_rollouts"] is True
    off = RLHFConfig(batch_size=8, async_rollouts=False)
    assert not RLHFTrainer(model, length_reward, tok, off, ppo, PROMPTS, seed=0, algorithm="grpo").cfg.async_rollouts
    for name in ("ppo", "rloo", "dr_grpo", "dapo", "gspo", "reinforce", "reinforce_baseline"):
        assert get_algorithm(name).configs()[0].async_rollouts is False, name


def test_an_error_in_the_sampler_is_the_synchronous_error(llama):
    for flags in ({}, {"async_rollouts": True}):
        trainer = make(llama, reward=nan_reward, **flags)
        with pytest.raises(UserError, match="nan_reward") as caught:
            run(trainer, 1)
        assert "NaN" in str(caught.value) or "nan" in str(caught.value)


def test_a_killed_sampler_is_one_error_line(llama):
    trainer = make(llama, async_rollouts=True)
    trainer.step()  # batch 2 is now in flight
    os.kill(trainer.ahead.worker.process.pid, signal.SIGKILL)
    trainer.ahead.worker.process.join(10)
    # Its reply may have been on its way already: then the next request (a broken pipe) is what fails.
    with pytest.raises(UserError, match=r"sampling process of --async_rollouts died \(exit code -9; .*--resume"):
        trainer.step()
    trainer.close()


def test_settings_async_rollouts_cannot_honour_are_refused():
    with pytest.raises(UserError, match="staleness must be 0 or 1"):
        RLHFConfig(async_rollouts=True, staleness=2)
    with pytest.raises(UserError, match="--staleness 0 is read only with --async_rollouts"):
        RLHFConfig(staleness=0)


# --- the agent loop: the same worker, batches of episodes ----------------------------------------------------------


@pytest.fixture(scope="module")
def agent_start():
    """A tiny model after SFT on SayYes's demonstrations (three turns, "yes" earns 1): each test trains a copy."""
    return tiny_agent("tests.agent_envs:SayYes", demos=8)


def agent(start, algorithm="ppo", policy=None, **rollout):
    """A trainer of a copy of the SFT model (or of `policy`, a resumed run's, beside the SFT model as reference)."""
    model, tok = start
    rl = RLHFConfig(batch_size=8, steps=4, **rollout)
    return AgentTrainer(copy.deepcopy(model if policy is None else policy), tok, "tests.agent_envs:SayYes",
                        AgentConfig(algorithm=algorithm), rl, PPOConfig(minibatch_size=4),
                        ref_model=None if policy is None else copy.deepcopy(model))  # fmt: skip


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_an_agent_with_staleness_zero_equals_the_synchronous_run_bit_for_bit(agent_start, algorithm):
    """Episodes, rows, values, the reference's log-probs and advantages all come from the sampling process."""
    sync = agent(agent_start, algorithm)
    assert not sync.rl.async_rollouts  # an agent run samples in its own process unless asked (GRPO's record too)
    sync_rows, sync_weights = run(sync, 3)
    async_rows, async_weights = run(agent(agent_start, algorithm, async_rollouts=True, staleness=0), 3)
    for row in async_rows:
        assert row.pop("policy/staleness") == 0.0
    assert async_rows == sync_rows
    assert all(torch.equal(a, b) for a, b in zip(sync_weights, async_weights))


def test_an_agent_with_staleness_one_plays_with_the_weights_before_the_last_update(agent_start):
    sync_rows, _ = run(agent(agent_start), 3)
    trainer = agent(agent_start, async_rollouts=True)
    assert trainer.rl.async_rollouts and trainer.rl.staleness == 1
    rows, weights = run(trainer, 3)
    assert trainer.ahead.worker is None and not mp.active_children()  # close() ended the sampling process
    assert [r["policy/staleness"] for r in rows] == [0.0, 1.0, 1.0]
    assert {k: v for k, v in rows[0].items() if k != "policy/staleness"} == sync_rows[0]  # version 0, the same RNG
    assert rows[1] != sync_rows[1]
    again, again_weights = run(agent(agent_start, async_rollouts=True), 3)  # the same seed, the same run
    assert again == rows and all(torch.equal(a, b) for a, b in zip(weights, again_weights))


def test_a_checkpoint_of_an_agent_saves_the_batch_in_flight_and_a_resume_consumes_it(agent_start, tmp_path):
    """`state()` receives the batch sampled ahead and saves it as plain types; a trainer loaded from it (a fresh
    process would be) steps on to the uninterrupted run's numbers."""
    full_rows, full_weights = run(agent(agent_start, async_rollouts=True), 3)
    first = agent(agent_start, async_rollouts=True)
    try:
        rows = [comparable(first.step())]
        state = first.state()
        lm = copy.deepcopy(first.policy.lm)
    finally:
        first.close()
    assert state["pending"] is not None and state["pending"]["version"] == 0
    torch.save(state, tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    resumed = agent(agent_start, policy=lm, async_rollouts=True)
    resumed.load_state(state)
    more, weights = run(resumed, 2)
    assert rows + more == full_rows
    assert all(torch.equal(a, b) for a, b in zip(full_weights, weights))


# A kill during a handover: the process dies with the sampler's weights half written, after step 2's checkpoint.
KILL_IN_HANDOVER = textwrap.dedent("""
    import os, signal, sys, torch
    from rlhf_toy.lm.algorithms import async_rollouts
    calls = []
    def hand_over(self, trainer):
        calls.append(1)
        if len(calls) == {call}:
            with torch.no_grad():
                for p, q in self.trained[: len(self.trained) // 2]:
                    q.copy_(p)
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, trainer)
    real = async_rollouts.RolloutWorker.hand_over
    async_rollouts.RolloutWorker.hand_over = hand_over
    from rlhf_toy.lm.pipeline.cli import main
    main(sys.argv[1:])
""")


def rows_of(ppo_dir):
    return [comparable(json.loads(line)) for line in (ppo_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_kill_during_a_handover_loses_nothing_on_resume(run_dir, tmp_path):
    import shutil

    full, killed = tmp_path / "full", tmp_path / "killed"
    shutil.copytree(run_dir, full)
    shutil.copytree(run_dir, killed)
    flags = [*PPO_TINY, "--steps", "4", "--save_every", "2", "--async_rollouts", "True"]
    assert stage("ppo", full, *flags) == 0
    # Handovers: step 1 (batches 1 and 2), step 2 (batch 3), step 3 (batch 4): die in the fourth, after step 2's
    # checkpoint (which received batch 3 and saved it).
    args = ["ppo", "--run_dir", str(killed), "--progress", "False", "--threads", THREADS, *flags]
    p = subprocess.run(
        [sys.executable, "-c", KILL_IN_HANDOVER.format(call=4), *args], capture_output=True, text=True, cwd=ROOT,
        timeout=300,
    )  # fmt: skip
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    state = torch.load(killed / "ppo" / "checkpoint" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 2 and state["pending"] is not None  # batch 3, sampled ahead, saved with it
    assert stage("ppo", killed, *flags, "--resume") == 0
    full_rows, resumed_rows = rows_of(full / "ppo"), rows_of(killed / "ppo")
    assert [r["step"] for r in resumed_rows] == [1, 2, 3, 4]
    assert resumed_rows == full_rows  # steps 3 and 4 replayed exactly, the batch in flight included
    assert [r["policy/staleness"] for r in full_rows] == [0.0, 1.0, 1.0, 1.0]
    assert all(math.isfinite(r["ppo/policy_loss"]) for r in full_rows)
    # The killed run's sampler (a fork: the same command line) read EOF and ended: no orphan keeps a core busy.
    for _ in range(50):
        left = subprocess.run(["pgrep", "-f", f"--run_dir {killed} "], capture_output=True, text=True).stdout.split()
        if not left:
            break
        time.sleep(0.2)
    assert not left, left
