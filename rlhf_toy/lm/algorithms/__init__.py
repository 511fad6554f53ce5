"""Training algorithms: SFT, reward-model training, and RLHF with PPO on the shared core."""
