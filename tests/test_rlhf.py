"""RLHF with PPO on tiny models: KL shaping and control, masking, log-prob recompute, learning, resume."""

import pytest
import torch

from rlhf_toy.errors import UserError
from rlhf_toy.lm.algorithms.kl import AdaptiveKLController, MovingAverage, per_token_kl, shaped_rewards
from rlhf_toy.lm.algorithms.rlhf import RLHFConfig, RLHFTrainer, lm_ppo_config, make_experience
from rlhf_toy.lm.algorithms.sft import SFTConfig, encode_pairs, train_sft
from rlhf_toy.lm.data.tasks import helpdesk_task
from rlhf_toy.lm.models.causal_lm import ModelConfig, new_causal_lm, response_logprobs
from rlhf_toy.lm.models.chat import encode_prompts, pad_sequences, train_tokenizer
from tests.helpers import NEEDS_BF16, check_critic_warmup

pytestmark = pytest.mark.integration  # trains or loads models, or runs whole commands

TINY = ModelConfig(n_layer=2, n_embd=64, n_head=2, n_positions=64)


@pytest.fixture(scope="module")
def sft():
    """A tiny helpdesk SFT model (a few seconds): fluent enough to have warm and rude openers."""
    task = helpdesk_task(n_train=3000, n_eval=100)
    tok = train_tokenizer([p for p, _ in task.train] + [r for _, r in task.train], 400)
    model = new_causal_lm(tok, TINY)
    train_ids, _ = encode_pairs(tok, task.train, 64)
    eval_ids, _ = encode_pairs(tok, task.eval, 64)
    train_sft(model, tok, train_ids, eval_ids, SFTConfig(epochs=2, batch_size=32, learning_rate=5e-3), 0, False)
    return task, tok, model


def exclamations(prompts, texts):
    """A rule reward: how many '!' the reply has."""
    return [float(t.count("!")) for t in texts]


def trainer(sft, **kw):
    task, tok, model = sft
    import copy

    cfg = RLHFConfig(**{"steps": 30, "batch_size": 32, "max_new_tokens": 24, "kl_coef": 0.05, **kw})
    return RLHFTrainer(
        copy.deepcopy(model), exclamations, tok, cfg, lm_ppo_config(learning_rate=1e-4), task.train_prompts, seed=0
    )


def test_shaped_rewards_put_the_score_on_the_last_real_token():
    kl = torch.ones(2, 4)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float)
    r = shaped_rewards(torch.tensor([5.0, 7.0]), kl, mask, beta=0.5)
    assert r.tolist() == [[-0.5, 4.5, 0.0, 0.0], [-0.5, -0.5, -0.5, 6.5]]


def test_per_token_kl_estimators():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    assert per_token_kl(logp, ref, "k1").tolist() == [0.5, -1.0]
    assert (per_token_kl(logp, ref, "k3") >= 0).all()
    with pytest.raises(ValueError):
        per_token_kl(logp, ref, "k4")


def test_adaptive_controller_moves_beta_toward_its_target():
    ctl = AdaptiveKLController(beta=0.1, target=6.0, horizon=1000)
    assert ctl.update(kl=12.0, n_steps=100) > 0.1  # too far from the reference: penalize more
    high = ctl.beta
    assert ctl.update(kl=1.0, n_steps=100) < high  # too close: penalize less
    assert MovingAverage(3).add(1.0) == 1.0


def test_recomputed_logprobs_equal_generation_scores(sft):
    _, tok, model = sft
    ids, mask = pad_sequences(
        encode_prompts(tok, ["My printer won't start.", "Hi, my old lamp at home runs hot."]), tok.pad_token_id, "left"
    )
    torch.manual_seed(0)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        temperature=0.7,
        top_k=0,
        top_p=1.0,
        max_new_tokens=10,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        output_scores=True,
        return_dict_in_generate=True,
    )
    resp = out.sequences[:, ids.shape[1] :]
    gen = torch.stack([torch.log_softmax(s, -1) for s in out.scores], 1).gather(-1, resp[..., None])[..., 0]
    with torch.no_grad():
        again, _ = response_logprobs(model, ids, mask, resp, temperature=0.7)
    real = torch.isfinite(gen)
    torch.testing.assert_close(again[real], gen[real], atol=1e-4, rtol=1e-4)


def test_padding_is_masked_in_rewards_values_and_advantages(sft):
    t = trainer(sft)
    exp = make_experience(
        t.policy, t.ref_model, t.reward_model, t.tok, t.next_prompts(), 0.05, t.cfg, t.ppo, t.algorithm
    )
    pad = exp.batch.mask == 0
    assert pad.any() and (exp.batch.mask.sum(1) >= 1).all()
    for x in (exp.batch.values, exp.batch.advantages, exp.batch.returns, exp.kl):
        assert (x[pad] == 0).all()
    # Dropout is off and nothing has changed yet: the first minibatch's ratio is exactly 1.
    logp, _, _ = t.policy.evaluate(exp.batch.observations, exp.batch.actions)
    torch.testing.assert_close(logp * exp.batch.mask, exp.batch.logprobs * exp.batch.mask)


def rule_reward_run(sft, steps=30, **kw):
    """The mean score of the first and of the last 5 of `steps` steps, and every step's logged row."""
    t = trainer(sft, **kw)
    rows = [t.step() for _ in range(steps)]
    mean = lambda part: sum(m["objective/score"] for m in part) / len(part)  # noqa: E731
    return mean(rows[:5]), mean(rows[-5:]), rows


def test_ppo_raises_a_rule_reward_while_kl_stays_finite(sft):
    first, last, rows = rule_reward_run(sft)
    assert last > first + 0.3, (first, last)
    assert all(abs(m["objective/kl"]) < 100 for m in rows) and rows[-1]["objective/kl"] > 0


@NEEDS_BF16
def test_bf16_learns_as_fp32_does_and_repeats_itself(sft):
    """--bf16 on (CPU autocast): the same rule reward gained at least half of fp32's gain on the same seed, at the
    same reward per nat of KL within a factor 2, and the same seed gives the same numbers. Measured at step 30 (the
    last 5 steps' mean score from about 0.34; KL): on an AMD EPYC with AVX512-BF16, 4.28 at 27 nats against fp32's
    4.51 at 25; on an Intel Xeon with AMX, 13.31 at 64 nats against 4.51 at 25: how far 30 steps go differs by CPU
    (an upper bound on the gain alone failed there), the trade of reward for KL (0.15-0.20 a nat) does not."""
    first, last, rows = rule_reward_run(sft, bf16="on")
    fp32_first, fp32_last, fp32_rows = rule_reward_run(sft)
    assert last - first > 0.5 * (fp32_last - fp32_first) > 0.15, (first, last, fp32_first, fp32_last)
    per_nat = (last - first) / rows[-1]["objective/kl"]
    fp32_per_nat = (fp32_last - fp32_first) / fp32_rows[-1]["objective/kl"]
    assert 0.5 < per_nat / fp32_per_nat < 2, (per_nat, fp32_per_nat)
    assert all(abs(m["objective/kl"]) < 100 for m in rows)
    drop = lambda m: {k: v for k, v in m.items() if not k.startswith("time/")}  # noqa: E731
    again = trainer(sft, bf16="on")
    assert [drop(again.step()) for _ in range(3)] == [drop(m) for m in rows[:3]]


def test_bf16_on_a_cpu_without_it_is_refused(sft, monkeypatch):
    from rlhf_toy.lm.models import devices

    monkeypatch.setattr(devices, "cpu_bf16_native", lambda: False)
    with pytest.raises(UserError, match="no native bf16"):
        trainer(sft, bf16="on")


def test_resume_gives_the_same_next_step(sft, tmp_path):
    straight = trainer(sft)
    metrics = [straight.step() for _ in range(3)]
    first = trainer(sft)
    first.step(), first.step()
    torch.save(first.state(), tmp_path / "state.pt")
    lm_state = {k: v.clone() for k, v in first.policy.lm.state_dict().items()}
    resumed = trainer(sft)
    resumed.policy.lm.load_state_dict(lm_state)
    resumed.load_state(torch.load(tmp_path / "state.pt", weights_only=False))
    again = resumed.step()
    drop = lambda m: {k: v for k, v in m.items() if not k.startswith("time/")}  # noqa: E731
    assert drop(again) == drop(metrics[2])


def test_kl_limit_stops_before_the_update_that_would_follow_and_copies_nothing(sft, monkeypatch):
    """--kl_limit decides before the update: the step whose sampled KL takes the moving average over the limit
    applies no update (the weights after it are the weights before it), every earlier step did update, and no
    step copies the model (no state-dict deepcopy per step)."""
    from types import SimpleNamespace

    from rlhf_toy.lm.algorithms import rlhf as rlhf_module

    t = trainer(sft, kl_coef=0.0, kl_limit=0.05, kl_limit_window=1)

    def no_copy(*a, **k):
        raise AssertionError("a step copied the model")

    monkeypatch.setattr(rlhf_module, "copy", SimpleNamespace(deepcopy=no_copy))  # the trainer's own copies only
    weights = lambda: [p.detach().clone() for p in t.policy.parameters()]  # noqa: E731
    for _ in range(30):
        before = weights()
        m = t.step()
        after = weights()
        changed = any(not torch.equal(a, b) for a, b in zip(before, after))
        if t.stopped_by_kl_limit:
            break
        assert changed and m["objective/kl_moving_average"] <= 0.05
    assert t.stopped_by_kl_limit and m["objective/kl_moving_average"] > 0.05 and t.step_count > 1
    assert not changed, "the step that crossed the limit updated the policy"
    assert not any(k.startswith("ppo/") for k in m)  # no update ran


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"kl_coef": -0.1}, "kl_coef"),
        ({"kl_target": -1.0}, "kl_target"),
        ({"kl_estimator": "k4"}, "kl_estimator"),
        ({"bf16": "yes"}, "bf16"),
        ({"critic_warmup": -1}, "critic_warmup"),
        ({"critic_warmup": 5, "steps": 5}, "critic_warmup"),
    ],
)
def test_bad_rlhf_config(kw, match):
    with pytest.raises(UserError, match=match):
        RLHFConfig(**kw)


def test_critic_warmup_trains_the_value_head_alone_then_the_policy(sft):
    check_critic_warmup(trainer(sft, critic_warmup=1, steps=3, batch_size=16))


def test_batch_larger_than_prompt_set(sft):
    task, tok, model = sft
    with pytest.raises(UserError, match="larger than the prompt set"):
        RLHFTrainer(model, exclamations, tok, RLHFConfig(batch_size=10), lm_ppo_config(), ["a", "b"], seed=0)
