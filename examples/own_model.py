"""RLHF on your own Hugging Face causal LM with a reward function of your own: PPO with a KL penalty."""

import sys

from rlhf_toy.lm import LoraConfig, RLHFConfig, RLHFTrainer, add_lora, lm_ppo_config, load_base, save_model

model_dir = sys.argv[1]  # any causal LM saved with save_pretrained, with its tokenizer (GPT-2, Llama, Qwen2, ...)
model, tok = load_base(model_dir)  # its own tokenizer and chat template; dropout off
lora = len(sys.argv) > 2 and sys.argv[2] == "--lora"
if lora:  # adapters on every linear layer and the output layer; the reference is the same net, adapters off
    model = add_lora(model, LoraConfig(lora_r=8, lora_targets="all-linear,lm_head"), "CAUSAL_LM", seed=0)

prompts = [
    f"My {thing} {problem}."
    for thing in ("printer", "laptop", "router", "phone", "kettle", "oven")
    for problem in ("won't start", "is very slow", "keeps freezing", "makes a strange noise")
]


def reward(prompts: list[str], replies: list[str]) -> list[float]:
    """Yours to write: one number per reply (here, a toy rule: the share of the letter 'e')."""
    return [sum(c == "e" for c in r) / max(1, len(r)) for r in replies]


trainer = RLHFTrainer(
    model,
    reward,
    tok,
    RLHFConfig(steps=40, batch_size=16, max_new_tokens=8, kl_coef=0.01, value_lr_scale=1.0),
    # A tiny random model takes large steps, and LoRA's adapters larger ones than full weights.
    lm_ppo_config(learning_rate=2e-2 if lora else 1e-2, minibatch_size=8),
    prompts,
    seed=0,
)
scores = []
for step in range(40):
    metrics = trainer.step()  # sample, score, KL-shaped rewards, GAE, the clipped PPO update
    scores.append(metrics["objective/score"])
    if step % 10 == 9:
        print(f"step {step + 1}: reward {metrics['objective/score']:.3f}  KL {metrics['objective/kl']:.2f} nats")
print(f"reward over the first 5 steps {sum(scores[:5]) / 5:.3f} -> last 5 {sum(scores[-5:]) / 5:.3f}")
save_model("my_rlhf_model", trainer.policy.lm, tok)  # a plain HF directory (LoRA: adapters merged in)
