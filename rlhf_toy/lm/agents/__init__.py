"""Language-model agents in text environments: multi-turn RL with any online algorithm of the table.

    from rlhf_toy.lm.agents import AgentConfig, AgentTrainer, ENVIRONMENTS, TextEnv

`TextEnv` (gymnasium's interface, text in and out) and the built-in games are in `envs`; one record per environment
in `registry.ENVIRONMENTS`; the lockstep multi-turn rollout in `rollout`; the trainer on the core in `trainer`; the
`rlhf-toy agent` command in `command`.
"""

from .envs import INVALID_PENALTY, TextEnv, read_word
from .registry import ALL_HISTORY, ENVIRONMENTS, EnvRecord, get_env
from .rollout import Episode, RolloutSettings, Turn, run_episodes
from .trainer import AgentConfig, AgentTrainer

__all__ = [
    "ALL_HISTORY",
    "ENVIRONMENTS",
    "INVALID_PENALTY",
    "AgentConfig",
    "AgentTrainer",
    "EnvRecord",
    "Episode",
    "RolloutSettings",
    "TextEnv",
    "Turn",
    "get_env",
    "read_word",
    "run_episodes",
]
