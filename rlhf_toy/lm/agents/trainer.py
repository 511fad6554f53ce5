"""`AgentTrainer`: any online algorithm of the table (`online.ALGORITHMS`) on a text environment, on the same core.

One step: (1) a batch of episodes in lockstep (`rollout.run_episodes`; groups of `group_size` episodes share a reset
seed: StarPO's trajectory groups); (2) every turn becomes a row, the context the agent read and the reply it wrote,
with its log-probs, the reference's and (for a critic) the value head's; (3) the episode's rewards arrive at the
end of each turn, less beta times the KL of the turn's tokens; (4) the algorithm's own advantage function runs on
the episode as one sequence (`credit` "turn": one step per turn, the value read where the turn begins; "token":
one step per agent token, the environment's tokens skipped), a truncated episode bootstrapped from the value of
what the agent would have read next; (5) the advantages go back to the rows, and the core's `ppo_update` trains on
the agent's tokens only. Under `--async_rollouts` steps (1)-(4) run in a forked sampling process, one update behind,
while this one runs (5) (`sample_ahead`; the worker is the RLHF loop's, `algorithms/async_rollouts.py`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlhf_toy.advantages import equal_groups
from rlhf_toy.config import check, given, option
from rlhf_toy.errors import UserError
from rlhf_toy.masks import masked_mean, masked_whiten
from rlhf_toy.ppo import NonFiniteUpdate, RolloutBatch, ppo_update
from rlhf_toy.runtime import PhaseClock

from ..algorithms.async_rollouts import AsyncSampling, on_cpu
from ..algorithms.experience import shallow
from ..algorithms.kl import per_token_kl
from ..algorithms.online import FIELD_DEFAULTS, OnlineAlgorithm, Signals, get_algorithm
from ..algorithms.rlhf import (
    PPOConfig,
    RLHFConfig,
    frozen_reference,
    kl_controller,
    policy_optimizer,
    reference_logprobs,
    reply_penalties,
)
from ..data.text import distinct_2
from ..models.causal_lm import position_ids
from ..models.chat import encode_responses, pad_sequences
from ..models.constrain import ReplyConstraint
from ..models.devices import autocast, check_bf16, model_device
from ..models.policy import PolicyWithValueHead
from ..models.sampling import Samples
from .registry import ALL_HISTORY, EnvRecord, get_env
from .rollout import Episode, RolloutSettings, Turn, run_episodes, summary
from .rows import Segment, episode_layout, rows_of

CREDITS = ("turn", "token")
# The sampler beside the update (`--async_rollouts`) is off in an agent run unless its caller turns it on: GRPO's
# record turns it on for the RLHF loop, where the frontier comparison decided it; for agents none has.
AGENT_ROLLOUT = {"async_rollouts": False}
# RLHFConfig's settings an agent run does not read, with why (its command refuses them; the Python API too).
AGENT_UNREAD = {
    "reward_reads": "an agent's reward is its environment's, not a reward model's",
    "eval_every": "an agent run evaluates on held-out starting states at its end (--eval_episodes)",
    "eval_prompts": "an agent run evaluates on held-out starting states at its end (--eval_episodes)",
    "kl_limit": "an agent run has no KL stop",
    "kl_limit_window": "an agent run has no KL stop",
    "stop_at_eos": "an agent's reply always ends at EOS (the environment reads it then)",
}


@dataclass
class AgentConfig:
    """What an agent run plays and how it reads it (the environment's record gives the defaults of None)."""

    env: str = option("A built-in environment, a gymnasium id, or module:factory returning a TextEnv.", "frozenlake")
    algorithm: str = option("Any online algorithm of rlhf-toy (ppo, grpo, rloo, reinforce_baseline, ...).", "ppo")
    max_turns: int | None = option("Turn limit of an episode (None: the environment's).", None)
    history: int | None = option(
        "Earlier turns the agent sees before the current observation (0: none; -1: the whole conversation; "
        "None: the environment's).",
        None,
    )
    credit: str = option(
        "Credit assignment of algorithms with per-step returns: turn (one step per turn, the value read where the "
        "turn begins) or token (one step per agent token).",
        "turn",
    )
    invalid_patience: int = option("Stop once every action of this many steps in a row was invalid.", 5)
    constrain_actions: bool | None = option(
        "Draw only the environment's actions (its `actions` words, each then EOS): the others' tokens are masked in "
        "sampling and in every log-prob the update and the KL read, as MaskablePPO masks invalid actions. For games "
        "with a fixed set of actions (FrozenLake, CartPole as text, guess the number, gymnasium ids). None: the "
        "environment's (on for the slippery lake).",
        None,
    )

    def __post_init__(self) -> None:
        check(self.max_turns is None or self.max_turns >= 1, "max_turns", self.max_turns, ">= 1")
        check(self.history is None or self.history >= ALL_HISTORY, "history", self.history, ">= 0, or -1 for all")
        check(self.credit in CREDITS, "credit", self.credit, " or ".join(CREDITS))
        check(self.invalid_patience >= 1, "invalid_patience", self.invalid_patience, ">= 1")


def rollout_settings(
    record: EnvRecord, agent: AgentConfig, rl: RLHFConfig, tok=None, temperature: float | None = None
) -> RolloutSettings:
    """How `agent` plays `record`: its turn limit, history and reply length, and with `--constrain_actions` the
    environment's actions as a reply constraint (`action_constraint`; that needs `tok`)."""
    return RolloutSettings(
        agent.max_turns or record.max_turns,
        record.history if agent.history is None else agent.history,
        rl.max_new_tokens,
        rl.temperature if temperature is None else temperature,
        action_constraint(record, tok, rl.max_new_tokens) if constrains(record, agent) else None,
    )


def constrains(record: EnvRecord, agent: AgentConfig) -> bool:
    """Whether `agent` plays `record` constrained to its actions: the agent's setting, else the record's."""
    return record.constrain_actions if agent.constrain_actions is None else agent.constrain_actions


def action_words(record: EnvRecord) -> tuple[str, ...]:
    """The environment's fixed set of action words (`TextEnv.actions`), which `--constrain_actions` needs."""
    actions = record.make().actions
    if not actions:
        raise UserError(
            f"environment {record.name} names no fixed set of actions (its `actions`), so there is nothing to "
            "constrain the replies to; leave out --constrain_actions"
        )
    return tuple(actions)


def action_constraint(record: EnvRecord, tok, max_new_tokens: int) -> ReplyConstraint:
    """The environment's action words, each as the model writes a reply (`encode_responses`: its tokens, then EOS),
    as the replies a constrained agent may draw."""
    replies = encode_responses(tok, list(action_words(record)))
    if max(len(r) for r in replies) > max_new_tokens:
        raise UserError(
            f"an action of {record.name} is {max(len(r) for r in replies)} tokens with its EOS, longer than "
            f"--max_new_tokens {max_new_tokens}; raise --max_new_tokens"
        )
    return ReplyConstraint(replies)


def eval_seeds(n: int, seed: int) -> list[int]:
    """The reset seeds of `n` held-out episodes: odd numbers (a training episode's are even), drawn from `seed`."""
    return [2 * int(s) + 1 for s in np.random.default_rng(10_000 + seed).integers(0, 2**30, size=n)]


def agent_settings(record: EnvRecord, algorithm: OnlineAlgorithm, rl: RLHFConfig | None, ppo: PPOConfig | None):
    """`(RLHFConfig, PPOConfig)` an agent runs: the algorithm's record, the environment's settings (those the
    algorithm reads) and the caller's fields on top (`OnlineAlgorithm.settle`); what an agent run does not read
    (`AGENT_UNREAD`) is refused when given a value of its own."""
    for name, why in AGENT_UNREAD.items():
        if rl is not None and name in given(rl) and getattr(rl, name) != FIELD_DEFAULTS[name]:
            raise UserError(f"an agent run does not read {name}: {why}; leave it out")
    asked = {k: getattr(rl, k) for k in AGENT_ROLLOUT if k in given(rl)} if rl is not None else {}
    rl, ppo = algorithm.settle(rl, ppo, {"max_new_tokens": record.max_new_tokens, **record.settings})
    return replace(rl, **{**AGENT_ROLLOUT, **asked}), ppo


@torch.no_grad()
def state_values(policy: PolicyWithValueHead, contexts: list[list[int]], pad_id: int) -> Tensor:
    """`[n]` the value head at the last position of each context: the value of the state the agent reads."""
    ids, mask = pad_sequences(contexts, pad_id, "left")
    device = policy.value_head[0].weight.device
    ids, mask = ids.to(device), mask.to(device)
    out = policy.lm(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), output_hidden_states=True)
    return policy.value_head(out.hidden_states[-1][:, -1]).squeeze(-1).float()


def play(
    lm, tok, record: EnvRecord, settings: RolloutSettings, envs: list, seeds: list[int], greedy: bool, critic: bool
) -> list[Episode]:
    """Episodes of `lm` reset with `seeds`, in `envs` (fresh ones from `record` where they are too few); torch's
    global RNG samples. A sampled episode of a critic keeps its hidden states for the value head."""
    envs = envs if len(seeds) <= len(envs) else [record.make() for _ in seeds]
    instructions = getattr(envs[0], "instructions", "")
    return run_episodes(
        lm,
        tok,
        envs[: len(seeds)],
        seeds,
        instructions,
        settings,
        record.name,
        greedy,
        with_hidden=critic and not greedy,
    )


def held_out(
    lm, tok, record: EnvRecord, settings: RolloutSettings, envs: list, n: int, seed: int, greedy: bool = True,
    critic: bool = False,
) -> tuple[dict[str, Any], list[Episode]]:  # fmt: skip
    """`n` held-out episodes of `lm` (odd reset seeds: never a training episode's) and their summary; torch's RNG is
    drawn from `seed` and put back after, so an evaluation leaves a run's random numbers as they were."""
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    try:
        episodes = play(lm, tok, record, settings, envs, eval_seeds(n, seed), greedy, critic)
    finally:
        torch.set_rng_state(state)
    return summary(episodes), episodes


def first_turns(segments: list[Segment]) -> list[int]:
    """The index of each row's first turn (turns in order, `segments` as `rows.rows_of` gives them)."""
    return [j for j, s in enumerate(segments) if j == 0 or s.row != segments[j - 1].row]


@dataclass
class AgentBatch:
    """One step's episodes as the update trains on them: what `AgentTrainer.sample_ahead` returns, here or in the
    sampling process of `--async_rollouts` (`version`: the updates before the weights that played them)."""

    episodes: list[Episode]
    sampling: dict[str, float]  # the grouped algorithms' figures (equal groups, rounds)
    batch: RolloutBatch  # the rows, with the algorithm's advantages
    episode_kl: Tensor  # [B] each episode's summed KL
    rows: Samples  # the rows' tokens, masks and entropies
    row_episodes: Tensor  # [N] each row's episode (the update's minibatches hold whole episodes)
    beta: float  # the KL coefficient its rewards were shaped with
    version: int
    phases: dict[str, float]  # its phase times (sample, reference_forward)


def batch_state(b: AgentBatch) -> dict[str, Any]:
    """An `AgentBatch` as tensors and plain types (a checkpoint is read with `weights_only=True`)."""
    episodes = [{**shallow(e), "turns": [shallow(t) for t in e.turns]} for e in b.episodes]
    return {**shallow(b), "episodes": episodes, "batch": tuple(b.batch), "rows": shallow(b.rows)}


def batch_from_state(state: dict[str, Any]) -> AgentBatch:
    episodes = [Episode(**{**e, "turns": [Turn(**t) for t in e["turns"]]}) for e in state["episodes"]]
    batch = RolloutBatch(*state["batch"])
    return AgentBatch(**{**state, "episodes": episodes, "batch": batch, "rows": Samples(**state["rows"])})


class AgentTrainer:
    """A language model trained to act in a text environment by an online algorithm of the table (its record's
    preset, group size and rollout, with the environment record's settings and the caller's on top: `settle`).

    `model`: the SFT'd causal LM (the frozen reference is a copy, or for LoRA the adapters off); `env`: a record or
    what `get_env` takes (None: `agent.env`). `self.rl`, `self.ppo` are what runs.
    """

    def __init__(
        self,
        model,
        tok,
        env: EnvRecord | str | None = None,
        agent: AgentConfig | None = None,
        rl: RLHFConfig | None = None,
        ppo: PPOConfig | None = None,
        seed: int = 0,
        ref_model=None,
    ) -> None:
        agent = agent or AgentConfig()
        self.record = env if isinstance(env, EnvRecord) else get_env(env or agent.env)
        # what it runs, resolved once: the checkpoints, the report and the policy map read it
        self.agent = replace(agent, constrain_actions=constrains(self.record, agent))
        self.algorithm = get_algorithm(self.agent.algorithm)
        self.rl, self.ppo = agent_settings(self.record, self.algorithm, rl, ppo)
        self.tok, self.seed = tok, seed
        self.settings = rollout_settings(self.record, self.agent, self.rl, tok)
        self.critic = self.algorithm.needs_values(self.ppo)
        self.device = model_device(model)
        check_bf16(self.device, self.rl.bf16)
        torch.manual_seed(seed)  # the value head's initialization draws from it
        self.ref_model = frozen_reference(model, ref_model)
        self.policy = PolicyWithValueHead(
            model.eval(), self.rl.temperature, critic=self.critic, constraint=self.settings.constraint
        )
        self.optimizer = policy_optimizer(self.policy, self.ppo)
        self.kl_ctl = kl_controller(self.rl)
        self.envs = [self.record.make() for _ in range(self.rl.batch_size)]
        self.seeds = np.random.default_rng(seed)  # training episodes' reset seeds: even numbers
        self.update_generator = torch.Generator().manual_seed(seed + 1)
        self.step_count, self.all_invalid = 0, 0
        self.clock = PhaseClock()
        self.last_episodes: list[Episode] = []
        self.rl = on_cpu(self.rl, self.device)
        self.ahead = AsyncSampling()  # --async_rollouts: the sampling process and a checkpoint's batch sampled ahead

    def play(self, n: int, seeds: list[int], greedy: bool = False) -> list[Episode]:
        """`n` episodes reset with `seeds` (its own environments; torch's global RNG samples)."""
        return play(self.policy.lm, self.tok, self.record, self.settings, self.envs, seeds[:n], greedy, self.critic)

    def rollouts(self) -> tuple[list[Episode], dict[str, float]]:
        """This step's episodes: batch_size / group_size reset seeds, each played group_size times; under dynamic
        sampling (DAPO), rounds whose groups of all-equal returns are dropped, until the batch is full."""
        k, n = self.rl.group_size, self.rl.batch_size
        kept: list[Episode] = []
        spare: list[Episode] = []
        groups = equal = rounds = 0
        for _ in range(self.rl.dynamic_sampling_rounds if self.rl.dynamic_sampling else 1):
            rounds += 1
            seeds = [2 * int(s) for s in self.seeds.integers(0, 2**30, size=n // k) for _ in range(k)]
            with self.clock("sample"):
                episodes = self.play(n, seeds)
            if k == 1:
                return episodes, {}
            flat = equal_groups(torch.tensor([e.total_return for e in episodes]), k)
            groups, equal = groups + len(flat), equal + int(flat.sum())
            if not self.rl.dynamic_sampling:
                return episodes, {"equal_groups": equal / groups}
            for g, same in enumerate(flat.tolist()):
                (spare if same else kept).extend(episodes[g * k : (g + 1) * k])
            if len(kept) >= n:
                break
        kept = (kept + spare)[:n]  # filled with equal groups (zero advantage) when the rounds ran out
        return kept, {"equal_groups": equal / groups, "rounds": float(rounds)}

    @property
    def packs(self) -> bool:
        """Whether whole-history episodes train as one row each (`rows`: the same log-probs at a fraction of the
        cost): only where the loss is a mean over the agent's tokens, which the layout then does not change."""
        return (
            self.settings.history == ALL_HISTORY
            and self.ppo.loss_aggregation == "token"
            and self.ppo.ratio_level == "token"
        )

    def turn_rewards(self, turns: list[Turn]) -> Tensor:
        """`[T]` each turn's reward: the environment's, less any missing-EOS and overlong penalty of its reply."""
        rewards = torch.tensor([t.reward for t in turns], dtype=torch.float32)
        eos, lengths = torch.tensor([t.eos for t in turns]), torch.tensor([len(t.reply) for t in turns])
        return reply_penalties(rewards, eos, lengths, self.rl)

    def experience(self, episodes: list[Episode], beta: float) -> tuple[RolloutBatch, Tensor, Samples]:
        """The rows of `episodes` with the algorithm's advantages; also each episode's summed KL `[B]` (and
        `self.row_episodes`, each row's episode, for the update's minibatches)."""
        self.last_episodes = episodes
        rows, segments = rows_of(episodes, self.tok, self.packs)
        mask = rows.response_mask.float()
        device = self.policy.value_head[0].weight.device
        with torch.no_grad():
            values = torch.zeros_like(mask)
            if self.critic and rows.hidden is not None:
                values = self.policy.value_head(rows.hidden.to(device)).squeeze(-1).float().cpu() * mask
            with self.clock("reference_forward"):
                ref = reference_logprobs(self.policy, self.ref_model, rows, self.rl.temperature).float().cpu() * mask
            in_reward = self.rl.kl_in == "reward"
            penalty = per_token_kl(rows.logprobs, ref, self.rl.penalty_estimator) * mask
            signals, places = self.signals(episodes, segments, values, penalty, beta if in_reward else 0.0)
            adv, ret = self.algorithm.advantages(signals, self.ppo, self.rl.group_size)
        row_adv, row_ret = torch.zeros_like(mask), torch.zeros_like(mask)
        loss_mask = mask.clone()
        for (b, start, n, _), seg in zip(places, segments):
            r, span = seg.row, seg.span
            if self.agent.credit == "turn":
                row_adv[r, span], row_ret[r, span] = adv[b, start], ret[b, start]
            else:
                row_adv[r, span], row_ret[r, span] = adv[b, start : start + n], ret[b, start : start + n]
            if self.rl.mask_truncated and not seg.turn.eos:
                loss_mask[r, span] = 0.0
        if self.ppo.normalize_advantages:  # centred over the whole step, not scaled (`update` says why)
            row_adv = row_adv - masked_mean(row_adv, loss_mask)
        batch = RolloutBatch(
            (rows.prompt_ids, rows.prompt_mask),
            rows.response_ids,
            rows.logprobs,
            values,
            row_adv * loss_mask,
            row_ret,
            loss_mask,
            ref,
        )
        kl = per_token_kl(rows.logprobs, ref, "k1") * mask
        self.row_episodes = torch.tensor([places[j][0] for j in first_turns(segments)])
        episode_kl = torch.zeros(len(episodes)).index_add_(0, self.row_episodes, kl.sum(1))
        return batch, episode_kl, rows

    def signals(self, episodes: list[Episode], segments: list[Segment], values: Tensor, penalty: Tensor, beta: float):
        """The episodes as the advantage functions read them (`online.Signals`, `[B, steps]`), and where each turn
        sits in its episode (`episode_layout`); `segments`: where each turn sits in the rows (`rows.rows_of`),
        `values` and `penalty` `[N, R]` per row."""
        places, width = episode_layout(episodes, self.agent.credit)
        B = len(episodes)
        rewards, vals, kl, step_mask = (torch.zeros(B, width) for _ in range(4))
        turn_rewards = self.turn_rewards([seg.turn for seg in segments])
        for j, ((b, start, n, _), seg) in enumerate(zip(places, segments)):
            r, span = seg.row, seg.span
            if self.agent.credit == "turn":
                rewards[b, start] = turn_rewards[j] - beta * penalty[r, span].sum()
                vals[b, start], kl[b, start], step_mask[b, start] = values[r, seg.offset], penalty[r, span].sum(), 1.0
            else:
                rewards[b, start : start + n] = -beta * penalty[r, span]
                rewards[b, start + n - 1] += turn_rewards[j]
                vals[b, start : start + n], kl[b, start : start + n] = values[r, span], penalty[r, span]
                step_mask[b, start : start + n] = 1.0
        if self.rl.whiten_rewards:
            rewards = masked_whiten(rewards, step_mask, shift_mean=False)
        scores = torch.zeros(B).index_add_(0, torch.tensor([p[0] for p in places]), turn_rewards)
        bootstrap = torch.zeros(B)
        cut = [b for b, e in enumerate(episodes) if e.truncated and e.next_context is not None]
        if self.critic and cut:
            contexts = [episodes[b].next_context for b in cut]
            bootstrap[cut] = state_values(self.policy, contexts, self.tok.pad_token_id).cpu()  # type: ignore[arg-type]
        return Signals(rewards, scores, kl, vals * step_mask, step_mask, beta, bootstrap), places

    def sample_ahead(self, beta: float, version: int) -> AgentBatch:
        """The next step's episodes and their rows with advantages, played by the current weights: in this process,
        or in the sampling process of `--async_rollouts` (`async_rollouts.Sampled`)."""
        # as `RLHFTrainer.step`: bf16 on a GPU that has it or with --bf16 on, the weights' copies kept while fixed
        with autocast(self.device, self.rl.bf16, weights_fixed=True):
            episodes, sampling = self.rollouts()
            batch, episode_kl, rows = self.experience(episodes, beta)
        rows.hidden = None  # read by the value head above; a batch sent or saved goes without them
        for t in (t for e in episodes for t in e.turns):
            t.hidden = None
        return AgentBatch(
            episodes, sampling, batch, episode_kl, rows, self.row_episodes, beta, version, self.clock.take()
        )

    def sampling_states(self) -> tuple[Tensor, dict[str, Any]]:
        """The states sampling draws from: torch's global generator (the tokens) and the reset seeds'."""
        return torch.get_rng_state(), self.seeds.bit_generator.state

    def set_sampling_states(self, states: tuple[Tensor, dict[str, Any]]) -> None:
        torch.set_rng_state(states[0])
        self.seeds.bit_generator.state = states[1]

    def next_batch(self) -> AgentBatch:
        """This step's batch: sampled now, or under `--async_rollouts` received from the sampling process (with
        staleness 1 played by the weights before the last update; the next one is then on its way)."""
        if not self.rl.async_rollouts:
            return self.sample_ahead(self.kl_ctl.beta, self.step_count)
        return self.ahead.next(self, self.rl.staleness, self.kl_ctl.beta)

    def close(self) -> None:
        """Stop the sampling process of `--async_rollouts` (none otherwise). A batch in flight is dropped: stepping
        on samples it afresh (a checkpoint, `state()`, receives it first and is exact)."""
        self.ahead.close()

    def step(self) -> dict[str, float]:
        t0 = time.perf_counter()
        b = self.next_batch()
        t_rollout = time.perf_counter() - t0
        episodes, rows, beta = b.episodes, b.rows, b.beta  # the batch's own beta (the step before's, sampled ahead)
        self.last_episodes, self.row_episodes = episodes, b.row_episodes
        figures = summary(episodes)
        self.all_invalid = self.all_invalid + 1 if figures["invalid_rate"] == 1.0 else 0
        if self.all_invalid >= self.agent.invalid_patience:
            raise UserError(
                f"every action of the last {self.all_invalid} steps was invalid in {self.record.name}: the policy "
                "does not write the environment's action format; train it on demonstrations first (--sft_epochs), "
                "or check the environment's action parser"
            )
        with self.clock("update"), autocast(self.device, self.rl.bf16):
            stats = self.update(b.batch, beta)
        self.step_count += 1
        mask = rows.response_mask.float()
        turns = [t for e in episodes for t in e.turns]
        metrics = {
            "step": self.step_count,
            **{f"agent/{k}": v for k, v in figures.items()},
            "objective/score": figures["return"],
            "objective/kl": b.episode_kl.mean().item(),
            "objective/beta": beta,
            "policy/entropy": masked_mean(rows.entropy, mask).item(),
            "policy/response_length": float(np.mean([len(t.reply) for t in turns])),
            "policy/length_limit": float(self.rl.max_new_tokens),
            "policy/eos_rate": float(np.mean([t.eos for t in turns])),
            "policy/distinct_2": distinct_2([t.text for t in turns]),
            **{f"ppo/{k}": v for k, v in stats.items()},
            **{f"sampling/{k}": v for k, v in b.sampling.items()},
            "time/step_s": time.perf_counter() - t0,
            **{f"time/{phase}_s": v for phase, v in {**b.phases, **self.clock.take()}.items()},
        }
        if self.rl.async_rollouts:
            metrics["time/rollout_s"] = t_rollout  # the wait for the sampler, not its phases
            metrics["policy/staleness"] = float(self.step_count - 1 - b.version)  # updates since its sampling
        metrics["time/episodes_per_s"] = len(episodes) / metrics["time/step_s"]
        self.kl_ctl.update(metrics["objective/kl"], self.rl.batch_size)
        return metrics

    def update(self, batch: RolloutBatch, beta: float) -> dict[str, float]:
        """The core's `ppo_update` on the step's turns, minibatches of whole episodes. `normalize_advantages` centres
        them over the whole step (`experience`) and does not scale them: scaled to unit variance, the critic's small
        errors become updates as strong as a real signal, per minibatch of a few episodes without a success and
        once every episode succeeds alike (measured on FrozenLake: a solved policy fell to 93% invalid replies in
        one step). Centring keeps the batch from pushing every sampled action down at once."""
        try:
            return ppo_update(
                self.policy,
                self.optimizer,
                batch,
                replace(self.ppo, normalize_advantages=False),
                progress=self.step_count / max(1, self.rl.steps),
                generator=self.update_generator,
                lr_scales=self.rl.lr_scales(self.step_count),
                policy_loss=self.algorithm.policy_loss,
                kl_loss_coef=beta if self.rl.kl_in == "loss" else 0.0,
                kl_estimator=self.rl.penalty_estimator,
                length=self.rl.max_new_tokens,
                episodes=self.row_episodes,  # minibatch_size counts episodes: the gradient steps do not grow with turns
                trim=True,  # episodes of 2 and of 20 turns share a batch: each minibatch as long as its longest
            )
        except NonFiniteUpdate as exc:
            raise UserError(f"step {self.step_count + 1}: {exc}; lower --learning_rate") from None

    def state(self) -> dict[str, Any]:
        """What `--resume` needs beside the policy's weights, as tensors and plain types (read back with
        `weights_only=True`). Every episode resets its environment with a seed drawn here, so the environments
        carry nothing across steps; a user's environment that keeps state across resets is not saved. Under
        `--async_rollouts` the batch in flight is received first (it advances the sampling RNG states) and saved, so
        a resumed run consumes the batch the uninterrupted one did."""
        pending = self.ahead.pending(self)
        return {
            "pending": None if pending is None else batch_state(pending),
            "step": self.step_count,
            "all_invalid": self.all_invalid,
            "value_head": self.policy.value_head.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "beta": float(self.kl_ctl.beta),
            "rng": {
                "torch": torch.get_rng_state(),
                "update": self.update_generator.get_state(),
                "reset_seeds": self.seeds.bit_generator.state,
            },
            "config": asdict(self.rl),
            "ppo": self.ppo.to_dict(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.step_count, self.all_invalid = int(state["step"]), int(state["all_invalid"])
        self.policy.value_head.load_state_dict(state["value_head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.kl_ctl.beta = float(state["beta"])
        torch.set_rng_state(state["rng"]["torch"])
        self.update_generator.set_state(state["rng"]["update"])
        self.seeds.bit_generator.state = state["rng"]["reset_seeds"]
        pending = state.get("pending")  # the RNG states just loaded are those after it was sampled
        self.ahead.resumed = None if pending is None else batch_from_state(pending)

    def evaluate(self, n: int, seed: int = 0, greedy: bool = True) -> tuple[dict[str, Any], list[Episode]]:
        """`n` held-out episodes (odd reset seeds: never a training episode's), greedy unless said."""
        return held_out(self.policy.lm, self.tok, self.record, self.settings, self.envs, n, seed, greedy, self.critic)
