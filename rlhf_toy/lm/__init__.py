"""The language-model side of rlhf-toy: RLHF (SFT, preferences, reward model, PPO with a KL penalty).

Sub-packages, from the bottom up:
- `data/`: where prompts, SFT pairs, preference pairs and gold judges come from (`tasks`, `helpdesk`,
  `preferences`), checkable problems and their checkers (`checkable`), reward functions as programs
  (`rewards`, TRL's signature).
- `models/`: devices (`devices`), the chat format and tokenizer (`chat`), the policy model and log-probs
  (`causal_lm`), the policy with its value head (`policy`), loading/saving model directories (`checkpoints`),
  base models and GGUF files (`base`), LoRA (`lora`), which layers train (`layers`), the reward model
  (`reward_model`), ensembles, WARM and the length penalty (`reward_ensemble`) and sampling (`sampling`).
- `algorithms/`: training: SFT (`sft`), Bradley-Terry reward training (`reward`), the table of online
  algorithms (`online`: one record each), the RLHF step on the shared core (`rlhf`), KL shaping and control
  (`kl`), and DPO (`dpo`).
- `pipeline/`: where a run lives (`run`, `rundir`), the stages in order (`stages`, `reward_stage`), evaluation
  (`evaluate`), the comparison of methods (`compare`, `frontier`, `reasoning`), the remedies against reward
  hacking (`remedies`: one record each), recipes for real models (`recipes`), the command table (`cli`) and
  the throughput benchmark (`bench`).
A new online algorithm is one record in `algorithms/online.py` (on `rlhf_toy.advantages`, `losses`, `ppo`), a
new model family goes in `models/`, a new stage or command in `pipeline/`.
"""

# The names below load on first use (PEP 562): `rlhf-toy --help` and the light modules (the algorithm table) import
# this package without pulling in transformers, datasets and the models.
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and editors; at run time `__getattr__` imports them
    from .algorithms.online import ALGORITHMS, LM_PPO, OnlineAlgorithm
    from .algorithms.rlhf import RLHFConfig, RLHFTrainer, lm_ppo_config
    from .data.rewards import RewardFunctions, load_reward_functions, reward_functions
    from .models.base import load_base
    from .models.checkpoints import save_model
    from .models.devices import resolve_device
    from .models.lora import LoraConfig, add_lora
    from .models.reward_ensemble import ScoredReward, load_scored_reward
    from .models.reward_model import RewardModel

_HOME = {  # name -> the module that defines it
    "ALGORITHMS": "algorithms.online",
    "LM_PPO": "algorithms.online",
    "OnlineAlgorithm": "algorithms.online",
    "RLHFConfig": "algorithms.rlhf_config",
    "RLHFTrainer": "algorithms.rlhf",
    "lm_ppo_config": "algorithms.rlhf",
    "RewardFunctions": "data.rewards",
    "load_reward_functions": "data.rewards",
    "reward_functions": "data.rewards",
    "load_base": "models.base",
    "save_model": "models.checkpoints",
    "resolve_device": "models.devices",
    "LoraConfig": "models.lora",
    "add_lora": "models.lora",
    "ScoredReward": "models.reward_ensemble",
    "load_scored_reward": "models.reward_ensemble",
    "RewardModel": "models.reward_model",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])


__all__ = [
    "ALGORITHMS",
    "LM_PPO",
    "OnlineAlgorithm",
    "LoraConfig",
    "RLHFConfig",
    "RLHFTrainer",
    "RewardFunctions",
    "RewardModel",
    "ScoredReward",
    "add_lora",
    "lm_ppo_config",
    "load_reward_functions",
    "load_scored_reward",
    "load_base",
    "resolve_device",
    "reward_functions",
    "save_model",
]
