"""Creating and checking gymnasium vector environments for the MLP agent."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rlhf_toy.errors import UserError

AutoresetMode = gym.vector.AutoresetMode


def make_vec_env(
    env_id: str, num_envs: int, *, render_mode: str | None = None, autoreset_mode: AutoresetMode | None = None
) -> gym.vector.VectorEnv:
    """`gym.make_vec` with the env's native vectorized version when it has one (CartPole does).

    Refuses, with a one-line `UserError`, ids that do not exist and envs the MLP agent cannot drive.
    `autoreset_mode` forces a sync vector env with that mode (native vector envs choose their own).
    """
    if num_envs < 1:
        raise UserError(f"num_envs must be >= 1 (got {num_envs}); pass --num_envs 8")
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as exc:
        raise UserError(
            f"unknown environment '{env_id}' ({exc}); pass a registered gymnasium id such as CartPole-v1 or Acrobot-v1"
        ) from exc
    kwargs: dict[str, Any] = {"render_mode": render_mode} if render_mode else {}
    if autoreset_mode is None and spec.vector_entry_point is not None:
        envs = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs)
    else:
        vector_kwargs = {"autoreset_mode": autoreset_mode} if autoreset_mode is not None else {}
        try:
            envs = gym.make_vec(
                env_id, num_envs=num_envs, vectorization_mode="sync", vector_kwargs=vector_kwargs, **kwargs
            )
        except gym.error.DependencyNotInstalled as exc:
            raise UserError(f"environment '{env_id}' needs an extra package: {exc}") from exc
    check_spaces(envs, env_id)
    return envs


def check_spaces(envs: gym.vector.VectorEnv, env_id: str) -> None:
    """The agent handles a Discrete action space and a flat Box observation; anything else is refused."""
    act, obs = envs.single_action_space, envs.single_observation_space
    problems = []
    if not isinstance(act, gym.spaces.Discrete):
        problems.append(f"action space {act} is not Discrete")
    if not (isinstance(obs, gym.spaces.Box) and len(obs.shape) == 1):
        problems.append(f"observation space {obs} is not a flat Box")
    if problems:
        envs.close()
        raise UserError(
            f"environment '{env_id}' is not supported: {'; '.join(problems)}. The MLP agent needs "
            "a Discrete action space and a flat Box observation (e.g. CartPole-v1, Acrobot-v1)"
        )
    mode = envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if mode not in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
        envs.close()
        raise UserError(f"environment '{env_id}' uses autoreset mode {mode}; use NEXT_STEP or SAME_STEP")


def reward_threshold(env_id: str) -> float | None:
    """The env's registered 'solved' threshold (475 for CartPole-v1), or None."""
    threshold = gym.spec(env_id).reward_threshold
    return None if threshold is None else float(threshold)
