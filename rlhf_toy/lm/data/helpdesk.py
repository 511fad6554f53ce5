"""The `helpdesk` task: a help-desk chat world generated from templates with a seeded generator.

A user describes a problem with a device ("My new printer won't start."); the bot replies in three parts:
an opener drawn uniformly from rude to warm, an answer that names the user's device, and a closer drawn
uniformly. The world is small enough for a ~1M-parameter model to learn fluently, so RLHF can change the
model's *manner* (warm or rude) without breaking its language, and an outside judge (VADER, -1 when the reply
drops the topic) tells whether that change is real.

Because every response part is drawn uniformly and independently, the generator knows the data's entropy:
H(response | prompt) = log(#openers x #answers x #closers) nats, the floor for any model's loss.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

# Devices chosen to be neutral to VADER (e.g. "fan" scores +0.32, so it is not here).
TOPICS = [
    "printer",
    "laptop",
    "router",
    "phone",
    "monitor",
    "keyboard",
    "mouse",
    "tablet",
    "camera",
    "speaker",
    "headset",
    "webcam",
    "scanner",
    "smartwatch",
    "television",
    "microwave",
    "dishwasher",
    "fridge",
    "oven",
    "toaster",
    "kettle",
    "blender",
    "vacuum",
    "thermostat",
    "doorbell",
    "projector",
    "console",
    "charger",
    "modem",
    "drone",
    "heater",
    "dryer",
    "washer",
    "freezer",
    "lamp",
    "treadmill",
    "radio",
    "stove",
    "desktop",
    "earbuds",
]
PROBLEMS = [
    "won't start",
    "keeps restarting",
    "makes a strange noise",
    "is very slow",
    "stopped working",
    "won't connect",
    "shows an error",
    "keeps freezing",
    "runs hot",
    "won't charge",
    "lost its settings",
    "beeps all the time",
]
USER_TEMPLATES = [
    "My new {topic} {problem}.",
    "My {topic} {problem}.",
    "Hi, my {topic} {problem}.",
    "Hello, the {topic} {problem}.",
    "The {topic} in my office {problem}.",
    "Our {topic} {problem}.",
    "Since yesterday my {topic} {problem}.",
    "Help, my {topic} {problem}.",
    "My old {topic} {problem}.",
    "The {topic} at home {problem}.",
    "Excuse me, my {topic} {problem}.",
    "Why is it that my {topic} {problem}?",
    "Today the {topic} {problem}.",
    "My brother's {topic} {problem}.",
    "This morning my {topic} {problem}.",
    "Question: my {topic} {problem}.",
    "I think my {topic} {problem}.",
    "Again my {topic} {problem}.",
]
OPENERS = [
    "Whatever.",
    "Ugh.",
    "Not again.",
    "Hmm.",
    "I see.",
    "Okay.",
    "Right.",
    "Sure.",
    "Thanks for asking.",
    "Glad you asked!",
    "Great question!",
    "Happy to help!",
]
ANSWERS = [
    "Try restarting your {topic}.",
    "Unplug the {topic} for a minute.",
    "Check the cable of your {topic}.",
    "Update the software on your {topic}.",
    "Reset the {topic} to factory settings.",
    "Clean the vents of the {topic}.",
    "Move the {topic} closer to the outlet.",
    "Replace the battery in the {topic}.",
    "Look up the error code of the {topic}.",
    "Turn the {topic} off and on again.",
    "Send the {topic} in for repair.",
    "Read the manual of the {topic}.",
    "Plug the {topic} into another socket.",
    "Hold the power button of the {topic} for ten seconds.",
    "Let the {topic} cool down first.",
]
CLOSERS = [
    "Deal with it.",
    "Bye.",
    "Next.",
    "Done.",
    "That is all.",
    "Let me know.",
    "Take care.",
    "Good luck!",
    "Hope this helps!",
    "Have a great day!",
]
HELD_OUT_PER_TOPIC = 3  # user templates per topic kept out of training, for evaluation


@dataclass(frozen=True)
class Dialogue:
    prompt: str
    response: str
    topic: str


def response_entropy_nats() -> float:
    """H(response | prompt): each of the three parts is uniform and independent."""
    return math.log(len(OPENERS) * len(ANSWERS) * len(CLOSERS))


def held_out_templates(seed: int) -> dict[str, set[int]]:
    """For each topic, the indices of the user templates reserved for evaluation."""
    rng = random.Random(f"helpdesk-heldout-{seed}")
    return {t: set(rng.sample(range(len(USER_TEMPLATES)), HELD_OUT_PER_TOPIC)) for t in TOPICS}


def sample_response(rng: random.Random, topic: str) -> str:
    return f"{rng.choice(OPENERS)} {rng.choice(ANSWERS).format(topic=topic)} {rng.choice(CLOSERS)}"


def generate(n: int, seed: int, split: str = "train") -> list[Dialogue]:
    """`n` dialogues; `split="eval"` draws prompts only from the held-out (topic, template) combinations."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    held = held_out_templates(0)  # the split itself is fixed, whatever the sampling seed
    rng = random.Random(f"helpdesk-{split}-{seed}")
    out = []
    while len(out) < n:
        topic = rng.choice(TOPICS)
        k = rng.randrange(len(USER_TEMPLATES))
        if (k in held[topic]) != (split == "eval"):
            continue
        prompt = USER_TEMPLATES[k].format(topic=topic, problem=rng.choice(PROBLEMS))
        out.append(Dialogue(prompt, sample_response(rng, topic), topic))
    return out


def topic_of(prompt: str) -> str | None:
    """The device a helpdesk prompt is about (None if it names none)."""
    words = prompt.lower().replace("?", " ").replace(".", " ").replace(",", " ").split()
    for t in TOPICS:
        if t in words:
            return t
    return None
