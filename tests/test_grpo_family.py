"""The GRPO family on the core (GRPO, Dr. GRPO, DAPO, GSPO) and where the KL goes: each loss, advantage and shaping
against a hand computation on a tiny batch, then DAPO's rollout (dynamic sampling, truncated replies) on a tiny
model."""

import math
from dataclasses import replace

import pytest
import torch

from rlhf_toy.advantages import dr_grpo_advantages, equal_groups, grpo_advantages
from rlhf_toy.errors import UserError
from rlhf_toy.lm.algorithms.kl import overlong_penalty
from rlhf_toy.lm.algorithms.online import ALGORITHMS, LM_DAPO, LM_DR_GRPO, LM_GRPO, LM_GSPO
from rlhf_toy.lm.algorithms.rlhf import RLHFConfig, RLHFTrainer
from rlhf_toy.lm.data import helpdesk
from rlhf_toy.lm.models.base import load_base
from rlhf_toy.losses import aggregate, clipped_policy_loss, kl_estimate, log_ratios
from rlhf_toy.ppo import PPOConfig, RolloutBatch, minibatch_loss

# Two replies of lengths 3 and 1 (padded to 3).
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])


def test_token_aggregation_weighs_every_token_the_same():
    assert aggregate(PER_TOKEN, MASK, "token").item() == pytest.approx((1 + 2 + 3 + 4) / 4)


def test_sequence_aggregation_averages_each_reply_then_the_replies():
    assert aggregate(PER_TOKEN, MASK, "sequence").item() == pytest.approx(((1 + 2 + 3) / 3 + 4 / 1) / 2)


def test_constant_aggregation_divides_by_replies_times_the_generation_limit():
    assert aggregate(PER_TOKEN, MASK, "constant", length=8).item() == pytest.approx((1 + 2 + 3 + 4) / (2 * 8))
    assert aggregate(PER_TOKEN, MASK, "constant").item() == pytest.approx(10 / (2 * 3))  # default: the width


def test_aggregation_without_a_time_axis_is_the_plain_mean():
    x = torch.tensor([1.0, 2.0, 6.0])
    for how in ("token", "sequence", "constant"):
        assert aggregate(x, None, how).item() == pytest.approx(3.0)


def test_clip_higher_lets_a_good_token_rise_further_than_it_lets_it_fall():
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[1.25, 0.75]]))  # ratios 1.25 and 0.75
    adv = torch.tensor([[1.0, -1.0]])
    sym = clipped_policy_loss(new, old, adv, 0.2)
    # eps 0.2 both ways: -min(1.25, 1.2) * 1 and -min(-0.75, -0.8) ... per token max(-A r, -A clip(r))
    assert sym.loss.item() == pytest.approx((-1.2 + 0.8) / 2)
    high = clipped_policy_loss(new, old, adv, 0.2, clip_range_high=0.28)
    assert high.loss.item() == pytest.approx((-1.25 + 0.8) / 2)  # 1.25 < 1.28: not clipped upward any more
    assert sym.clip_fraction.item() == pytest.approx(1.0) and high.clip_fraction.item() == pytest.approx(0.5)


def test_a_sequence_ratio_is_its_tokens_mean_log_ratio_on_every_token():
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.1, 0.3, 5.0], [0.2, 0.0, 0.0]])  # row 0's third token and row 1's last two are padding
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    lr = log_ratios(new, old, mask, "sequence")
    torch.testing.assert_close(lr[0], torch.full((3,), 0.2))
    torch.testing.assert_close(lr[1], torch.full((3,), 0.2))
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    s = math.exp(0.2)  # one ratio per reply, clipped to [1 - 3e-4, 1 + 4e-4] at the sequence level
    out = clipped_policy_loss(
        new, old, adv, 3e-4, mask, clip_range_high=4e-4, ratio_level="sequence", aggregation="sequence"
    )
    assert out.loss.item() == pytest.approx((-(1 + 4e-4) + s) / 2)


def test_dr_grpo_centres_without_the_std_and_grpo_divides_by_it():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    torch.testing.assert_close(dr_grpo_advantages(r, 4), torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))
    std = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0, 1)
    want = torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]) / (std + 1e-4)
    torch.testing.assert_close(grpo_advantages(r, 4), want)
    assert equal_groups(r, 4).tolist() == [False, True]


def test_k2_is_half_the_squared_log_ratio():
    lp, lq = torch.tensor([0.0, -1.0]), torch.tensor([-0.5, -1.0])
    torch.testing.assert_close(kl_estimate(lp, lq, "k2"), torch.tensor([0.125, 0.0]))
    torch.testing.assert_close(kl_estimate(lp, lq, "k1"), torch.tensor([0.5, 0.0]))
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_estimate(lp, lq, "k4")


def test_overlong_penalty_falls_linearly_over_the_buffer():
    lengths = torch.tensor([5, 6, 7, 8, 10])
    torch.testing.assert_close(overlong_penalty(lengths, 10, 4), torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0]))
    assert overlong_penalty(lengths, 10, 0).abs().sum() == 0


def test_the_kl_loss_term_is_aggregated_as_the_policy_loss():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, 0.0, 0.0]])
    ref = logp - torch.tensor([[0.2, 0.4, 0.0], [0.6, 0.0, 0.0]])
    mb = RolloutBatch(None, None, logp, torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), MASK, ref)
    cfg = PPOConfig(vf_coef=0.0, normalize_advantages=False, loss_aggregation="sequence")
    loss, parts = minibatch_loss(logp, torch.zeros(2, 3), torch.zeros(2, 3), mb, cfg, 0.2, "clipped", 0.5, None, "k2")
    k2 = ((0.02 + 0.08 + 0.0) / 3 + 0.18) / 2
    assert parts["kl_loss"].item() == pytest.approx(k2)
    assert loss.item() == pytest.approx(0.5 * k2)  # zero advantages: the KL term is all of it


def test_each_variant_is_its_own_record_on_the_core():
    assert ALGORITHMS["grpo"].preset is LM_GRPO and LM_GRPO.loss_aggregation == "sequence"
    assert ALGORITHMS["dr_grpo"].advantages.__name__ == "group_baseline(dr_grpo_advantages)"
    assert LM_DR_GRPO.loss_aggregation == "constant"
    assert (LM_DAPO.clip_range, LM_DAPO.clip_range_high, LM_DAPO.loss_aggregation) == (0.2, 0.28, "token")
    assert ALGORITHMS["dapo"].rollout["dynamic_sampling"] and ALGORITHMS["dapo"].rollout["mask_truncated"]
    assert (LM_GSPO.ratio_level, LM_GSPO.clip_range, LM_GSPO.clip_range_high) == ("sequence", 3e-4, 4e-4)


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: PPOConfig(clip_range=0.2, clip_range_high=0.1), "clip_range_high"),
        (lambda: PPOConfig(ratio_level="word"), "ratio_level"),
        (lambda: PPOConfig(loss_aggregation="median"), "loss_aggregation"),
        (lambda: RLHFConfig(kl_in="advantage"), "kl_in"),
        (lambda: RLHFConfig(kl_in="loss", kl_estimator="k1"), "kl_estimator"),
        (lambda: RLHFConfig(overlong_buffer=1.0), "overlong_buffer"),
        (lambda: RLHFConfig(dynamic_sampling_rounds=0), "dynamic_sampling_rounds"),
    ],
)
def test_bad_variant_settings_are_one_line_errors(make, field):
    with pytest.raises(UserError, match=f"^{field} must be"):
        make()


# DAPO's rollout on a tiny model -----------------------------------------------------------------------------

PROMPTS = list(dict.fromkeys(d.prompt for d in helpdesk.generate(200, seed=0)))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from tests.hf_models import tiny_model_dir

    return tiny_model_dir("llama", tmp_path_factory.mktemp("llama"))


def half_constant(prompts, texts):
    """Equal rewards for every reply to half of the prompts (no signal there), the reply's length otherwise."""
    return [0.0 if PROMPTS.index(p) % 2 else float(len(t)) for p, t in zip(prompts, texts)]


def dapo_trainer(llama, reward, **rollout):
    model, tok = load_base(llama)
    # No overlong shaping: its length penalty would make the constant rewards differ.
    dapo = {**ALGORITHMS["dapo"].rollout, "overlong_buffer": 0.0}
    settings = {"batch_size": 16, "group_size": 4, "max_new_tokens": 8, **dapo, **rollout}
    cfg = RLHFConfig(**settings)
    return RLHFTrainer(model, reward, tok, cfg, replace(LM_DAPO, minibatch_size=8), PROMPTS, seed=0, algorithm="dapo")


@pytest.mark.integration
def test_dynamic_sampling_keeps_only_groups_with_a_signal_and_fills_the_batch(llama):
    trainer = dapo_trainer(llama, half_constant)
    exp = trainer.rollouts(0.0)
    assert len(exp.prompts) == 16 and exp.batch.actions.shape[0] == 16
    assert not equal_groups(exp.scores, 4).any()  # every kept group has unequal rewards
    assert all(PROMPTS.index(p) % 2 == 0 for p in exp.prompts)  # the constant half never gets in
    assert exp.sampling["rounds"] >= 2 and 0.2 < exp.sampling["equal_groups"] < 0.8
    row = trainer.step()
    assert 0 < row["sampling/equal_groups"] < 1 and math.isfinite(row["ppo/policy_loss"])


@pytest.mark.integration
def test_dynamic_sampling_that_cannot_fill_a_batch_stops_with_the_fix(llama):
    trainer = dapo_trainer(llama, lambda p, t: [1.0] * len(t), dynamic_sampling_rounds=3)
    with pytest.raises(UserError, match=r"dynamic sampling kept 0 of 4 groups in 3 rounds.*--dynamic_sampling_rounds"):
        trainer.step()
    assert trainer.step_count == 0


@pytest.mark.integration
def test_dynamic_sampling_fills_a_batch_it_could_not_with_zero_advantage_groups(llama):
    """After the last round, a batch that kept some groups is completed with dropped ones (a policy that is
    nearly always right must not stop the run); their advantages are zero."""
    trainer = dapo_trainer(llama, half_constant, dynamic_sampling_rounds=1)
    exp = trainer.rollouts(0.0)
    filled = int(exp.sampling["filled_groups"])
    assert 1 <= filled < 4 and len(exp.prompts) == 16
    flat = equal_groups(exp.scores, 4)  # one flag per group
    assert int(flat.sum()) == filled and (exp.batch.advantages[flat.repeat_interleave(4)] == 0).all()


@pytest.mark.integration
def test_truncated_replies_leave_the_loss_but_not_the_logs(llama):
    trainer = dapo_trainer(llama, half_constant, dynamic_sampling=False, max_new_tokens=3)
    exp = trainer.rollouts(0.0)
    cut = ~exp.eos
    assert cut.any(), "with 3 tokens some replies must be cut"
    assert (exp.batch.mask[cut] == 0).all() and (exp.batch.advantages[cut] == 0).all()
    assert (exp.response_mask[cut].sum(1) == 3).all()  # still counted in lengths and KL


@pytest.mark.integration
def test_dynamic_sampling_needs_groups(llama):
    model, tok = load_base(llama)
    with pytest.raises(UserError, match="--dynamic_sampling drops groups"):
        RLHFTrainer(
            model, half_constant, tok, RLHFConfig(batch_size=8, dynamic_sampling=True), ALGORITHMS["ppo"].preset,
            PROMPTS, seed=0,
        )  # fmt: skip
