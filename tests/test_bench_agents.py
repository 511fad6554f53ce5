"""The agent benchmark's game (`scripts/peers/frozenlake_tools.py`): one FrozenLake behind TRL's environment
protocol and this project's `TextEnv`, so both sides of `scripts/bench_agents.py` play the same game."""

import sys
from pathlib import Path

import gymnasium
import numpy as np

from rlhf_toy.lm.agents.rollout import checked_reset, checked_step

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "peers"))

from frozenlake_tools import FrozenLakeTools, make, tool_call_text  # noqa: E402


def test_the_scripted_walk_reaches_the_goal_through_the_tool_as_gymnasium_steps():
    env, game = make(), FrozenLakeTools()
    gym = gymnasium.make("FrozenLake-v1", map_name="4x4", is_slippery=False)
    obs = checked_reset(env, 4, "bench")
    assert obs == game.reset(prompt="ignored", seed=4) and obs.startswith("PFFF")  # TRL passes the dataset row
    gym.reset(seed=4)
    total, turns = 0.0, 0
    while True:
        action = env.scripted_action()
        obs, reward, terminated, truncated, info = checked_step(env, action, "bench", turns + 1, 4)
        total, turns = total + reward, turns + 1
        if terminated:
            break
        direction = action.split('"direction": "')[1].split('"')[0]
        state, *_ = gym.step(["left", "down", "right", "up"].index(direction))
        assert obs == f"<tool_response>\n{game.move(direction)}\n</tool_response>"
        assert env.game.state == state == game.state
    assert action == "Done." and info["success"] and total == 1.0 == game.get_reward()
    assert turns == 7  # the shortest path is 6 moves, then the answer


def test_a_failed_call_is_an_error_result_and_a_malformed_one_ends_the_episode():
    env = make()
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step(tool_call_text("north"))
    error = "unknown direction 'north'; use left, down, right or up"
    assert obs == f"<tool_response>\n{str({'error': error})}\n</tool_response>"
    assert reward == -0.1 and info["invalid"] and not terminated
    obs, reward, _, _, info = env.step('<tool_call>\n{"name": "jump", "arguments": {}}\n</tool_call>')
    assert "Tool jump not found." in obs and info["invalid"] and reward == 0.0  # the game never saw it (as in TRL)
    _, reward, terminated, _, info = env.step('<tool_call>\n{"name": "move", "arguments": {"direction": </tool_call>')
    assert terminated and reward == 0.0 and not info["success"]  # TRL's parser reads it as plain text: an answer


def test_success_is_reported_on_every_step_so_a_turn_limit_after_the_goal_still_counts():
    """The episode may be cut by the turn limit before the answer: the move that reached G already says success, as
    TRL's side scores `self.success` (the benchmark once counted such episodes as failures on rlhf-toy's side)."""
    env = make()
    env.reset(seed=0)
    info = {}
    for direction in ("right", "right", "down", "down", "down"):
        _, _, _, _, info = env.step(tool_call_text(direction))
        assert not info["success"]
    _, reward, terminated, _, info = env.step(tool_call_text("right"))
    assert reward == 1.0 and not terminated and info["success"]  # the game waits for the answer
    _, reward, _, _, info = env.step(tool_call_text("up"))  # a move after the end: a failed call, still a success
    assert abs(reward + 0.1) < 1e-9 and info["invalid"] and info["success"]


def test_the_demonstrator_is_a_noisy_walker_that_sometimes_succeeds():
    env, rng = make(), np.random.default_rng(0)
    wins = 0
    for seed in range(0, 200, 2):
        env.reset(seed=seed)
        for _ in range(10):
            _, _, terminated, _, info = env.step(env.random_action(rng))
            if terminated:
                wins += info["success"]
                break
    assert 5 < wins < 60  # neither random (about 0.02) nor the scripted walk (1.00)


def test_a_count_below_one_is_one_error_line_before_any_preparation(tmp_path):
    import subprocess

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_agents.py"
    argv = [sys.executable, str(script), "--trl-python", sys.executable, "--out", str(tmp_path / "b"), "--repeats", "0"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1].endswith("error: --repeats must be >= 1, not 0")
    assert not (tmp_path / "b").exists()  # nothing prepared, nothing written
