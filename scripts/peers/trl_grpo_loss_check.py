#!/usr/bin/env python
"""Check that each GRPO-family loss of rlhf-toy equals TRL's ``GRPOTrainer`` loss on identical tensors.

Verification harness, not product code, and not part of CI (it needs TRL, which pins its own versions). For each
variant it builds a real ``trl.GRPOTrainer`` (tiny GPT-2, built offline) with the matching ``loss_type`` /
``importance_sampling_level`` / ``epsilon`` / ``epsilon_high`` / ``beta``, hands its ``_compute_loss`` fixed
per-token log-probs (its ``_get_per_token_logps_and_entropies`` returns them, so no model runs), and compares the
loss and its gradient with respect to those log-probs against rlhf-toy's ``minibatch_loss`` with the variant's
preset on the same tensors: log-probs, old log-probs (off-policy, as after one minibatch step), reference log-probs,
advantages and a completion mask with replies of different lengths.

| rlhf-toy | TRL GRPOConfig |
| --- | --- |
| grpo (`--kl_in loss`, k3) | loss_type="grpo", beta |
| dr_grpo (`--kl_in loss`, k3) | loss_type="dr_grpo", beta, max_completion_length |
| dapo | loss_type="dapo", epsilon_high=0.28, beta=0 (DAPO drops the KL) |
| gspo (`--kl_in loss`, k3) | loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4 |

TRL 1.16 multiplies the KL term by the importance ratio by default (``use_bias_correction_kl``, after DeepSeek-V3.2);
rlhf-toy's KL term is DeepSeekMath's plain k3 (or k2), so the check turns that off. With it on, the losses differ
only when beta > 0, by beta x the KL term's (ratio - 1) weighting.

TRL's "dapo" divides by ``num_items_in_batch`` (the generation batch's tokens) scaled to one accumulation window;
with one minibatch per generation batch that is the minibatch's token count, rlhf-toy's token-level mean.

Usage (its own venv, as the other peer runners):
    python3 -m venv .venv-trl-new && .venv-trl-new/bin/pip install torch==2.13.0 && \\
        .venv-trl-new/bin/pip install "trl==1.16.0" transformers datasets accelerate "torch<2.14"
    .venv-trl-new/bin/python scripts/peers/trl_grpo_loss_check.py
Prints one line per variant and exits 1 if any differs by more than 1e-6 (loss) or 1e-6 (gradient, max abs).
"""

import os
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # rlhf_toy from this checkout (torch only)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_common import build_tokenizer, configure, quiet_libraries, tiny_gpt2_config  # noqa: E402

configure(1)

import torch  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import GPT2LMHeadModel  # noqa: E402

from rlhf_toy.lm.algorithms.online import ALGORITHMS  # noqa: E402
from rlhf_toy.ppo import RolloutBatch, minibatch_loss  # noqa: E402

quiet_libraries(False, Warning)

B, G, T, MAX_LEN, BETA = 8, 4, 6, 10, 0.04
VARIANTS = {  # rlhf-toy record -> (TRL GRPOConfig settings, rlhf-toy beta in the loss)
    "grpo": ({"loss_type": "grpo", "beta": BETA}, BETA),
    "dr_grpo": ({"loss_type": "dr_grpo", "beta": BETA}, BETA),
    "dapo": ({"loss_type": "dapo", "beta": 0.0, "epsilon_high": 0.28}, 0.0),
    "gspo": (
        {
            "loss_type": "grpo",
            "beta": BETA,
            "importance_sampling_level": "sequence",
            "epsilon": 3e-4,
            "epsilon_high": 4e-4,
        },
        BETA,
    ),
}


def tensors(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 3, 1, 5, 2, 6, 4, 1])
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    logps = -torch.rand(B, T, generator=g) * 3
    old = logps + 0.15 * torch.randn(B, T, generator=g)  # off-policy: some ratios leave the clip range
    ref = logps + 0.3 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    return logps * mask, old * mask, ref * mask, adv, mask


def trl_loss(tmp: str, settings: dict, logps, old, ref, adv, mask):
    tokenizer = build_tokenizer(os.path.join(tmp, "tok"), random.Random(0), 300)
    path = os.path.join(tmp, "policy")  # TRL loads its reference model (beta > 0) from the policy's path
    GPT2LMHeadModel(tiny_gpt2_config(tokenizer, 64, 32, 1, 2)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    model = GPT2LMHeadModel.from_pretrained(path)
    args = trl.GRPOConfig(
        output_dir=os.path.join(tmp, "out"),
        per_device_train_batch_size=B,
        num_generations=G,
        max_completion_length=MAX_LEN,
        report_to="none",
        use_cpu=True,
        use_bias_correction_kl=False,  # DeepSeekMath's k3 term, as rlhf-toy (TRL 1.16's default weights it)
        **settings,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=lambda prompts, completions, **kw: [0.0] * len(prompts),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["a"] * B}),
        processing_class=tokenizer,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    x = logps.clone().requires_grad_(True)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (x, torch.zeros_like(x), None)
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": adv,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        # one accumulation window = the whole generation batch: the normalizer is its token count
        "num_items_in_batch": mask.sum() * args.steps_per_generation,
    }
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), x.grad


def our_loss(name: str, beta: float, logps, old, ref, adv, mask):
    preset = ALGORITHMS[name].preset
    x = logps.clone().requires_grad_(True)
    mb = RolloutBatch(None, None, old, torch.zeros(B, T), adv[:, None] * mask, torch.zeros(B, T), mask, ref)
    loss, _ = minibatch_loss(
        x, torch.zeros(B, T), torch.zeros(B, T), mb, preset, preset.clip_range, "clipped", beta, None, "k3", MAX_LEN
    )
    loss.backward()
    return loss.detach(), x.grad


def main() -> int:
    logps, old, ref, adv, mask = tensors()
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="trl_grpo_loss_check_") as tmp:
        for name, (settings, beta) in VARIANTS.items():
            theirs, g_theirs = trl_loss(tmp, settings, logps, old, ref, adv, mask)
            ours, g_ours = our_loss(name, beta, logps, old, ref, adv, mask)
            d_loss = abs(float(theirs - ours))
            d_grad = float((g_theirs * mask - g_ours * mask).abs().max())
            worst = max(worst, d_loss, d_grad)
            print(
                f"{name:8s} trl {trl.__version__} {settings}: loss trl {float(theirs):+.8f} ours {float(ours):+.8f} "
                f"|diff| {d_loss:.1e}; grad max |diff| {d_grad:.1e}"
            )
    ok = worst <= 1e-6
    print("all equal" if ok else f"DIFFERENT (worst {worst:.1e})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
