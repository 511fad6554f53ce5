"""The reward model: a transformer with a scalar head (`AutoModelForSequenceClassification`, one label).

- The score is read at the last real token of prompt + response + EOS (left or right padding alike).
- Dropout is off (inherited from the SFT config).
- Scores are normalized so that reference (SFT) samples have mean 0 and std 1; the two numbers live in the
  saved config (`reward_mean`, `reward_std`), so a plain `from_pretrained` + `score()` reproduces them.
- Any architecture with a sequence-classification head works (GPT-2, Llama, GPT-NeoX, Qwen2: the trunk is the
  model's `base_model_prefix` attribute, the head its `score`).
- A reward model that shares the policy's tokenizer reads the generated token ids as they are; one with its
  own tokenizer (the usual real setup) reads the decoded text, re-encoded with its tokenizer (`RewardModel`).
Training (Bradley-Terry) is in `rlhf_toy.lm.algorithms.reward`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import AutoModelForSequenceClassification

from rlhf_toy.errors import UserError
from rlhf_toy.masks import last_real_index

from .causal_lm import distinct_prompts, position_ids, run_on_shared_prompts, takes_cache
from .chat import check_tokenizer_matches, encode_prompts, encode_responses, load_tokenizer, pad_sequences
from .checkpoints import from_pretrained
from .devices import model_device


def reward_model_from(model_dir: str | Path, tok, what: str = "SFT"):
    """A scalar-head model whose trunk is the causal LM's in `model_dir` (the head starts untrained)."""
    rm = from_pretrained(AutoModelForSequenceClassification, Path(model_dir), what, num_labels=1)
    rm.config.pad_token_id = tok.pad_token_id
    return rm


def trunk_and_head(rm) -> tuple[Any, Any]:
    """The transformer trunk and the scalar head of a sequence classifier (LoRA-wrapped or not)."""
    core = rm.get_base_model() if hasattr(rm, "get_base_model") else rm
    return getattr(core, core.base_model_prefix), core.score


def raw_scores(rm, ids: Tensor, mask: Tensor) -> Tensor:
    """Unnormalized scalar scores `[B]` read at the last real token."""
    trunk, head = trunk_and_head(rm)
    device = model_device(rm)
    ids, mask = ids.to(device), mask.to(device)
    hidden = trunk(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).last_hidden_state
    last = hidden[torch.arange(ids.shape[0], device=device), last_real_index(mask)]
    return head(last).squeeze(-1).float()


class Scorer(torch.nn.Module):
    """`raw_scores` as a module's forward, for `DistributedDataParallel` (which syncs gradients on forward)."""

    def __init__(self, rm) -> None:
        super().__init__()
        self.rm = rm

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        return raw_scores(self.rm, ids, mask)


def normalize(rm, scores: Tensor) -> Tensor:
    return (scores - getattr(rm.config, "reward_mean", 0.0)) / getattr(rm.config, "reward_std", 1.0)


def encode_texts(tok, prompts: list[str], responses: list[str]) -> tuple[Tensor, Tensor]:
    """prompt + response + EOS, left-padded: `(ids [B, L], mask [B, L])`."""
    seqs = [p + r for p, r in zip(encode_prompts(tok, prompts), encode_responses(tok, responses))]
    return pad_sequences(seqs, tok.pad_token_id, "left")


@torch.no_grad()
def score_texts(rm, tok, prompts: list[str], responses: list[str], batch_size: int = 256) -> Tensor:
    """Normalized reward-model scores of (prompt, response) texts: `[B]`."""
    out = []
    for s in range(0, len(prompts), batch_size):
        ids, mask = encode_texts(tok, prompts[s : s + batch_size], responses[s : s + batch_size])
        out.append(normalize(rm, raw_scores(rm, ids, mask)).cpu())
    return torch.cat(out) if out else torch.zeros(0)


@torch.no_grad()
def score_token_ids(
    rm, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor, eos_id: int, pad_id: int
) -> Tensor:
    """Normalized scores `[B]` of generated tokens as they are (no decode/re-encode round trip).

    A response cut at the length limit gets an EOS appended, so the reward model always reads the input shape
    it was trained on. Replies to the same prompt (RLOO's and GRPO's groups) share the prompt's forward pass
    where the model allows it (`shared_prompt_scores`).
    """
    trunk, _ = trunk_and_head(rm)
    mask = response_mask.bool()
    if takes_cache(trunk) and bool((mask[:, 1:] <= mask[:, :-1]).all()):  # masks cut after EOS
        first, index = distinct_prompts(prompt_ids, prompt_mask)
        if len(first) < len(prompt_ids):
            return normalize(
                rm, shared_prompt_scores(rm, prompt_ids, prompt_mask, response_ids, mask, first, index, eos_id, pad_id)
            )
    seqs = []
    for p, pm, r, rm_ in zip(prompt_ids.tolist(), prompt_mask.tolist(), response_ids.tolist(), response_mask.tolist()):
        resp = [t for t, keep in zip(r, rm_) if keep]
        if not resp or resp[-1] != eos_id:
            resp.append(eos_id)
        seqs.append([t for t, keep in zip(p, pm) if keep] + resp)
    ids, mask = pad_sequences(seqs, pad_id, "left")
    return normalize(rm, raw_scores(rm, ids, mask))


def shared_prompt_scores(
    rm,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    mask: Tensor,
    first: Tensor,
    index: Tensor,
    eos_id: int,
    pad_id: int,
) -> Tensor:
    """`raw_scores` of prompt + reply + EOS, each distinct prompt `prompt_ids[first]` run once
    (`causal_lm.run_on_shared_prompts`): the replies `[B, R]` (kept where `mask [B, R]`, a prefix of each row) then
    run on their prompt's repeated KV cache, right-padded, and the score is read at each reply's last token."""
    trunk, head = trunk_and_head(rm)
    device = model_device(rm)
    prompt_ids, prompt_mask, response_ids, mask = (t.to(device) for t in (prompt_ids, prompt_mask, response_ids, mask))
    B, R = response_ids.shape
    lengths = mask.sum(1)
    last = response_ids.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)
    needs_eos = (lengths == 0) | (last != eos_id)
    tail = torch.cat([torch.where(mask, response_ids, pad_id), torch.full((B, 1), pad_id, device=device)], 1)
    tail[needs_eos, lengths[needs_eos]] = eos_id
    tail_lengths = lengths + needs_eos.long()
    tail_mask = (torch.arange(R + 1, device=device) < tail_lengths[:, None]).long()
    _, out = run_on_shared_prompts(trunk, prompt_ids, prompt_mask, tail, tail_mask, first, index)
    hidden = out.last_hidden_state[torch.arange(B, device=device), tail_lengths - 1]
    return head(hidden).squeeze(-1).float()


def same_tokenizer(a, b) -> bool:
    return a.get_vocab() == b.get_vocab() and a.eos_token_id == b.eos_token_id


@dataclass
class RewardModel:
    """A trained reward model with its own tokenizer, and how it reads the policy's replies.

    `reads_ids`: it shares the policy's tokenizer and scores the generated token ids as they are (exactly the
    tokens the policy produced); otherwise it scores the decoded text, re-encoded with its own tokenizer.
    """

    model: Any
    tok: Any
    reads_ids: bool

    @classmethod
    def for_policy(cls, model, rm_tok, policy_tok, reads: str = "auto") -> RewardModel:
        """`reads`: auto (token ids when the tokenizers agree, else text), ids, or text."""
        same = same_tokenizer(rm_tok, policy_tok)
        if reads == "ids" and not same:
            raise UserError(
                "the reward model's tokenizer differs from the policy's, so it cannot read the policy's "
                "token ids; pass --reward_reads text (or auto)"
            )
        return cls(model.eval().requires_grad_(False), rm_tok, same if reads == "auto" else reads == "ids")

    @torch.no_grad()
    def score_texts(self, prompts: list[str], responses: list[str]) -> Tensor:
        return score_texts(self.model, self.tok, prompts, responses)

    @torch.no_grad()
    def score_samples(self, s, policy_tok) -> Tensor:
        """Normalized scores `[B]` of sampled replies (`Samples`), on the CPU."""
        if self.reads_ids:
            return score_token_ids(
                self.model,
                s.prompt_ids.cpu(),
                s.prompt_mask.cpu(),
                s.response_ids.cpu(),
                s.response_mask.cpu(),
                policy_tok.eos_token_id,
                policy_tok.pad_token_id,
            ).cpu()
        return self.score_texts(s.prompts, s.texts).cpu()


MIN_NORM_STD = 0.05  # below this, scores barely vary: dividing by their std would blow rewards up


@torch.no_grad()
def set_normalization(rm, tok, prompts: list[str], responses: list[str]) -> tuple[float, float]:
    """Make reference samples score mean 0, std 1 (stored in the config, saved with the model).

    If their scores barely vary (std < MIN_NORM_STD) only the mean is removed: the raw scale is kept rather
    than multiplied by up to 1 / std.
    """
    rm.config.reward_mean, rm.config.reward_std = 0.0, 1.0
    s = score_texts(rm, tok, prompts, responses)
    mean, std = float(s.mean()), float(s.std()) if len(s) > 1 else 0.0
    if not std >= MIN_NORM_STD:
        std = 1.0
    rm.config.reward_mean, rm.config.reward_std = mean, std
    return mean, std


def load_reward_model(path: str | os.PathLike[str], policy_tok, reads: str = "auto"):
    """The scalar-head reward model in `path` with its own tokenizer, as a `RewardModel` that reads the policy's
    token ids when the tokenizers agree (`reads="auto"`), or the decoded text."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise UserError(f"no reward model in {path}; run the 'reward' stage first (or pass the right --run_dir)")
    rm_tok = load_tokenizer(path)
    model = from_pretrained(AutoModelForSequenceClassification, path, "reward")
    check_tokenizer_matches(rm_tok, model, "reward model")
    return RewardModel.for_policy(model, rm_tok, policy_tok, reads)
