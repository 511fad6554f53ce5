"""Language-model parts of rlhf-toy: tasks, tokenizer and chat format, SFT, preferences, reward model."""
