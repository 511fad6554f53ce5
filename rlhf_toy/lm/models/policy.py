"""The RLHF policy: the SFT language model plus a value head, implementing the core's `ActorCritic`."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .causal_lm import response_logprobs
from .constrain import ReplyConstraint
from .devices import model_device


class PolicyWithValueHead(nn.Module):
    """`evaluate((prompt_ids, prompt_mask), response_ids) -> (logprobs, entropy, values)`, each `[B, R]`.

    The value head reads the trunk's last hidden states *detached*: its loss trains the head only, never the
    language model (a value loss flowing into a shared trunk destabilized PPO in a small test here). Without a
    `critic` (RLOO, the GRPO family: nothing reads the values) the head is kept, frozen, but not run: the values
    are zeros, and the update spends nothing on them.

    `constraint` (an agent's `--constrain_actions`): the policy is the language model's distribution renormalized
    over the replies it allows, in every log-prob and entropy `evaluate` returns.
    """

    def __init__(
        self,
        lm: nn.Module,
        temperature: float,
        value_hidden: int = 128,
        critic: bool = True,
        constraint: ReplyConstraint | None = None,
    ) -> None:
        super().__init__()
        self.lm, self.temperature, self.critic, self.constraint = lm, temperature, critic, constraint
        width = lm.config.hidden_size  # every architecture's name for it (GPT-2 maps n_embd)
        self.value_head = nn.Sequential(nn.Linear(width, value_hidden), nn.Tanh(), nn.Linear(value_hidden, 1))
        nn.init.zeros_(self.value_head[2].weight)
        nn.init.zeros_(self.value_head[2].bias)
        self.value_head.to(model_device(lm)).requires_grad_(critic)

    def forward(self, observations: tuple[Tensor, Tensor], actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The same as `evaluate` (what `DistributedDataParallel` calls)."""
        return self.evaluate(observations, actions)

    def evaluate(self, observations: tuple[Tensor, Tensor], actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        prompt_ids, prompt_mask = observations
        if not self.critic:
            logprobs, entropy = response_logprobs(
                self.lm, prompt_ids, prompt_mask, actions, self.temperature, constraint=self.constraint
            )
            return logprobs, entropy, torch.zeros_like(logprobs)
        logprobs, entropy, hidden = response_logprobs(
            self.lm, prompt_ids, prompt_mask, actions, self.temperature, return_hidden=True, constraint=self.constraint
        )
        values = self.value_head(hidden.detach()).squeeze(-1)
        return logprobs, entropy, values
