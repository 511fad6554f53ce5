"""A PPO agent for gymnasium envs with discrete actions, built on the `rlhf_toy` PPO core.

from cartpole import TrainConfig, train, load_agent, evaluate
summary = train(TrainConfig(seed=0, out="runs/cp0"))
agent, meta = load_agent("runs/cp0/best.pt")
action = agent.predict(observation)
"""

from .agent import MLPActorCritic, load_agent, save_agent
from .evaluate import evaluate
from .train import TrainConfig, cartpole_ppo_config, train

__all__ = ["MLPActorCritic", "TrainConfig", "cartpole_ppo_config", "evaluate", "load_agent", "save_agent", "train"]
