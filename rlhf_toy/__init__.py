"""rlhf-toy: one small PPO core for a CartPole agent and for RLHF on a tiny language model.

The core imports nothing from gymnasium or transformers:
- `advantages`: `gae` (terminated vs truncated, padding mask) and `discounted_returns`.
- `losses`: clipped surrogate, plain policy gradient, (clipped) value loss, KL estimators, explained variance.
- `ppo`: `PPOConfig`, `RolloutBatch`, the `ActorCritic` protocol and `ppo_update`.
- `population`: `population_ppo_update`, the same update for N agents with stacked parameters.
"""

from .advantages import discounted_returns, dr_grpo_advantages, equal_groups, gae, grpo_advantages, rloo_advantages
from .errors import UserError
from .losses import (
    aggregate,
    clipped_policy_loss,
    dpo_loss,
    explained_variance,
    kl_estimate,
    kl_k1,
    kl_k2,
    kl_k3,
    policy_gradient_loss,
    value_loss,
)
from .masks import masked_mean, masked_whiten
from .population import population_ppo_update
from .ppo import ActorCritic, NonFiniteUpdate, PPOConfig, RolloutBatch, make_optimizer, minibatch_loss, ppo_update
from .seeding import seed_everything

__version__ = "0.2.0"  # the one place the version lives (pyproject reads it)

__all__ = [
    "ActorCritic",
    "NonFiniteUpdate",
    "PPOConfig",
    "RolloutBatch",
    "UserError",
    "aggregate",
    "clipped_policy_loss",
    "discounted_returns",
    "dpo_loss",
    "dr_grpo_advantages",
    "equal_groups",
    "explained_variance",
    "gae",
    "grpo_advantages",
    "kl_estimate",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "make_optimizer",
    "masked_mean",
    "masked_whiten",
    "minibatch_loss",
    "policy_gradient_loss",
    "population_ppo_update",
    "ppo_update",
    "rloo_advantages",
    "seed_everything",
    "value_loss",
]
