"""Loss properties: ratio 1 gives the policy gradient, clipping zeroes the right gradients, value clipping."""

import pytest
import torch
from torch.testing import assert_close

from rlhf_toy.losses import clipped_policy_loss, explained_variance, kl_k1, kl_k3, policy_gradient_loss, value_loss


def test_ratio_one_gives_the_plain_policy_gradient():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 3, generator=g, requires_grad=True)
    actions = torch.randint(0, 3, (64,), generator=g)
    adv = torch.randn(64, generator=g)
    logp = torch.log_softmax(logits, -1).gather(1, actions[:, None]).squeeze(1)
    (g_ppo,) = torch.autograd.grad(clipped_policy_loss(logp, logp.detach(), adv, 0.2).loss, logits, retain_graph=True)
    (g_pg,) = torch.autograd.grad(policy_gradient_loss(logp, adv), logits)
    assert_close(g_ppo, g_pg)


def _grad(logp_new, logp_old, adv, clip):
    x = torch.tensor([logp_new], requires_grad=True)
    out = clipped_policy_loss(x, torch.tensor([logp_old]), torch.tensor([adv]), clip)
    (g,) = torch.autograd.grad(out.loss, x)
    return g.item(), out


def test_no_gradient_where_the_ratio_is_clipped_in_the_advantages_direction():
    up = torch.log(torch.tensor(1.5)).item()  # ratio 1.5 > 1.2
    down = torch.log(torch.tensor(0.5)).item()  # ratio 0.5 < 0.8
    assert _grad(up, 0.0, +1.0, 0.2)[0] == 0.0  # already more likely enough: no further push
    assert _grad(down, 0.0, -1.0, 0.2)[0] == 0.0  # already less likely enough
    # Moved against the advantage: the unclipped term is active and pulls back.
    assert _grad(down, 0.0, +1.0, 0.2)[0] != 0.0
    assert _grad(up, 0.0, -1.0, 0.2)[0] != 0.0
    # Without clipping the gradient is always there.
    assert _grad(up, 0.0, +1.0, None)[0] != 0.0


def test_clip_fraction_and_approx_kl():
    new = torch.log(torch.tensor([1.0, 1.5, 0.5, 1.1]))
    out = clipped_policy_loss(new, torch.zeros(4), torch.ones(4), 0.2)
    assert out.clip_fraction.item() == 0.5
    r = new.exp()
    assert_close(out.approx_kl, ((r - 1) - new).mean())
    assert out.approx_kl >= 0


def test_mask_excludes_padding():
    logp = torch.tensor([[0.1, 0.2, 5.0]])
    adv = torch.tensor([[1.0, 2.0, 100.0]])
    mask = torch.tensor([[True, True, False]])
    out = clipped_policy_loss(logp, logp, adv, 0.2, mask)
    assert_close(out.loss, torch.tensor(-1.5))


def test_value_loss_clipping_by_hand():
    v, old, ret = torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([3.0])
    assert value_loss(v, old, ret).item() == 1.0
    # Clipped prediction 0.5 is further from the return: the max takes (0.5 - 3)^2.
    assert value_loss(v, old, ret, clip_range=0.5).item() == 6.25
    # If the clipped one is closer, the plain error wins.
    assert value_loss(torch.tensor([4.0]), old, ret, clip_range=0.5).item() == 6.25
    assert value_loss(torch.tensor([4.0]), torch.tensor([3.9]), ret, clip_range=0.5).item() == 1.0


def test_kl_estimators():
    g = torch.Generator().manual_seed(0)
    p_logits, q_logits = torch.randn(5, generator=g), torch.randn(5, generator=g)
    logp_all, logq_all = torch.log_softmax(p_logits, 0), torch.log_softmax(q_logits, 0)
    exact = (logp_all.exp() * (logp_all - logq_all)).sum()
    samples = torch.multinomial(logp_all.exp(), 200_000, replacement=True, generator=g)
    k1 = kl_k1(logp_all[samples], logq_all[samples])
    k3 = kl_k3(logp_all[samples], logq_all[samples])
    assert (k1 < 0).any()  # k1 is negative on some samples ...
    assert abs(k1.mean() - exact) < 0.01  # ... but unbiased
    assert (k3 >= 0).all() and abs(k3.mean() - exact) < 0.01


def test_explained_variance():
    ret = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(ret, ret) == 1.0
    assert abs(explained_variance(torch.full((4,), 2.5), ret)) < 1e-6
    assert explained_variance(ret, torch.ones(4)) != explained_variance(ret, torch.ones(4))  # NaN: no variance
    # dim=1: one value per row, each as the row alone gives it (NaN for a row whose returns do not vary)
    g = torch.Generator().manual_seed(0)
    values, returns = torch.randn(3, 6, generator=g), torch.randn(3, 6, generator=g)
    returns[2] = 1.0
    mask = torch.rand(3, 6, generator=g) > 0.3
    mask[:, :2] = True
    per_row = explained_variance(values, returns, mask, dim=1)
    for k in range(3):
        alone = explained_variance(values[k], returns[k], mask[k])
        assert per_row[k].isnan() if alone != alone else per_row[k].item() == pytest.approx(alone, abs=1e-6)
    assert per_row[2].isnan()


def test_dpo_loss_matches_a_hand_computed_value():
    import math

    from rlhf_toy.losses import dpo_loss

    # chosen: policy -1.0, reference -2.0 (log-ratio +1); rejected: policy -3.0, reference -2.5 (log-ratio -0.5)
    out = dpo_loss(torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-2.5]), beta=0.1)
    expected = -math.log(1 / (1 + math.exp(-0.1 * (1.0 - (-0.5)))))  # -log sigmoid(0.15) = 0.62096...
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    assert out.chosen_rewards.item() == pytest.approx(0.1) and out.rejected_rewards.item() == pytest.approx(-0.05)
    assert out.accuracy.item() == 1.0


@pytest.mark.parametrize("policy_loss,kl_coef,ent_coef", [("clipped", 0.0, 0.0), ("pg", 0.1, 0.01)])
def test_minibatch_loss_with_dim_equals_one_call_per_row(policy_loss, kl_coef, ent_coef):
    """`dim=1` (a population's one loss per agent) against the loss of each row alone, on random data with
    padding: every part, and the gradients."""
    from rlhf_toy.masks import masked_var, masked_whiten
    from rlhf_toy.ppo import PPOConfig, RolloutBatch, minibatch_loss

    g = torch.Generator().manual_seed(0)
    N, b = 4, 9
    r = lambda: torch.randn(N, b, generator=g)  # noqa: E731
    mask = torch.rand(N, b, generator=g) > 0.3
    mask[:, 0] = True
    lp, ent, v = (r().requires_grad_() for _ in range(3))
    mb = RolloutBatch(None, None, r(), r(), r(), r(), mask, r())
    cfg = PPOConfig(ent_coef=ent_coef, clip_range_vf=0.3)
    loss, parts = minibatch_loss(lp, ent, v, mb, cfg, 0.2, policy_loss, kl_coef, dim=1)
    loss.sum().backward()
    for k in range(N):
        lpk, entk, vk = (t.detach()[k].clone().requires_grad_() for t in (lp, ent, v))
        mbk = RolloutBatch(None, None, *(x[k] for x in mb[2:]))
        loss_k, parts_k = minibatch_loss(lpk, entk, vk, mbk, cfg, 0.2, policy_loss, kl_coef)
        loss_k.backward()
        assert_close(loss[k], loss_k)
        for name, value in parts_k.items():
            assert_close(parts[name][k], value)
        for batched, single in ((lp, lpk), (ent, entk), (v, vk)):
            if single.grad is None:  # the entropy, without a bonus, stays out of the graph in both
                assert batched.grad is None
            else:
                assert_close(batched.grad[k], single.grad)
        assert_close(masked_var(mb.advantages, mask, dim=1)[k], masked_var(mb.advantages[k], mask[k]))
        assert_close(masked_whiten(mb.advantages, mask, dim=1)[k], masked_whiten(mb.advantages[k], mask[k]))
    assert_close(masked_var(mb.advantages, dim=1), mb.advantages.var(dim=1))  # no mask: torch's unbiased var


def test_minibatch_loss_with_dim_and_one_sample_per_row_skips_normalization_as_one_row_does():
    from rlhf_toy.ppo import PPOConfig, RolloutBatch, minibatch_loss

    g = torch.Generator().manual_seed(1)
    lp, old, adv = (torch.randn(3, 1, generator=g) for _ in range(3))
    mb = RolloutBatch(None, None, old, torch.zeros(3, 1), adv, torch.zeros(3, 1))
    loss, _ = minibatch_loss(lp, torch.zeros(3, 1), torch.zeros(3, 1), mb, PPOConfig(), 0.2, dim=1)
    for k in range(3):
        row = RolloutBatch(None, None, old[k], torch.zeros(1), adv[k], torch.zeros(1))
        alone, _ = minibatch_loss(lp[k], torch.zeros(1), torch.zeros(1), row, PPOConfig(), 0.2)
        assert_close(loss[k], alone)
    assert loss.abs().sum() > 0  # not normalized to zeros
