"""A reward's output is checked once per step, before any update: one finite number per reply, or one error
line naming the reward and what it returned; and the core never steps on a non-finite loss."""

import math

import pytest
import torch

from rlhf_toy.errors import UserError
from rlhf_toy.lm.algorithms.rlhf import RLHFConfig, RLHFTrainer, lm_ppo_config
from rlhf_toy.lm.models.base import load_base
from rlhf_toy.ppo import NonFiniteUpdate, PPOConfig, RolloutBatch, ppo_update
from tests.hf_models import tiny_model_dir

PROMPTS = [f"My {d} is broken." for d in ("printer", "laptop", "router", "phone", "kettle", "oven", "lamp", "fan")]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_model_dir("llama", tmp_path_factory.mktemp("llama"))


def nan_reward(prompts, texts):
    return [float("nan")] * len(texts)


def one_number(prompts, texts):
    return 1.0


def too_few(prompts, texts):
    return [1.0] * (len(texts) - 1)


def a_table(prompts, texts):
    return [[1.0, 2.0]] * len(texts)


def words(prompts, texts):
    return ["good"] * len(texts)


def nothing(prompts, texts):
    return None


@pytest.mark.integration
@pytest.mark.parametrize(
    "fn,message",
    [
        (nan_reward, "returned nan for reply 0 (8 of 8 not finite)"),
        (one_number, "returned shape () for 8 replies"),
        (too_few, "returned shape (7,) for 8 replies"),
        (a_table, "returned shape (8, 2) for 8 replies"),
        (words, "not numbers"),
        (nothing, "not numbers"),
    ],
)
def test_a_bad_reward_is_one_error_naming_it_and_nothing_is_updated(llama, fn, message):
    model, tok = load_base(llama)
    trainer = RLHFTrainer(
        model, fn, tok, RLHFConfig(batch_size=8, max_new_tokens=4), lm_ppo_config(minibatch_size=8), PROMPTS, seed=0
    )
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    with pytest.raises(UserError) as err:
        trainer.step()
    text = str(err.value)
    assert f"test_checked_rewards.{fn.__name__}" in text and message in text, text
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters()))


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pi = torch.nn.Linear(2, 2)
        self.v = torch.nn.Linear(2, 1)

    def evaluate(self, obs, actions):
        dist = torch.distributions.Categorical(logits=self.pi(obs))
        return dist.log_prob(actions), dist.entropy(), self.v(obs).squeeze(-1)


@pytest.mark.parametrize("max_grad_norm", [0.5, None])
def test_the_core_never_steps_on_a_non_finite_loss(max_grad_norm):
    torch.manual_seed(0)
    policy = Linear()
    obs, actions = torch.randn(8, 2), torch.randint(0, 2, (8,))
    with torch.no_grad():
        logprobs, _, values = policy.evaluate(obs, actions)
    adv = torch.randn(8)
    adv[3] = math.inf
    batch = RolloutBatch(obs, actions, logprobs, values, adv, values + 1.0)
    cfg = PPOConfig(minibatch_size=8, n_epochs=2, normalize_advantages=False, max_grad_norm=max_grad_norm)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in policy.parameters()]
    with pytest.raises(NonFiniteUpdate, match="nothing was updated"):
        ppo_update(policy, opt, batch, cfg)
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))
