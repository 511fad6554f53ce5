"""Which layers of a transformer train: the top blocks of a trunk (`--trainable_layers`), the rest frozen."""

from __future__ import annotations

import torch

from rlhf_toy.errors import UserError


def transformer_blocks(trunk) -> torch.nn.ModuleList:
    """The trunk's list of transformer blocks (`h` in GPT-2, `layers` in Llama, GPT-NeoX and Qwen2)."""
    for name in ("layers", "h", "blocks"):
        blocks = getattr(trunk, name, None)
        if isinstance(blocks, torch.nn.ModuleList):
            return blocks
    raise UserError(f"cannot find the transformer blocks of a {type(trunk).__name__}; pass --trainable_layers -1")


def freeze_below(trunk, n_top: int) -> None:
    """Freeze the trunk except its top `n_top` blocks and the final norm after them (the head is not in it)."""
    blocks = transformer_blocks(trunk)
    trunk.requires_grad_(False)
    for block in list(blocks)[len(blocks) - n_top :] if n_top > 0 else []:
        block.requires_grad_(True)
    if n_top > 0:  # the final norm reads the top block's output
        for name, module in trunk.named_children():
            if "norm" in name or name == "ln_f":
                module.requires_grad_(True)
