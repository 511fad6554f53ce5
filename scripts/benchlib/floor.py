"""How far each phase of an RLHF step is from what this machine's matrix multiplies allow.

FLOPs are counted from the model's own weights, so any architecture (GPT-2, Llama, GPT-NeoX, Qwen2) is counted
the same way. A pass over `t` new tokens per sequence, `c` keys attended on average, and `h` positions whose
logits are needed costs, per sequence,

    2 * W_trunk * t  +  2 * W_head * h  +  4 * L * d * t * c

where `W_trunk` is the number of weights in the blocks' matrix multiplies (`nn.Linear` and GPT-2's `Conv1D`),
`W_head` the LM head's (d x V), `L` the layers and `d` the width (the last term: attention's QK^T and AV). Per step
of B sequences, prompt length P and reply length R:

- sampling: the prompt once (t = P, c = (P + 1) / 2, h = 1; once per group where G replies share it), then
  R - 1 decoding steps of one token each (c = P + r), each with its logits;
- the policy's and the reference's forward passes: t = P + R, c = (P + R + 1) / 2, h = R + 1 (the replies'
  log-probs; `logits_to_keep` keeps a suffix, whose last logit goes unread); where a group of G replies shares its
  prompt (RLOO, GRPO: `shares_prompts`), the prompt's part (t = P, h = 1) runs once per group and each reply's
  part (t = R, c = P + (R + 1) / 2, h = R) once per reply;
- the reward model: its own trunk on t = P + R + 1 (the reply with an EOS appended), a group's prompt once, and
  its scalar head at one position a sequence;
- the update: 3x a policy forward pass (backward is twice the forward) per sequence per epoch, prompts shared as
  in the forward passes; with a critic, its value head on each reply token, whose backward skips the detached
  features' gradient (`4 W_1 + 6 W_2` a token for its two layers).

A test runs whole steps under torch's `FlopCounterMode` and finds these counts to the FLOP, attention aside
(the counter has no formula for the CPU's fused attention kernel).

The floor of a phase is its FLOPs over the throughput the machine's matrix multiplies reach *at that phase's
shapes*, measured in the same process (`gemm_rate`: each distinct weight shape of the model, multiplied by an
activation of the phase's row count). Elementwise work (softmax, GELU, layer norm), sampling and Python are not
in the floor: the distance to it is what they, and any wasted FLOPs, cost.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers.pytorch_utils import Conv1D


@dataclass(frozen=True)
class Weights:
    """The matrix-multiply weights of a causal LM: the blocks' (`trunk`), the LM head's, and each distinct shape
    `(in, out)` with how many times one token passes through it."""

    trunk: int
    head: int
    n_layer: int
    width: int
    shapes: tuple[tuple[tuple[int, int], int], ...]


def weights(model: Any) -> Weights:
    """Count `model`'s matmul weights (a transformers causal LM or sequence classifier)."""
    head_module = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head_module is None:  # a sequence classifier: its scalar head
        head_module = getattr(model, "score", None)
    shapes: Counter[tuple[int, int]] = Counter()
    trunk = head = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            shape = (module.in_features, module.out_features)
        elif isinstance(module, Conv1D):
            shape = tuple(module.weight.shape)  # Conv1D stores (in, out)
        else:
            continue
        n = shape[0] * shape[1]
        if module is head_module:
            head += n
        else:
            trunk += n
        shapes[shape] += 1
    cfg = model.config
    return Weights(trunk, head, cfg.num_hidden_layers, cfg.hidden_size, tuple(sorted(shapes.items())))


def value_head_weights(policy: Any) -> tuple[int, int]:
    """The weights of a `PolicyWithValueHead`'s two value layers while it has a critic, else `(0, 0)`."""
    if not policy.critic:
        return (0, 0)
    first, *_, last = (m for m in policy.value_head if isinstance(m, torch.nn.Linear))
    return (first.weight.numel(), last.weight.numel())


def pass_flops(w: Weights, tokens: float, keys: float, logits: float) -> float:
    """FLOPs of one sequence's pass over `tokens` new tokens attending `keys` keys on average, with `logits`
    positions through the head (the module docstring's formula)."""
    return 2 * w.trunk * tokens + 2 * w.head * logits + 4 * w.n_layer * w.width * tokens * keys


def shared_pass_flops(w: Weights, rows: int, group: int, prompt: int, reply: int) -> float:
    """FLOPs of a forward pass over `rows` prompt + reply sequences whose groups of `group` share their prompt's
    pass (group 1: every row runs its own). The head runs on R + 1 positions a sequence: on the last R + 1 of each
    row (`logits_to_keep`: a suffix, whose last logit is not read), or where the prompt is shared, on its last
    position once per group and on each reply's R."""
    if group == 1:
        return rows * pass_flops(w, prompt + reply, (prompt + reply + 1) / 2, reply + 1)
    prompts = rows / group * pass_flops(w, prompt, (prompt + 1) / 2, 1)
    return prompts + rows * pass_flops(w, reply, prompt + (reply + 1) / 2, reply)


def phase_flops(
    policy: Weights,
    reward: Weights | None,
    batch: int,
    prompt: int,
    reply: int,
    epochs: float,
    critic: bool,
    group: int = 1,
    value_head: tuple[int, int] = (0, 0),
) -> dict[str, float]:
    """FLOPs of each phase of one step (`critic`: the policy's forward pass runs; otherwise sampling's log-probs
    are reused; `group`: replies per prompt, whose prompt sampling, the forward passes and the update run once;
    `value_head`: the weights of a critic's two layers, trained in the update)."""
    decode = sum(pass_flops(policy, 1, prompt + r, 1) for r in range(1, reply))
    forward = shared_pass_flops(policy, batch, group, prompt, reply)
    out = {
        "sample": batch / group * pass_flops(policy, prompt, (prompt + 1) / 2, 1) + batch * decode,
        "reference_forward": forward,
        "update": 3 * epochs * forward + epochs * batch * reply * (4 * value_head[0] + 6 * value_head[1]),
    }
    if critic:
        out["policy_forward"] = out["reference_forward"]
    if reward is not None:
        # The trunk reads the reply with an EOS appended (the replies here run to the limit; one that ends at EOS
        # reads one token less); the scalar head reads one position a sequence.
        trunk = shared_pass_flops(replace(reward, head=0), batch, group, prompt, reply + 1)
        out["reward"] = trunk + batch * 2 * reward.head
    return out


def gemm_rate(w: Weights, rows: int, seconds: float = 0.3) -> float:
    """FLOP/s of `rows x in @ in x out` over the model's weight shapes, each as often as a token passes it, timed
    on this machine now (torch's current thread count)."""
    mats = [(torch.randn(rows, i), torch.randn(i, o), n) for (i, o), n in w.shapes]
    flops = sum(2 * rows * a.shape[1] * b.shape[1] * n for a, b, n in mats)
    for a, b, _ in mats:  # warm up
        a @ b
    reps, t0 = 0, time.perf_counter()
    while True:
        for a, b, n in mats:
            for _ in range(n):
                a @ b
        reps += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return flops * reps / elapsed


def phase_rows(batch: int, prompt: int, reply: int, minibatch: int) -> dict[str, int]:
    """The row count of each phase's matrix multiplies (decoding: one token per sequence)."""
    t = prompt + reply
    return {
        "sample": batch,
        "policy_forward": batch * t,
        "reference_forward": batch * t,
        "reward": batch * t,
        "update": minibatch * t,
    }


def floors(
    times: dict[str, float],
    policy: Weights,
    reward: Weights | None,
    batch: int,
    prompt: int,
    reply: int,
    epochs: float,
    minibatch: int,
    critic: bool,
    group: int = 1,
    value_head: tuple[int, int] = (0, 0),
) -> dict[str, dict[str, float]]:
    """Per phase: measured seconds per step, GFLOPs, the GFLOP/s measured at its shapes, the floor in seconds and
    the distance (measured / floor)."""
    flops = phase_flops(policy, reward, batch, prompt, reply, epochs, critic, group, value_head)
    rows = phase_rows(batch, prompt, reply, minibatch)
    rates: dict[int, float] = {}
    out = {}
    for phase, f in flops.items():
        if phase not in times:
            continue
        model = reward if phase == "reward" and reward is not None else policy
        key = rows[phase] * (1 if model is policy else -1)
        if key not in rates:
            rates[key] = gemm_rate(model, rows[phase])
        floor = f / rates[key]
        out[phase] = {
            "seconds": times[phase],
            "gflops": f / 1e9,
            "gflop_per_s_at_shapes": rates[key] / 1e9,
            "floor_s": floor,
            "distance": times[phase] / floor,
        }
    return out
