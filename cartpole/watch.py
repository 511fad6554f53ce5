"""'Watch it happen': render an agent's episode to an animated GIF with the step and return on each frame."""

from __future__ import annotations

import os
from pathlib import Path

# Render off-screen: no display, no sound device (SDL complains on stderr otherwise).
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

import gymnasium as gym
import torch
from PIL import Image, ImageDraw

from rlhf_toy.errors import UserError
from rlhf_toy.io import atomic_write

from .agent import MLPActorCritic


def record_episode(
    agent: MLPActorCritic,
    env_id: str,
    label: str,
    seed: int = 0,
    max_steps: int = 500,
    every: int = 2,
    scale: float = 0.5,
) -> tuple[list[Image.Image], int, float]:
    """Play one deterministic episode from `rgb_array` frames. Returns `(frames, steps, return)`.

    Keeps the first frame, every `every`-th step's frame and the last one, resized by `scale`, with `label`, the
    step count and the return so far drawn on top: 1 + ceil(steps / every) frames.
    """
    if every < 1 or max_steps < 1 or not 0 < scale <= 1:
        raise UserError(f"need every >= 1, max_steps >= 1 and 0 < scale <= 1 (got {every}, {max_steps}, {scale})")
    env = gym.make(env_id, render_mode="rgb_array")
    frames: list[Image.Image] = []
    try:
        obs, _ = env.reset(seed=seed)
        ret, step, done = 0.0, 0, False

        def snap() -> None:
            img = Image.fromarray(env.render())
            img = img.resize((int(img.width * scale), int(img.height * scale)))
            ImageDraw.Draw(img).text((6, 4), f"{label}  step {step}  return {ret:.0f}", fill=(0, 0, 0))
            frames.append(img)

        snap()
        while not done and step < max_steps:
            obs, r, terminated, truncated, _ = env.step(int(agent.predict(obs)))
            ret, step, done = ret + float(r), step + 1, terminated or truncated
            if step % every == 0 or done or step == max_steps:
                snap()
    finally:
        env.close()
    return frames, step, ret


def write_gif(frames: list[Image.Image], path: str | os.PathLike[str], fps: int = 25) -> None:
    """An animated, looping GIF, written atomically."""
    if not frames:
        raise UserError("no frames to write")
    atomic_write(
        path,
        lambda tmp: frames[0].save(
            tmp, format="GIF", save_all=True, append_images=frames[1:], duration=int(1000 / fps), loop=0
        ),
    )


def watch(
    agent: MLPActorCritic,
    env_id: str,
    out_dir: str | os.PathLike[str],
    seed: int = 0,
    max_steps: int = 500,
    every: int = 2,
) -> dict[str, int]:
    """Write `trained.gif` for `agent` and, for contrast, `untrained.gif` for a freshly initialised agent."""
    torch.manual_seed(seed)
    untrained = MLPActorCritic(agent.obs_dim, agent.n_actions, agent.hidden)
    counts = {}
    for name, a in (("trained", agent), ("untrained", untrained)):
        frames, _, _ = record_episode(a, env_id, name, seed=seed, max_steps=max_steps, every=every)
        write_gif(frames, Path(out_dir) / f"{name}.gif")
        counts[name] = len(frames)
    return counts
