import torch
from torch import nn

from rlhf_toy import PPOConfig, RolloutBatch, gae, make_optimizer, ppo_update

# A corridor of 6 cells, vectorized in torch: start in cell 0; "right" moves on, "left" moves back.
# Reaching cell 5 pays +1 and terminates; an episode is truncated after 20 steps.
N_ENVS, T, GOAL, LIMIT = 16, 32, 5, 20


class Policy(nn.Module):  # implements rlhf_toy.ActorCritic: evaluate(obs, actions) -> logp, entropy, value
    def __init__(self):
        super().__init__()
        self.pi, self.v = nn.Linear(GOAL + 1, 2), nn.Linear(GOAL + 1, 1)

    def evaluate(self, obs, actions):
        dist = torch.distributions.Categorical(logits=self.pi(obs))
        return dist.log_prob(actions), dist.entropy(), self.v(obs).squeeze(-1)


def observe(pos):
    return nn.functional.one_hot(pos, GOAL + 1).float()


torch.manual_seed(0)
gen = torch.Generator().manual_seed(0)
policy, cfg = Policy(), PPOConfig(learning_rate=3e-2, n_epochs=4, minibatch_size=128, gamma=0.95)
optimizer = make_optimizer(policy.parameters(), cfg)
pos, age = torch.zeros(N_ENVS, dtype=torch.long), torch.zeros(N_ENVS, dtype=torch.long)
for iteration in range(20):
    obs, act, logp, val, rew, term, trunc, next_val = ([] for _ in range(8))
    with torch.no_grad():
        for _ in range(T):
            o = observe(pos)
            a = torch.multinomial(torch.softmax(policy.pi(o), -1), 1, generator=gen).squeeze(-1)
            lp, _, v = policy.evaluate(o, a)
            pos, age = (pos + 2 * a - 1).clamp(0, GOAL), age + 1
            reached, cut = pos == GOAL, (age >= LIMIT) & (pos != GOAL)
            # V(next observation) *before* the reset: a truncated episode bootstraps from it.
            next_val.append(policy.v(observe(pos)).squeeze(-1))
            for buf, x in zip((obs, act, logp, val, rew, term, trunc), (o, a, lp, v, reached.float(), reached, cut)):
                buf.append(x)
            pos, age = torch.where(reached | cut, 0, pos), torch.where(reached | cut, 0, age)
    stack = lambda xs: torch.stack(xs)  # [T, N_ENVS, ...]
    advantages, returns = gae(
        stack(rew), stack(val), stack(next_val), stack(term), stack(trunc), gamma=cfg.gamma, lam=cfg.gae_lambda
    )
    flat = lambda x: x.reshape(T * N_ENVS, *x.shape[2:])
    batch = RolloutBatch(
        flat(stack(obs)), flat(stack(act)), flat(stack(logp)), flat(stack(val)), flat(advantages), flat(returns)
    )
    ppo_update(policy, optimizer, batch, cfg, progress=iteration / 20, generator=gen)

right = torch.softmax(policy.pi(observe(torch.arange(GOAL))), -1)[:, 1]
print("P(right) in cells 0-4:", [round(p, 2) for p in right.tolist()])
assert (right > 0.9).all(), "the agent should have learned to walk right"
