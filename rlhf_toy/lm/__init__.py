"""The language-model side of rlhf-toy: RLHF (SFT, preferences, reward model, PPO with a KL penalty).

Sub-packages, from the bottom up:
- `data/`: where prompts, SFT pairs, preference pairs and gold judges come from (`tasks`, `helpdesk`,
  `preferences`).
- `models/`: the chat format and tokenizer (`chat`), the policy model and log-probs (`causal_lm`), the policy
  with its value head (`policy`), the reward model's scoring (`reward_model`), sampling (`sampling`), and
  loading/saving model directories (`checkpoints`).
- `algorithms/`: training: SFT (`sft`), Bradley-Terry reward training (`reward`), the RLHF step with PPO on the
  shared core (`rlhf`), KL shaping and control (`kl`), and rank/metric helpers for data parallelism
  (`distributed`).
- `pipeline/`: the stages in order (`stages`), the run directory (`rundir`), evaluation (`evaluate`), the
  over-optimization study (`overopt`), the command table (`cli`) and the throughput benchmark (`bench`).
A new algorithm goes in `algorithms/` (on `rlhf_toy.advantages`, `losses`, `ppo`), a new model family in
`models/`, a new stage or command in `pipeline/`.
"""

from .algorithms.rlhf import LM_PPO, RLHFConfig, RLHFTrainer, lm_ppo_config
from .models.checkpoints import save_model
from .models.hf import LoraConfig, add_lora, load_base, resolve_device
from .models.reward_model import RewardModel

__all__ = ["LM_PPO", "LoraConfig", "RLHFConfig", "RLHFTrainer", "RewardModel", "add_lora", "lm_ppo_config", "load_base",
           "resolve_device", "save_model"]
