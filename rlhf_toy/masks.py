"""Masked reductions shared by the losses and the trainers.

A mask is a tensor of the same shape as the data, 1 (or True) where a step is real and 0 where it is padding
(a token after EOS, or the ignored step after a vector env's autoreset).
"""

from __future__ import annotations

import torch
from torch import Tensor

Dims = int | tuple[int, ...] | None  # the dimensions a reduction runs over; None = all of them


def _sum(x: Tensor, dim: Dims, keepdim: bool) -> Tensor:
    return x.sum() if dim is None else x.sum(dim, keepdim=keepdim)


def masked_mean(x: Tensor, mask: Tensor | None = None, dim: Dims = None, keepdim: bool = False) -> Tensor:
    """Mean of `x` over the entries where `mask` is set; the plain mean when `mask` is None. Any shape.

    `dim` reduces over those dimensions only, one mean for each index of the others (a population's `[N, b]`
    with `dim=1`: one mean per agent); None reduces over all (to a scalar, whatever `keepdim`)."""
    if mask is None:
        return x.mean() if dim is None else x.mean(dim, keepdim=keepdim)
    mask = mask.to(x.dtype)
    return _sum(x * mask, dim, keepdim) / _sum(mask, dim, keepdim).clamp(min=1.0)


def masked_var(x: Tensor, mask: Tensor | None = None, dim: Dims = None, keepdim: bool = False) -> Tensor:
    """Unbiased variance of `x` over the masked entries (population variance for a single entry); `dim` and
    `keepdim` as in `masked_mean`."""
    if mask is None and dim is None:
        return x.var() if x.numel() > 1 else torch.zeros((), dtype=x.dtype)
    m = torch.ones_like(x) if mask is None else mask.to(x.dtype)
    n = _sum(m, dim, True)
    mean = _sum(x * m, dim, True) / n.clamp(min=1.0)
    var = _sum(((x - mean) ** 2) * m, dim, True) / (n - 1).clamp(min=1.0)
    return var if keepdim or dim is None else var.squeeze(dim)


def masked_whiten(
    x: Tensor, mask: Tensor | None = None, shift_mean: bool = True, eps: float = 1e-8, dim: Dims = None
) -> Tensor:
    """Normalize `x` to zero mean and unit std over the masked entries (over `dim` only, as in `masked_mean`);
    padding is left at 0.

    `shift_mean=False` scales the spread to 1 but puts the mean back (as TRL does for rewards, whose sign
    carries meaning).
    """
    mean = masked_mean(x, mask, dim, keepdim=True)
    std = masked_var(x, mask, dim, keepdim=True).sqrt()
    out = (x - mean) / (std + eps)
    if not shift_mean:
        out = out + mean
    if mask is not None:
        out = out * mask.to(x.dtype)
    return out


def last_real_index(mask: Tensor) -> Tensor:
    """`[B, L]` mask -> `[B]` index of the last real entry of each row, for left or right padding alike.

    The score of a sequence is read there (a reward model's last token), and the episode of a response ends
    there (GAE's terminal step, the reward's position). A row with no real entry gives L - 1.
    """
    L = mask.shape[1]
    return L - 1 - mask.long().flip(1).argmax(1)
