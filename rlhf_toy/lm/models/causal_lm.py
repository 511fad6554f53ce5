"""The tiny GPT-2 policy model, and log-probs of response tokens under any causal LM (GPT-2, Llama, GPT-NeoX,
Qwen2, ...: every one takes `position_ids`).

Conventions that matter (each is a known RLHF implementation detail):
- dropout is off everywhere, so a forward pass is a deterministic function of the weights;
- prompts are LEFT-padded and position ids come from the attention mask, `cumsum(mask) - 1`: GPT-2 does
  not derive them itself, and without them a padded prompt is read differently from an unpadded one;
- log-probs count response tokens only, EOS included.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from rlhf_toy.config import check, option

from .hf import model_device


@dataclass
class ModelConfig:
    """Size of the tiny GPT-2 (the defaults give about 0.9M parameters with a 1k vocabulary)."""

    n_layer: int = option("Transformer blocks.", 4)
    n_embd: int = option("Width of the residual stream.", 128)
    n_head: int = option("Attention heads.", 4)
    n_positions: int = option("Context length in tokens (prompt + response + EOS).", 64)

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_embd", "n_head", "n_positions"):
            check(getattr(self, name) >= 1, name, getattr(self, name), ">= 1")
        check(self.n_embd % self.n_head == 0, "n_embd", self.n_embd, f"a multiple of n_head ({self.n_head})")


def new_causal_lm(tok, cfg: ModelConfig, seed: int = 0):
    """A freshly initialised GPT-2 with `tok`'s vocabulary and special tokens, dropout off."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tok), n_positions=cfg.n_positions, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
                        n_head=cfg.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        # GPT-2's tanh GELU, as one fused op instead of GPT-2's default chain of Python ops.
                        activation_function="gelu_pytorch_tanh",
                        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return GPT2LMHeadModel(config).eval()


def position_ids(attention_mask: Tensor) -> Tensor:
    """`[B, L]` mask -> `[B, L]` positions counting real tokens only (left padding starts at 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """Logits `[..., V]` divided by `temperature` -> the log-probs of `tokens [...]` and the entropies, `[...]` each
    (in float32 whatever the logits' dtype)."""
    log_pi = F.log_softmax(logits.float() / temperature, -1)
    return log_pi.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), -(log_pi.exp() * log_pi).sum(-1)


_KEEPS_LOGITS: dict[type, bool] = {}


def keeps_logits(model) -> bool:
    """Whether the model's forward takes `logits_to_keep` (transformers' causal LMs do; a PEFT model passes it
    on to the model it wraps)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if type(base) not in _KEEPS_LOGITS:
        _KEEPS_LOGITS[type(base)] = "logits_to_keep" in inspect.signature(base.forward).parameters
    return _KEEPS_LOGITS[type(base)]


def response_logprobs(model, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                      temperature: float = 1.0, return_hidden: bool = False):
    """Log-probs of the response tokens under `model`, logits divided by `temperature`.

    `prompt_ids/prompt_mask [B, P]` left-padded; `response_ids [B, R]` (any value after EOS).
    Returns `logprobs [B, R]`, `entropy [B, R]` (and the last hidden states at the positions that predict
    each response token, `[B, R, H]`, if `return_hidden`).
    """
    device = model_device(model)
    ids = torch.cat([prompt_ids, response_ids], 1).to(device)
    mask = torch.cat([prompt_mask, torch.ones_like(response_ids)], 1).to(device)
    P, R = prompt_ids.shape[1], response_ids.shape[1]
    # Only the last R + 1 positions' logits are needed: the LM head skips the prompt (for a real vocabulary,
    # 49k for SmolLM2, that is most of a [B, P + R, V] tensor). Models without the argument give them all.
    keep = {"logits_to_keep": R + 1} if keeps_logits(model) else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask),
                output_hidden_states=return_hidden, **keep)
    # position t predicts token t + 1: positions P - 1 ... P + R - 2, the same slice whichever logits came back
    logprobs, entropy = token_logprobs(out.logits[:, -(R + 1):-1], response_ids, temperature)
    if return_hidden:
        return logprobs, entropy, out.hidden_states[-1][:, P - 1: P + R - 1]
    return logprobs, entropy
