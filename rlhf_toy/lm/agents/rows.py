"""An agent's turns as the rows the core trains on, and where each turn sits in its row and in its episode.

Two layouts, one objective. A turn is the context the agent read and the reply it wrote. Per turn, each turn is a
row `(context, reply)`: an episode of T turns with the whole history in its context processes its prefix T times
(quadratic in the turns). Packed, an episode whose every context extends the one before (the previous context,
the previous reply, then the environment's tokens: the whole history) is one row: its first context as the
prompt, then every reply and observation after it as the response, with the agent's tokens marked in the mask
(as TRL's environment loop keeps a rollout). The forward passes give the same log-probs either way (to float
rounding), so where the loss is a mean over the agent's tokens (loss aggregation "token", ratios per token),
packing changes the cost and not the objective; the trainer packs only then (`AgentTrainer.packs`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..models.chat import pad_sequences
from ..models.sampling import Samples
from .rollout import Episode, Turn, chains, packed


class Segment(NamedTuple):
    """Where `turn`'s reply sits in the rows: row `row`, response positions `span` (from `offset`)."""

    row: int
    offset: int
    turn: Turn

    @property
    def span(self) -> slice:
        return slice(self.offset, self.offset + len(self.turn.reply))


def chained(e: Episode) -> bool:
    """Whether each turn's context begins with the previous turn's context and reply (the whole history, token
    for token)."""
    return chains([(t.context, t.reply) for t in e.turns])


def row_specs(episodes: list[Episode], pack: bool) -> list[tuple[list[int], list[int], list[tuple[Turn, int]]]]:
    """`(prompt ids, response ids, [(turn, offset in the response)])` per row: an episode packed into one row where
    `pack` and it is `chained`, else one row per turn."""
    specs = []
    for e in episodes:
        if pack and len(e.turns) > 1 and chained(e):
            prompt, response, offsets = packed([(t.context, t.reply) for t in e.turns])
            specs.append((prompt, response, list(zip(e.turns, offsets))))
        else:
            specs += [(t.context, t.reply, [(t, 0)]) for t in e.turns]
    return specs


def rows_of(episodes: list[Episode], tok, pack: bool = False) -> tuple[Samples, list[Segment]]:
    """The rows of `episodes` (`row_specs`) as tensors: prompts left-padded `[N, P]`, responses right-padded `[N, R]`
    with the sampled log-probs, entropies and hidden states at the agent's tokens (0 elsewhere) and the mask 1 on
    them only; and each turn's `Segment`, turns in order (episode by episode)."""
    specs = row_specs(episodes, pack)
    ctx, ctx_mask = pad_sequences([p for p, _, _ in specs], tok.pad_token_id, "left")
    response, _ = pad_sequences([r for _, r, _ in specs], tok.pad_token_id, "right")
    N, R = response.shape
    mask = torch.zeros(N, R, dtype=torch.long)
    logprobs, entropy = torch.zeros(N, R), torch.zeros(N, R)
    turns = [t for _, _, placed in specs for t, _ in placed]
    hidden = None
    if turns and all(t.hidden is not None for t in turns):
        hidden = torch.zeros(N, R, turns[0].hidden.shape[-1], dtype=turns[0].hidden.dtype)  # type: ignore[union-attr]
    segments = []
    for r, (_, _, placed) in enumerate(specs):
        for t, o in placed:
            seg = Segment(r, o, t)
            mask[r, seg.span] = 1
            if t.logprobs is not None:
                logprobs[r, seg.span] = t.logprobs.float()
            if t.entropy is not None:
                entropy[r, seg.span] = t.entropy.float()
            if hidden is not None:
                hidden[r, seg.span] = t.hidden  # type: ignore[index]
            segments.append(seg)
    samples = Samples(
        [t.observation for _, _, placed in specs for t, _ in placed[:1]],
        ctx,
        ctx_mask,
        response,
        mask,
        torch.tensor([placed[-1][0].eos for _, _, placed in specs]),
        [" ".join(t.text for t, _ in placed) for _, _, placed in specs],
        logprobs,
        entropy,
        hidden,
    )
    return samples, segments


def episode_layout(episodes: list[Episode], credit: str) -> tuple[list[tuple[int, int, int, int]], int]:
    """Where each turn sits in its episode's sequence: `(episode, start, length, turn)` per turn and the sequence
    length. "turn": a turn is one step (length 1); "token": its reply's tokens, one after another."""
    places, width = [], 1
    for b, e in enumerate(episodes):
        pos = 0
        for t, turn in enumerate(e.turns):
            n = 1 if credit == "turn" else len(turn.reply)
            places.append((b, pos, n, t))
            pos += n
        width = max(width, pos)
    return places, width
