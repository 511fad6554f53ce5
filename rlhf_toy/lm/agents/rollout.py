"""Multi-turn rollouts on the lean decoding loop: a batch of episodes in lockstep, one turn at a time.

Each turn every running episode's context (the instructions, the turns of history its window keeps, the current
observation) is rendered to token ids, the batch samples one reply each (`sampling.sample` on those ids, with the
log-probs and, for a critic, the hidden states), and each environment steps on its reply's text. An episode ends
when its environment says terminated or truncated, at the turn limit (truncated), or when its next context would
not leave room for a reply (truncated: the context limit); finished episodes drop out and the rest go on.

A turn is kept as the context the agent read and the tokens it wrote: training recomputes exactly those
log-probs, whatever the history window (only the agent's tokens are trained; the environment's are context).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import Tensor

from rlhf_toy.errors import UserError, first_line

from ..algorithms.sft import PairIds
from ..models.base import context_length
from ..models.chat import BOT, USER, encode_responses
from ..models.constrain import ReplyConstraint
from ..models.sampling import sample
from .envs import TextEnv
from .registry import ALL_HISTORY


@dataclass
class Turn:
    """One turn: what the agent read and wrote, and what the environment answered."""

    context: list[int]  # the token ids the agent read
    reply: list[int]  # the tokens it wrote, EOS included when it stopped
    text: str  # the reply as text (what the environment read)
    observation: str  # the observation it answered (the last one of its context)
    reward: float = 0.0
    invalid: bool = False
    eos: bool = True
    logprobs: Tensor | None = None  # [n] the sampled tokens' log-probs at the sampling temperature
    entropy: Tensor | None = None  # [n]
    hidden: Tensor | None = None  # [n, H] the hidden states that predicted them (a critic reads them)


@dataclass
class Episode:
    """One episode: its reset seed, its turns and how it ended."""

    seed: int
    turns: list[Turn] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    success: bool = False
    next_context: list[int] | None = None  # a truncated episode's next context: its value is the bootstrap
    env_tokens: int = 0  # tokens of the environment's in the whole conversation (observations, markers)

    @property
    def total_return(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def agent_tokens(self) -> int:
        return sum(len(t.reply) for t in self.turns)


@dataclass(frozen=True)
class RolloutSettings:
    max_turns: int
    history: int  # earlier turns kept in the context (0: none, ALL_HISTORY: all)
    max_new_tokens: int
    temperature: float = 1.0
    constraint: ReplyConstraint | None = None  # --constrain_actions: only the environment's actions are drawn


def user_text(instructions: str, observation: str, first: bool) -> str:
    return f"{instructions}\n{observation}" if first and instructions else observation


def render_context(
    tok,
    instructions: str,
    past: list[tuple[str, list[int], str]],
    observation: str,
    history: int,
    tools: list[dict] | None = None,
):
    """Token ids of what the agent reads: `past` turns as (observation, reply ids, reply text), the last `history`
    of them kept (ALL_HISTORY: all), then the current `observation`; the instructions open the first kept user
    message. This project's format: `<|user|>obs<|bot|>reply<|eos|>...<|user|>obs<|bot|>` with the replies' own
    tokens; a tokenizer with a chat template renders the same messages with it, and the environment's `tools`
    (JSON schemas, as transformers' `get_json_schema` gives them) where the template shows tools."""
    kept = past if history == ALL_HISTORY else past[len(past) - history :] if history else []
    if getattr(tok, "chat_template", None):
        messages: list[dict[str, str]] = []
        for i, (obs, _, text) in enumerate(kept):
            messages += [{"role": "user", "content": user_text(instructions, obs, i == 0)}]
            messages += [{"role": "assistant", "content": text}]
        messages.append({"role": "user", "content": user_text(instructions, observation, not kept)})
        rendered = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        return tok.encode(rendered, add_special_tokens=False)
    ids: list[int] = []
    for i, (obs, reply, _) in enumerate(kept):
        ids += tok.encode(f"{USER}{user_text(instructions, obs, i == 0)}{BOT}") + reply
    return ids + tok.encode(f"{USER}{user_text(instructions, observation, not kept)}{BOT}")


def env_tools(env: TextEnv) -> list[dict] | None:
    """The tools an environment declares (`TextEnv.tools`: JSON schemas), for a chat template that shows them."""
    return getattr(env, "tools", None) or None


def env_failure(name: str, turn: int, seed: int, what: str) -> UserError:
    return UserError(f"environment {name}, episode seed {seed}, turn {turn}: {what}; fix the environment")


def checked_reset(env: TextEnv, seed: int, name: str) -> str:
    """`env.reset(seed=seed)`'s observation, or one `UserError` naming the environment."""
    try:
        out = env.reset(seed=seed)
    except Exception as exc:  # a user's environment: any failure is theirs, named with where it happened
        raise env_failure(name, 0, seed, f"reset raised {type(exc).__name__}: {first_line(exc)}") from None
    if not (isinstance(out, tuple) and len(out) == 2):
        raise env_failure(name, 0, seed, f"reset must return (observation, info), not {type(out).__name__}")
    if not isinstance(out[0], str):
        raise env_failure(name, 0, seed, f"the observation must be a string, not {type(out[0]).__name__}")
    return out[0]


def checked_step(env: TextEnv, action: str, name: str, turn: int, seed: int) -> tuple[str, float, bool, bool, dict]:
    """`env.step(action)` checked: a string observation, a finite reward, two flags, an info dict."""
    try:
        out = env.step(action)
    except Exception as exc:
        raise env_failure(name, turn, seed, f"step raised {type(exc).__name__}: {first_line(exc)}") from None
    if not (isinstance(out, tuple) and len(out) == 5):
        raise env_failure(name, turn, seed, "step must return (observation, reward, terminated, truncated, info)")
    obs, reward, terminated, truncated, info = out
    if not isinstance(obs, str):
        raise env_failure(name, turn, seed, f"the observation must be a string, not {type(obs).__name__}")
    try:
        reward = float(reward)
    except (TypeError, ValueError):
        raise env_failure(name, turn, seed, f"the reward must be a number, not {reward!r}") from None
    if not math.isfinite(reward):
        raise env_failure(name, turn, seed, f"the reward is {reward}")
    return obs, reward, bool(terminated), bool(truncated), dict(info or {})


def run_episodes(
    model,
    tok,
    envs: list[TextEnv],
    seeds: list[int],
    instructions: str,
    settings: RolloutSettings,
    name: str,
    greedy: bool = False,
    with_hidden: bool = False,
) -> list[Episode]:
    """Play one episode in each of `envs` (reset with `seeds`), in lockstep, sampling with torch's global RNG."""
    limit = context_length(model.config)
    tools = env_tools(envs[0])
    episodes = [Episode(seed) for seed in seeds]
    observations = [checked_reset(env, seed, name) for env, seed in zip(envs, seeds)]
    past: list[list[tuple[str, list[int], str]]] = [[] for _ in envs]
    active = list(range(len(envs)))
    for turn in range(settings.max_turns):
        contexts = {
            i: render_context(tok, instructions, past[i], observations[i], settings.history, tools) for i in active
        }
        for i in list(active):
            if len(contexts[i]) + settings.max_new_tokens > limit:
                if turn == 0:
                    raise UserError(
                        f"environment {name}: the first observation is {len(contexts[i])} tokens, and a reply of "
                        f"{settings.max_new_tokens} does not fit the model's context of {limit}; shorten the "
                        "observation or use a model with a longer context (--n_positions)"
                    )
                # The context limit: cut here; the value of what the agent would read is the bootstrap.
                episodes[i].truncated, episodes[i].next_context = True, contexts[i][-(limit - 1) :]
                active.remove(i)
        if not active:
            break
        s = sample(
            model,
            tok,
            [observations[i] for i in active],
            settings.max_new_tokens,
            settings.temperature,
            with_logprobs=True,
            greedy=greedy,
            with_hidden=with_hidden,
            prompt_ids=[contexts[i] for i in active],
            constraint=settings.constraint,
        )
        lengths = s.response_mask.sum(1).tolist()
        still = []
        for j, i in enumerate(active):
            n = int(lengths[j])
            reply = s.response_ids[j, :n].tolist()
            obs, reward, terminated, truncated, info = checked_step(envs[i], s.texts[j], name, turn + 1, seeds[i])
            episodes[i].turns.append(
                Turn(
                    contexts[i],
                    reply,
                    s.texts[j],
                    observations[i],
                    reward,
                    bool(info.get("invalid", False)),
                    bool(s.eos[j]),
                    s.logprobs[j, :n] if s.logprobs is not None else None,
                    s.entropy[j, :n] if s.entropy is not None else None,
                    s.hidden[j, :n] if s.hidden is not None else None,
                )
            )
            past[i].append((observations[i], reply, s.texts[j]))
            observations[i] = obs
            ep = episodes[i]
            if terminated or truncated or turn == settings.max_turns - 1:
                ep.terminated, ep.truncated = terminated, not terminated
                ep.success = bool(info.get("success", False))
                if ep.truncated:
                    context = render_context(tok, instructions, past[i], obs, settings.history, tools)
                    ep.next_context = context[-(limit - 1) :]
            else:
                still.append(i)
        active = still
    for i, ep in enumerate(episodes):
        whole = render_context(tok, instructions, past[i], observations[i], ALL_HISTORY, tools)
        ep.env_tokens = len(whole) - ep.agent_tokens
    return episodes


@dataclass
class DemoEpisode:
    """A demonstrator's episode as text: (observation, action) per turn."""

    seed: int
    steps: list[tuple[str, str]]
    total_return: float
    success: bool


class NoDemonstrator(UserError):
    """The environment has no such demonstrator (a game without a scripted policy, a walker, ...)."""


def demo_action(env: TextEnv, demonstrator: str, episode: int, rng: np.random.Generator) -> str:
    """The demonstrator's action in `env`'s current state (half-tool: the scripted one in even episodes, a direct
    answer in odd ones); `NotImplementedError` where the environment has no such policy."""
    if demonstrator == "random":
        return env.random_action(rng)
    if demonstrator == "walker":
        return env.walker_action(rng)
    if demonstrator == "scripted" or episode % 2 == 0:
        return env.scripted_action()
    if hasattr(env, "direct_action"):
        return env.direct_action()
    raise NotImplementedError(f"{type(env).__name__} has no direct_action")


def demonstrate(
    env: TextEnv, seeds: list[int], demonstrator: str, max_turns: int, name: str, rng: np.random.Generator
) -> list[DemoEpisode]:
    """Episodes of the demonstrator (`registry.DEMONSTRATORS`): random actions, the scripted policy, a walker (a
    weak policy that reads the state: FrozenLake's), or (the calculator) the scripted tool user in even episodes and
    a direct right answer in odd ones. A demonstrator the environment does not have raises `NoDemonstrator`."""
    out = []
    for k, seed in enumerate(seeds):
        obs = checked_reset(env, seed, name)
        steps, total, success = [], 0.0, False
        for turn in range(max_turns):
            try:
                action = demo_action(env, demonstrator, k, rng)
            except NotImplementedError as exc:
                raise NoDemonstrator(
                    f"environment {name}: the {demonstrator} demonstrator is not available ({exc}); choose another "
                    "--demonstrator (random draws from the environment's actions)"
                ) from None
            nxt, reward, terminated, truncated, info = checked_step(env, action, name, turn + 1, seed)
            steps.append((obs, action))
            total, obs = total + reward, nxt
            if terminated or truncated:
                success = bool(info.get("success", False))
                break
        out.append(DemoEpisode(seed, steps, total, success))
    return out


def chains(turns: list[tuple[list[int], list[int]]]) -> bool:
    """Whether each `(context, reply)` turn's context begins with the previous turn's context and reply (the whole
    history, token for token)."""
    return all(c[: len(p) + len(r)] == p + r for (p, r), (c, _) in zip(turns, turns[1:]))


def packed(turns: list[tuple[list[int], list[int]]]) -> tuple[list[int], list[int], list[int]]:
    """Chained `(context, reply)` turns as one row: `(the first context, every reply and observation after it, each
    turn's reply offset in that)`."""
    first, (last, reply) = turns[0][0], turns[-1]
    return first, (last + reply)[len(first) :], [len(c) - len(first) for c, _ in turns]


def demo_pairs(
    tok,
    demos: list[DemoEpisode],
    instructions: str,
    history: int,
    tools: list[dict] | None = None,
    limit: int | None = None,
) -> PairIds:
    """The SFT pairs of the demonstrations, rendered as the agent will read them: per demonstrated turn `(context
    ids, reply ids + EOS)`; or, for an episode whose every context extends the one before (the whole history, token
    for token) and that fits `limit` tokens, one row (its first context, then every reply and observation, the
    replies marked as trained; `sft.PairIds`), so the history is run once, not once a turn. The loss is the same
    mean over reply tokens either way, and a batch counts the replies it trains (`sft.batch_indices`)."""
    pairs: PairIds = []
    for d in demos:
        past: list[tuple[str, list[int], str]] = []
        turns = []
        for obs, action in d.steps:
            reply = encode_responses(tok, [action])[0]
            turns.append((render_context(tok, instructions, past, obs, history, tools), reply))
            past.append((obs, reply, action))
        if not turns:
            continue
        if len(turns) > 1 and chains(turns) and (limit is None or sum(map(len, turns[-1])) <= limit):
            prompt, response, offsets = packed(turns)
            trained = [0] * len(response)
            for (_, r), o in zip(turns, offsets):
                trained[o : o + len(r)] = [1] * len(r)
            pairs.append((prompt, response, trained))
        else:
            pairs += turns
    return pairs


def summary(episodes: list[Episode]) -> dict[str, Any]:
    """The agent's figures over episodes: success, return, turns, invalid actions, the environment's token share."""
    turns = [len(e.turns) for e in episodes]
    n_turns = max(1, sum(turns))
    env_tokens = sum(e.env_tokens for e in episodes)
    agent_tokens = sum(e.agent_tokens for e in episodes)
    return {
        "success": float(np.mean([e.success for e in episodes])),
        "return": float(np.mean([e.total_return for e in episodes])),
        "return_std": float(np.std([e.total_return for e in episodes])),
        "turns": float(np.mean(turns)),
        "invalid_rate": sum(t.invalid for e in episodes for t in e.turns) / n_turns,
        "truncated": float(np.mean([e.truncated for e in episodes])),
        "env_token_share": env_tokens / max(1, env_tokens + agent_tokens),
    }
