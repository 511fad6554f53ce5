"""The online RLHF algorithms on one core: PPO, REINFORCE (with and without a baseline), RLOO and GRPO.

They share everything up to the rewards (sampling, log-probs, the reward model, the per-token KL); they
differ only in how rewards become advantages and in the policy loss `ppo_update` applies:

- `ppo`: `gae` over response tokens; the clipped surrogate; the value head is the critic.
- `reinforce`: `discounted_returns` of the per-token rewards; `policy_gradient_loss`; no critic.
- `reinforce_baseline`: the same returns minus the value head's estimate; `policy_gradient_loss`.
- `rloo`: `rloo_advantages` of the sequence rewards, k replies per prompt; `policy_gradient_loss`; no critic.
- `grpo`: `grpo_advantages` of the sequence rewards, k per prompt; the clipped surrogate (+ a k3 KL term in the
  loss, if chosen); no critic.

A sequence reward is the reward-model score minus beta times the sequence KL (for GRPO with the KL in the loss,
the score alone). Critic-free methods have `vf_coef=0` in their presets: the value head gets no gradient.
Each preset is one complete `PPOConfig`; comments mark what differs from `PPOConfig`'s defaults.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf_toy.advantages import discounted_returns, gae, grpo_advantages, rloo_advantages
from rlhf_toy.errors import UserError
from rlhf_toy.masks import last_real_index
from rlhf_toy.ppo import PPOConfig

ALGORITHMS = ("ppo", "reinforce", "reinforce_baseline", "rloo", "grpo")
GROUPED = ("rloo", "grpo")  # k samples per prompt
GROUP_SIZE = 4  # their default k (`--group_size`)
CRITIC_FREE = ("reinforce", "rloo", "grpo")  # their advantages do not read the value head


def needs_values(algorithm: str, ppo: PPOConfig) -> bool:
    """Whether a rollout must run the value head: for a critic's advantages, or for a value loss that counts."""
    return algorithm not in CRITIC_FREE or ppo.vf_coef > 0


POLICY_LOSS = {"ppo": "clipped", "reinforce": "pg", "reinforce_baseline": "pg", "rloo": "pg", "grpo": "clipped"}

LM_REINFORCE = PPOConfig(
    learning_rate=2e-5,  # differs (3e-4): as LM_PPO
    anneal_lr=False,  # differs (True)
    n_epochs=1,  # differs (10): on-policy, one pass over each batch
    minibatch_size=16,  # differs (64): 4 gradient steps per 64-episode batch, as many as one PPO epoch
    gamma=1.0,  # differs (0.99)
    gae_lambda=0.95,
    clip=False,  # differs (True): no ratio (the loss is -log pi * A)
    clip_range=0.2,
    anneal_clip=False,
    clip_range_vf=None,
    normalize_advantages=False,  # differs (True): centring the returns would itself be a baseline
    ent_coef=0.0,
    vf_coef=0.0,  # differs (0.5): no critic
    max_grad_norm=1.0,  # differs (0.5)
    target_kl=None,
    adam_eps=1e-5,
)
LM_REINFORCE_BASELINE = PPOConfig(
    learning_rate=2e-5,  # differs (3e-4)
    anneal_lr=False,  # differs (True)
    n_epochs=1,  # differs (10)
    minibatch_size=16,  # differs (64)
    gamma=1.0,  # differs (0.99)
    gae_lambda=0.95,
    clip=False,  # differs (True)
    clip_range=0.2,
    anneal_clip=False,
    clip_range_vf=None,
    normalize_advantages=False,  # differs (True): the learned baseline is the only centring
    ent_coef=0.0,
    vf_coef=0.1,  # differs (0.5): the value head is the baseline, weighted as LM_PPO's
    max_grad_norm=1.0,  # differs (0.5)
    target_kl=None,
    adam_eps=1e-5,
)
LM_RLOO = PPOConfig(
    learning_rate=2e-5,  # differs (3e-4)
    anneal_lr=False,  # differs (True)
    n_epochs=1,  # differs (10): REINFORCE with a leave-one-out baseline, on-policy
    minibatch_size=16,  # differs (64): a multiple of the group size keeps groups whole
    gamma=1.0,  # differs (0.99)
    gae_lambda=0.95,
    clip=False,  # differs (True)
    clip_range=0.2,
    anneal_clip=False,
    clip_range_vf=None,
    normalize_advantages=False,  # differs (True): the leave-one-out mean is the baseline
    ent_coef=0.0,
    vf_coef=0.0,  # differs (0.5): no critic
    max_grad_norm=1.0,  # differs (0.5)
    target_kl=None,
    adam_eps=1e-5,
)
LM_GRPO = PPOConfig(
    learning_rate=2e-5,  # differs (3e-4)
    anneal_lr=False,  # differs (True)
    n_epochs=4,  # differs (10): several clipped epochs per batch, as PPO
    minibatch_size=16,  # differs (64)
    gamma=1.0,  # differs (0.99)
    gae_lambda=0.95,
    clip=True,
    clip_range=0.2,
    anneal_clip=False,
    clip_range_vf=None,
    normalize_advantages=False,  # differs (True): advantages are already normalized within each group
    ent_coef=0.0,
    vf_coef=0.0,  # differs (0.5): no critic
    max_grad_norm=1.0,  # differs (0.5)
    target_kl=None,
    adam_eps=1e-5,
)


def default_group_size(algorithm: str) -> int:
    return GROUP_SIZE if algorithm in GROUPED else 1


def check_algorithm(algorithm: str, group_size: int, batch_size: int) -> None:
    if algorithm not in ALGORITHMS:
        raise UserError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    if algorithm in GROUPED and group_size < 2:
        raise UserError(f"{algorithm} needs at least 2 samples per prompt to compare them; pass --group_size 4")
    if batch_size % group_size:
        raise UserError(f"batch_size ({batch_size}) is not a multiple of group_size ({group_size}); pass a batch of "
                        "whole groups, e.g. --batch_size 64 --group_size 4")


def advantages_and_returns(algorithm: str, rewards: Tensor, scores: Tensor, kl: Tensor, values: Tensor,
                           mask: Tensor, beta: float, ppo: PPOConfig, group_size: int,
                           kl_in_loss: bool) -> tuple[Tensor, Tensor]:
    """`[B, R]` advantages and value targets. `rewards [B, R]` per token (-beta KL + score at the end),
    `scores [B]`, `kl [B, R]`, `values [B, R]` (0 on padding), `mask [B, R]`; groups are consecutive rows."""
    terminated = torch.zeros_like(mask, dtype=torch.bool)
    terminated[torch.arange(mask.shape[0], device=mask.device), last_real_index(mask)] = True
    if algorithm == "ppo":  # time-major for the core; the last real token ends the episode
        next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], 1)
        adv, ret = gae(rewards.T, values.T, next_values.T, terminated.T, gamma=ppo.gamma, lam=ppo.gae_lambda,
                       mask=mask.T)
        return adv.T, ret.T
    if algorithm in ("reinforce", "reinforce_baseline"):
        ret = discounted_returns(rewards.T, terminated.T, gamma=ppo.gamma, mask=mask.T).T
        return (ret - values if algorithm == "reinforce_baseline" else ret) * mask, ret
    sequence = scores if (algorithm == "grpo" and kl_in_loss) else scores - beta * kl.sum(1)
    fn = rloo_advantages if algorithm == "rloo" else grpo_advantages
    adv = fn(sequence, group_size)[:, None] * mask  # one advantage for every token of a reply
    return adv, sequence[:, None] * mask

