"""Your own checker: reward functions with TRL's signature, for `rlhf-toy grpo --data FILE --reward_fn ...`.

Every column of the prompt file besides `prompt` arrives as a keyword list, one item per completion (here
`answer`), so a function written for TRL's GRPOTrainer runs unchanged. Several functions are summed with
`--reward_weights`.
"""

import re

NUMBER = re.compile(r"-?\d+")


def exact_answer(prompts, completions, answer, **kwargs):
    """1.0 where the last number of the completion is the row's `answer`, else 0.0."""
    rewards = []
    for completion, expected in zip(completions, answer):
        numbers = NUMBER.findall(completion)
        rewards.append(float(bool(numbers) and int(numbers[-1]) == int(expected)))
    return rewards


def brevity(prompts, completions, **kwargs):
    """A small bonus for short replies: 1.0 at 0 words, 0.0 at 20 words or more."""
    return [max(0.0, 1 - len(c.split()) / 20) for c in completions]
