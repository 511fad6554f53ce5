"""Models: chat format and tokenizer, the policy LM and its value head, the reward model, sampling, checkpoints."""
