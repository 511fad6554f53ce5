"""The update routine: config validation, loss goes down on a fixed batch, KL early stop, determinism."""

import pytest
import torch
from torch import nn

from rlhf_toy import PPOConfig, RolloutBatch, UserError, make_optimizer, ppo_update
from rlhf_toy.losses import clipped_policy_loss, value_loss


class TinyActorCritic(nn.Module):
    """The smallest `ActorCritic`: linear actor and critic over a flat observation (the core's tests stay free of
    gymnasium and of the cartpole client)."""

    def __init__(self, obs_dim: int, n_actions: int) -> None:
        super().__init__()
        self.actor, self.critic = nn.Linear(obs_dim, n_actions), nn.Linear(obs_dim, 1)
        nn.init.zeros_(self.actor.weight)  # start uniform, as PPO's small-gain policy head does
        nn.init.zeros_(self.actor.bias)

    def evaluate(self, obs, actions):
        log_pi = torch.log_softmax(self.actor(obs), -1)
        entropy = -(log_pi.exp() * log_pi).sum(-1)
        return log_pi.gather(-1, actions.unsqueeze(-1)).squeeze(-1), entropy, self.critic(obs).squeeze(-1)


def fixed_batch(seed=0, B=512):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    agent = TinyActorCritic(4, 3)
    obs = torch.randn(B, 4, generator=g)
    with torch.no_grad():
        actions = torch.multinomial(torch.softmax(agent.actor(obs), -1), 1, generator=g).squeeze(-1)
        logprobs, _, values = agent.evaluate(obs, actions)
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
    cfg = PPOConfig(learning_rate=1e-2, n_epochs=10, minibatch_size=128, anneal_lr=False)
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


def test_minibatches_keep_groups_whole_and_one_sample_groups_are_a_plain_permutation():
    from rlhf_toy.ppo import shuffled_minibatches

    plain = shuffled_minibatches(64, 16, torch.Generator().manual_seed(5))
    assert torch.equal(torch.cat(plain), torch.randperm(64, generator=torch.Generator().manual_seed(5)))
    grouped = shuffled_minibatches(64, 16, torch.Generator().manual_seed(5), group_size=4)
    assert len(grouped) == 4 and sorted(torch.cat(grouped).tolist()) == list(range(64))
    for idx in grouped:  # 4 whole groups of 4 consecutive rows each, in a random order
        groups = idx.view(4, 4)
        assert torch.equal(groups - groups[:, :1], torch.arange(4).expand(4, 4)) and (groups[:, 0] % 4 == 0).all()
    assert not torch.equal(torch.cat(grouped), torch.arange(64))
    agent, batch = fixed_batch(B=64)
    with pytest.raises(ValueError, match="whole groups of 3"):
        ppo_update(agent, make_optimizer(agent.parameters(), PPOConfig()), batch, PPOConfig(), group_size=3)


def test_lr_scales_set_each_groups_learning_rate():
    agent, batch = fixed_batch()
    cfg = PPOConfig(learning_rate=1e-3, anneal_lr=False, n_epochs=1)
    opt = make_optimizer([{"params": agent.actor.parameters()}, {"params": agent.critic.parameters()}], cfg)
    ppo_update(agent, opt, batch, cfg, lr_scales=(1.0, 10.0))
    assert [g["lr"] for g in opt.param_groups] == [1e-3, pytest.approx(1e-2)]
    with pytest.raises(ValueError, match="2 param groups"):
        ppo_update(agent, opt, batch, cfg, lr_scales=(1.0,))


def test_core_tests_do_not_import_the_cartpole_client():
    import ast
    from pathlib import Path

    for name in ("test_ppo.py", "test_advantages.py", "test_losses.py", "test_masks.py"):
        path = Path(__file__).with_name(name)
        if path.exists():
            imported = {
                a.name.split(".")[0]
                for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, ast.Import)
                for a in n.names
            } | {
                n.module.split(".")[0]
                for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, ast.ImportFrom) and n.module
            }
            assert not imported & {"cartpole", "gymnasium"}, name


@pytest.mark.parametrize(
    "field,value",
    [
        ("learning_rate", 0.0),
        ("n_epochs", 0),
        ("minibatch_size", 0),
        ("gamma", 1.5),
        ("gae_lambda", -0.1),
        ("clip_range", -0.2),
        ("clip_range_vf", 0.0),
        ("ent_coef", -1.0),
        ("max_grad_norm", 0.0),
        ("target_kl", -1.0),
    ],
)
def test_bad_config_values_name_the_field(field, value):
    with pytest.raises(UserError, match=f"^{field} must be"):
        PPOConfig(**{field: value})


def test_seed_everything_keeps_freed_memory_on_glibc():
    """The allocator setting is applied where glibc is the C library, and is a no-op elsewhere."""
    import platform

    from rlhf_toy.runtime import keep_freed_memory
    from rlhf_toy.seeding import seed_everything

    seed_everything(0)
    assert keep_freed_memory() is (platform.libc_ver()[0] == "glibc")


def test_the_run_generator_does_not_replay_the_global_stream():
    """`torch.manual_seed(s)` and `Generator().manual_seed(s)` give the same numbers; the run's generator must not,
    or the numbers that initialize a network would also sample its actions."""
    from rlhf_toy.seeding import seed_everything

    g = seed_everything(3)
    global_draws = torch.rand(16)
    assert not torch.equal(torch.rand(16, generator=g), global_draws)
    assert torch.equal(torch.rand(4, generator=seed_everything(3)), torch.rand(4, generator=seed_everything(3)))


def test_a_trimmed_minibatch_drops_only_the_columns_after_its_last_real_token():
    from rlhf_toy.ppo import trimmed

    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    x = torch.arange(10.0).reshape(2, 5)
    mb = RolloutBatch((x, mask), x.long(), x, x, x, x, mask, x)
    cut = trimmed(mb)
    assert cut.actions.shape == (2, 3) and cut.mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert all(t.shape == (2, 3) for t in (cut.logprobs, cut.values, cut.advantages, cut.returns, cut.ref_logprobs))
    assert cut.observations is mb.observations  # the prompts stay whole
    full = RolloutBatch(x, x.long(), x, x, x, x, torch.ones(2, 5))
    assert trimmed(full) is full
    steps = RolloutBatch(x, torch.zeros(2), x[:, 0], x[:, 0], x[:, 0], x[:, 0], torch.ones(2))  # no time axis
    assert trimmed(steps) is steps


def test_length_groups_cut_rows_where_padding_costs_more_than_another_pass():
    from rlhf_toy.ppo import length_groups

    # two short rows and two long ones: run apart, 2 x 12 + 2 x 400 + 2 x 50 = 924 positions; together 1650
    assert length_groups([10, 400, 12, 390], overhead=50) == [[0, 2], [3, 1]]
    assert length_groups([10, 400, 12, 390], overhead=10_000) == [[0, 2, 3, 1]]  # one more pass costs too much
    assert length_groups([5, 5, 5], overhead=0) in ([[0, 1, 2]], [[0], [1], [2]], [[0], [1, 2]], [[0, 1], [2]])
    lengths = torch.randint(0, 300, (16,), generator=torch.Generator().manual_seed(0)).tolist()
    groups = length_groups(lengths, overhead=60)
    assert sorted(r for g in groups for r in g) == list(range(16))  # every row once
    run = sum(len(g) * max(max(lengths[r] for r in g), 1) + 60 for g in groups)
    assert run <= 16 * max(lengths) + 60  # never worse than one pass


def test_rows_run_by_length_give_the_same_log_probs_values_and_gradients():
    """`evaluate_by_length` (what `ppo_update(trim=True)` runs: an agent's episodes) against one padded pass."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlhf_toy.lm.models.policy import PolicyWithValueHead
    from rlhf_toy.ppo import evaluate_by_length, length_groups

    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=64, n_embd=32, n_layer=2, n_head=2)).eval()
    policy = PolicyWithValueHead(lm, temperature=0.7)
    prompts = torch.randint(1, 50, (6, 5))
    prompts[1:4] = prompts[0]  # rows 0-3 share a prompt (its forward pass is shared), 4 and 5 do not
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[5, :2] = 0  # left-padded
    actions = torch.randint(1, 50, (6, 30))
    lengths = [3, 30, 7, 28, 1, 12]
    mask = (torch.arange(30)[None] < torch.tensor(lengths)[:, None]).float()
    mask[1, 10:20] = 0  # an environment's tokens inside an agent's row
    x = torch.randn(6, 30)
    mb = RolloutBatch((prompts, prompt_mask), actions, x, x, x, x, mask, x)

    def run(fn):
        policy.zero_grad()
        outputs = fn()
        loss = sum(((o * torch.linspace(0.5, 1.5, 30)) * mask).sum() for o in outputs)
        loss.backward()
        return [o.detach() * mask for o in outputs], [p.grad.clone() for p in policy.parameters()]

    assert len(length_groups(lengths, overhead=30 // 4)) == 3  # what evaluate_by_length cuts: three passes
    grouped, grads = run(lambda: evaluate_by_length(policy, mb))
    whole, whole_grads = run(lambda: policy.evaluate(mb.observations, mb.actions))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grouped, whole))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads, whole_grads))
    assert grouped[0].abs().sum() > 0 and grads[0].abs().sum() > 0
