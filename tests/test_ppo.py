"""The update routine: config validation, loss goes down on a fixed batch, KL early stop, determinism."""

import pytest
import torch

from cartpole.agent import MLPActorCritic
from rlhf_toy import PPOConfig, RolloutBatch, UserError, make_optimizer, ppo_update
from rlhf_toy.losses import clipped_policy_loss, value_loss


def fixed_batch(seed=0, B=512):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    agent = MLPActorCritic(4, 3)
    obs = torch.randn(B, 4, generator=g)
    with torch.no_grad():
        actions, logprobs, values = agent.act(obs, g)
    # Action 0 is better than the others: a policy can learn that, so the surrogate can really improve.
    advantages = (actions == 0).double().float() * 2 - 1 + 0.5 * torch.randn(B, generator=g)
    returns = values + torch.randn(B, generator=g)
    return agent, RolloutBatch(obs, actions, logprobs, values, advantages, returns)


def losses(agent, batch):
    with torch.no_grad():
        logp, _, v = agent.evaluate(batch.observations, batch.actions)
        adv = (batch.advantages - batch.advantages.mean()) / batch.advantages.std()
        pg = clipped_policy_loss(logp, batch.logprobs, adv, 0.2).loss.item()
        return pg, value_loss(v, batch.values, batch.returns).item()


def test_update_lowers_policy_and_value_loss_on_a_fixed_batch():
    agent, batch = fixed_batch()
    cfg = PPOConfig(learning_rate=1e-3, n_epochs=10, minibatch_size=128, anneal_lr=False)
    pg0, v0 = losses(agent, batch)
    opt = make_optimizer(agent.parameters(), cfg)
    stats = ppo_update(agent, opt, batch, cfg, generator=torch.Generator().manual_seed(0))
    pg1, v1 = losses(agent, batch)
    assert pg1 < pg0 - 0.05 and v1 < v0
    assert stats["gradient_steps"] == 40 and stats["epochs"] == 10
    assert 0 <= stats["clip_fraction"] <= 1 and stats["approx_kl"] >= 0


def test_first_minibatch_has_ratio_one():
    agent, batch = fixed_batch()
    cfg = PPOConfig(n_epochs=1, minibatch_size=512)
    stats = ppo_update(agent, make_optimizer(agent.parameters(), cfg), batch, cfg)
    assert stats["clip_fraction"] == 0.0 and abs(stats["approx_kl"]) < 1e-6


def test_target_kl_stops_early():
    agent, batch = fixed_batch()
    cfg = PPOConfig(learning_rate=0.05, n_epochs=20, minibatch_size=64, target_kl=0.001, anneal_lr=False)
    stats = ppo_update(agent, make_optimizer(agent.parameters(), cfg), batch, cfg)
    assert stats["early_stop"] == 1.0 and stats["epochs"] < 20


def test_annealing_follows_progress():
    agent, batch = fixed_batch()
    cfg = PPOConfig(learning_rate=1e-3, anneal_lr=True, anneal_clip=True, n_epochs=1)
    stats = ppo_update(agent, make_optimizer(agent.parameters(), cfg), batch, cfg, progress=0.75)
    assert stats["learning_rate"] == pytest.approx(2.5e-4) and stats["clip_range"] == pytest.approx(0.05)


def test_masked_samples_do_not_move_the_policy():
    agent, batch = fixed_batch()
    batch = batch._replace(mask=torch.zeros(batch.actions.shape[0], dtype=torch.bool))
    before = [p.clone() for p in agent.parameters()]
    cfg = PPOConfig(n_epochs=2, max_grad_norm=None)
    ppo_update(agent, make_optimizer(agent.parameters(), cfg), batch, cfg)
    for p0, p1 in zip(before, agent.parameters()):
        torch.testing.assert_close(p0, p1)


def test_same_seed_same_result():
    results = []
    for _ in range(2):
        agent, batch = fixed_batch(seed=3)
        cfg = PPOConfig(n_epochs=3, minibatch_size=100)
        opt = make_optimizer(agent.parameters(), cfg)
        stats = ppo_update(agent, opt, batch, cfg, generator=torch.Generator().manual_seed(1))
        results.append((stats, [p.detach().clone() for p in agent.parameters()]))
    assert results[0][0] == results[1][0]
    for a, b in zip(results[0][1], results[1][1]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("field,value", [
    ("learning_rate", 0.0), ("n_epochs", 0), ("minibatch_size", 0), ("gamma", 1.5), ("gae_lambda", -0.1),
    ("clip_range", -0.2), ("clip_range_vf", 0.0), ("ent_coef", -1.0), ("max_grad_norm", 0.0), ("target_kl", -1.0),
])
def test_bad_config_values_name_the_field(field, value):
    with pytest.raises(UserError, match=f"^{field} must be"):
        PPOConfig(**{field: value})
