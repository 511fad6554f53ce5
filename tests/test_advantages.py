"""GAE and returns against naive per-step loops on random data."""

import torch
from torch.testing import assert_close

from rlhf_toy.advantages import discounted_returns, gae


def naive_gae(r, v, nv, term, trunc, mask, gamma, lam):
    """Per env, per step, the textbook recursion with explicit branches for each kind of step."""
    T, N = r.shape
    adv = torch.zeros(T, N, dtype=torch.float64)
    for n in range(N):
        last = 0.0  # advantage of the next real step of the same episode
        for t in reversed(range(T)):
            if not mask[t, n]:
                continue  # padding: skipped, the chain passes over it
            if term[t, n]:
                last = float(r[t, n] - v[t, n])
            elif trunc[t, n]:
                last = float(r[t, n] + gamma * nv[t, n] - v[t, n])
            else:
                last = float(r[t, n] + gamma * nv[t, n] - v[t, n]) + gamma * lam * last
            adv[t, n] = last
    return adv


def random_rollout(T=40, N=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(T, N, generator=g, dtype=torch.float64)
    v = torch.randn(T, N, generator=g, dtype=torch.float64)
    nv = torch.randn(T, N, generator=g, dtype=torch.float64)
    term = torch.rand(T, N, generator=g) < 0.1
    trunc = (torch.rand(T, N, generator=g) < 0.1) & ~term
    mask = torch.rand(T, N, generator=g) > 0.15
    return r, v, nv, term, trunc, mask


def test_gae_matches_naive_loop_with_terminated_truncated_and_mask():
    for seed in range(5):
        r, v, nv, term, trunc, mask = random_rollout(seed=seed)
        adv, ret = gae(r, v, nv, term, trunc, gamma=0.97, lam=0.9, mask=mask)
        expected = naive_gae(r, v, nv, term, trunc, mask, 0.97, 0.9)
        assert_close(adv, expected)
        assert_close(ret, (expected + v) * mask)
        assert (adv[~mask] == 0).all()


def test_gae_without_mask_or_truncation_is_the_plain_recursion():
    r, v, nv, term, _, _ = random_rollout(seed=7)
    ones = torch.ones_like(term)
    adv, _ = gae(r, v, nv, term, gamma=0.99, lam=0.95)
    assert_close(adv, naive_gae(r, v, nv, term, torch.zeros_like(term), ones, 0.99, 0.95))


def test_truncation_bootstraps_and_termination_does_not():
    r = torch.tensor([[1.0], [1.0]])
    v = torch.tensor([[0.0], [0.0]])
    nv = torch.tensor([[0.0], [10.0]])
    done = torch.tensor([[False], [True]])
    adv_term, _ = gae(r, v, nv, done, None, gamma=0.5, lam=1.0)
    adv_trunc, _ = gae(r, v, nv, torch.zeros_like(done), done, gamma=0.5, lam=1.0)
    assert adv_term[1, 0] == 1.0  # terminal: the next value is ignored
    assert adv_trunc[1, 0] == 1.0 + 0.5 * 10.0  # truncated: bootstrap from V(final observation)
    assert adv_term[0, 0] == 1.0 + 0.5 * 1.0


def test_padding_values_do_not_leak_into_real_steps():
    """Token sequences: garbage values and rewards on padded steps must change nothing."""
    r, v, nv, term, trunc, mask = random_rollout(seed=3)
    adv1, ret1 = gae(r, v, nv, term, trunc, gamma=1.0, lam=0.95, mask=mask)
    noise = torch.randn_like(r) * 100
    adv2, ret2 = gae(r + noise * ~mask, v + noise * ~mask, nv, term, trunc, gamma=1.0, lam=0.95, mask=mask)
    assert_close(adv1, adv2)
    assert_close(ret1, ret2)


def test_gae_lambda_one_equals_discounted_return_minus_value():
    r, v, _, term, _, _ = random_rollout(seed=4)
    nv = torch.zeros_like(v)
    nv[:-1] = v[1:]
    term[-1] = True  # whole episodes only
    adv, ret = gae(r, v, nv, term, gamma=0.9, lam=1.0)
    assert_close(ret, discounted_returns(r, term, gamma=0.9))


def test_discounted_returns_against_loop():
    g = torch.Generator().manual_seed(1)
    r = torch.randn(30, 3, generator=g)
    dones = torch.rand(30, 3, generator=g) < 0.2
    expected = torch.zeros(30, 3)
    for n in range(3):
        G = 0.0
        for t in reversed(range(30)):
            G = float(r[t, n]) + (0.0 if dones[t, n] else 0.99 * G)
            expected[t, n] = G
    assert_close(discounted_returns(r, dones, gamma=0.99), expected)


def test_gae_rejects_mismatched_shapes():
    import pytest

    with pytest.raises(ValueError, match="share one"):
        gae(
            torch.zeros(3, 2),
            torch.zeros(3, 2),
            torch.zeros(3, 1),
            torch.zeros(3, 2, dtype=torch.bool),
            gamma=0.9,
            lam=0.9,
        )


def test_rloo_baseline_is_the_leave_one_out_mean_on_a_hand_made_group():
    from rlhf_toy.advantages import rloo_advantages

    r = torch.tensor([1.0, 2.0, 6.0, 0.0, 5.0, 5.0])  # two prompts, k = 3
    # prompt 1: 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - (1+2)/2 = 4.5; prompt 2: 0 - 5, 5 - 2.5, 5 - 2.5
    assert rloo_advantages(r, 3).tolist() == [-3.0, -1.5, 4.5, -5.0, 2.5, 2.5]


def test_grpo_advantages_are_normalized_within_each_group_and_zero_for_equal_rewards():
    from rlhf_toy.advantages import grpo_advantages

    g = torch.Generator().manual_seed(0)
    r = torch.cat([torch.randn(8, generator=g) * 3 + 1, torch.full((4,), 2.5)])
    a = grpo_advantages(r, 4).view(3, 4)
    assert_close(a[:2].mean(1), torch.zeros(2), atol=1e-6, rtol=0)
    assert_close(a[:2].std(1), torch.ones(2), atol=1e-3, rtol=0)
    assert torch.equal(a[2], torch.zeros(4))


def test_group_advantages_refuse_bad_groups():
    import pytest

    from rlhf_toy.advantages import grpo_advantages, rloo_advantages
    from rlhf_toy.errors import UserError

    with pytest.raises(UserError, match="group_size must be >= 2"):
        rloo_advantages(torch.zeros(4), 1)
    with pytest.raises(UserError, match="not a whole number of groups of 4"):
        grpo_advantages(torch.zeros(6), 4)
