"""Decoding constrained to an environment's actions (`--constrain_actions`): the prefix tree's masks by hand, the
constrained log-probs against a naive renormalization, sampling that draws only allowed replies with the log-probs
the update reads, and the agent command with it."""

import copy
import json
import math

import pytest
import torch

from rlhf_toy.errors import UserError, run_cli
from rlhf_toy.lm.agents.envs import FrozenLakeText
from rlhf_toy.lm.agents.policy_map import policy_map
from rlhf_toy.lm.agents.registry import get_env
from rlhf_toy.lm.agents.trainer import AgentConfig, AgentTrainer
from rlhf_toy.lm.algorithms.rlhf_config import RLHFConfig
from rlhf_toy.lm.models.causal_lm import response_logprobs, token_logprobs
from rlhf_toy.lm.models.chat import encode_responses
from rlhf_toy.lm.models.constrain import ReplyConstraint
from rlhf_toy.lm.models.sampling import sample
from rlhf_toy.lm.pipeline.cli import main
from rlhf_toy.ppo import PPOConfig
from tests.helpers import agent_configs, tiny_agent

EOS = 1
REPLIES = [[5, EOS], [5, 6, EOS], [7, EOS]]


def allowed_ids(c: ReplyConstraint, prefix: list[int], V: int = 10) -> list[int]:
    return torch.nonzero(c.allowed(torch.tensor([prefix], dtype=torch.long).view(1, -1), V)[0]).flatten().tolist()


def test_the_prefix_tree_allows_what_keeps_a_reply_a_prefix_of_one_and_everything_after_it():
    c = ReplyConstraint(REPLIES)
    assert allowed_ids(c, []) == [5, 7]
    assert allowed_ids(c, [5]) == [1, 6]
    assert allowed_ids(c, [5, 6]) == [1] and allowed_ids(c, [7]) == [1]
    assert allowed_ids(c, [7, EOS]) == list(range(10))  # after the reply: padding, kept finite
    assert allowed_ids(c, [9]) == list(range(10))  # not one of its prefixes
    masks = c.masks(torch.tensor([[5, 6, EOS], [7, EOS, 0]]), 10)
    assert masks.shape == (2, 3, 10)
    assert [torch.nonzero(m).flatten().tolist() for m in masks[0]] == [[5, 7], [1, 6], [1]]
    assert torch.nonzero(masks[1, 1]).flatten().tolist() == [1] and bool(masks[1, 2].all())
    with pytest.raises(ValueError, match="at least one reply"):
        ReplyConstraint([])


def test_constrained_log_probs_and_entropy_are_the_renormalized_distributions():
    torch.manual_seed(0)
    logits = torch.randn(3, 10)
    allowed = torch.zeros(3, 10, dtype=torch.bool)
    allowed[:, [2, 5, 7]] = True
    tokens = torch.tensor([2, 5, 7])
    logprobs, entropy = token_logprobs(logits, tokens, 0.7, allowed)
    for i in range(3):  # naive: a softmax over the three allowed logits alone
        sub = torch.log_softmax(logits[i, [2, 5, 7]] / 0.7, -1)
        assert math.isclose(logprobs[i].item(), sub[i].item(), abs_tol=1e-6)
        assert math.isclose(entropy[i].item(), -(sub.exp() * sub).sum().item(), abs_tol=1e-6)
    full_logprobs, full_entropy = token_logprobs(logits, tokens, 0.7)
    assert (logprobs > full_logprobs).all() and (entropy < full_entropy).all()
    logits.requires_grad_(True)
    token_logprobs(logits, tokens, 0.7, allowed)[1].sum().backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad[~allowed] == 0).all()


@pytest.fixture(scope="module")
def lake_model():
    return tiny_agent("frozenlake", demos=6)


@pytest.mark.parametrize("lean", [True, False])
def test_constrained_sampling_draws_only_the_replies_and_the_update_reads_its_log_probs(lake_model, lean):
    model, tok = lake_model
    actions = ["left", "down", "right", "up"]
    c = ReplyConstraint(encode_responses(tok, actions))
    prompts = ["PFFF\nFHFH\nFFFH\nHFFG\nrow 0 col 0", "SFFF\nFHFH\nFFPH\nHFFG\nrow 2 col 2"] * 24
    torch.manual_seed(0)
    free = sample(model, tok, prompts, 4, 1.5, with_logprobs=True, lean=lean)
    torch.manual_seed(0)
    s = sample(model, tok, prompts, 4, 1.5, with_logprobs=True, lean=lean, constraint=c)
    assert set(s.texts) <= set(actions) and bool(s.eos.all())
    assert set(free.texts) - set(actions), "a hot untrained-enough model writes other replies unconstrained"
    logprobs, entropy = response_logprobs(model, s.prompt_ids, s.prompt_mask, s.response_ids, 1.5, constraint=c)
    mask = s.response_mask.bool()
    assert torch.allclose(logprobs[mask], s.logprobs[mask], atol=1e-5)
    assert torch.allclose(entropy[mask], s.entropy[mask], atol=1e-5)
    assert (logprobs[:, 1][mask[:, 1]].abs() < 1e-6).all()  # every action is one token, so its EOS is certain
    # the probabilities of the four replies sum to one under the constraint
    ids, pmask = s.prompt_ids[:1].repeat(4, 1), s.prompt_mask[:1].repeat(4, 1)
    replies = torch.tensor(encode_responses(tok, actions))
    lp, _ = response_logprobs(model, ids, pmask, replies, 1.5, constraint=c)
    assert math.isclose(lp.sum(1).exp().sum().item(), 1.0, abs_tol=1e-5)


def test_a_constrained_agent_plays_only_actions_repeats_itself_and_its_kl_is_the_constrained_policys(lake_model):
    model, tok = lake_model

    def run():
        torch.manual_seed(0)
        t = AgentTrainer(
            copy.deepcopy(model),  # trained in place
            tok,
            "frozenlake-slippery",
            AgentConfig(env="frozenlake-slippery", constrain_actions=True),
            RLHFConfig(batch_size=8, temperature=1.5),
            PPOConfig(minibatch_size=8),
        )
        return t, [{k: v for k, v in t.step().items() if not k.startswith("time/")} for _ in range(2)]

    t, first = run()
    assert t.policy.constraint is t.settings.constraint is not None
    assert all(m["agent/invalid_rate"] == 0.0 for m in first)
    assert json.dumps(first) == json.dumps(run()[1])  # (distinct_2 is NaN for one-token replies)
    assert all(math.isfinite(m["ppo/policy_loss"]) and m["objective/kl"] >= 0 for m in first)
    replies = {turn.text for e in t.last_episodes for turn in e.turns}
    assert replies and replies <= {"left", "down", "right", "up"}


def test_the_slippery_lakes_record_constrains_and_the_flag_or_the_python_api_says_otherwise(lake_model):
    model, tok = lake_model

    def constraint(env: str, agent: AgentConfig):
        return AgentTrainer(copy.deepcopy(model), tok, env, agent).settings.constraint

    assert get_env("frozenlake-slippery").constrain_actions and not get_env("frozenlake").constrain_actions
    assert constraint("frozenlake-slippery", AgentConfig(env="frozenlake-slippery")) is not None  # the record's
    assert constraint("frozenlake-slippery", AgentConfig(env="frozenlake-slippery", constrain_actions=False)) is None
    assert constraint("frozenlake", AgentConfig()) is None
    assert constraint("frozenlake", AgentConfig(constrain_actions=True)) is not None
    # The command: the flag alone, a value, or nothing (None: the record's), before the other flags
    for flags, want in (([], None), (["--constrain_actions"], True), (["--constrain_actions", "False"], False)):
        configs = agent_configs(["--env", "frozenlake-slippery", *flags, "--steps", "3"])
        assert configs[1].constrain_actions is want and configs[2].steps == 3


def test_an_environment_without_a_fixed_set_of_actions_cannot_be_constrained(tmp_path, capsys):
    out = tmp_path / "agent"
    argv = ["agent", "--env", "calculator", "--constrain_actions", "--steps", "1", "--run_dir", str(out)]
    assert run_cli(main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "names no fixed set of actions" in err[0], err
    assert not out.exists() or not any(out.iterdir())
    model, tok = tiny_agent("tests.agent_envs:SayYes", demos=4, epochs=0)
    with pytest.raises(UserError, match="longer than --max_new_tokens 1"):
        AgentTrainer(
            model, tok, "tests.agent_envs:SayYes", AgentConfig(constrain_actions=True), RLHFConfig(max_new_tokens=1)
        )


def test_the_policy_map_of_a_constrained_run_is_the_policy_it_draws_from(lake_model):
    model, tok = lake_model
    env = FrozenLakeText(slippery=True)
    free, kept = policy_map(model, tok, env), policy_map(model, tok, env, constrained=True)
    for f, k in zip(free, kept):
        assert math.isclose(sum(k["probs"].values()), 1.0, abs_tol=1e-5) and k["other"] < 1e-6
        for move, p in f["probs"].items():
            assert math.isclose(k["probs"][move], p / (1 - f["other"]), rel_tol=1e-4)


def test_the_policy_map_script_reads_a_constrained_runs_setting(lake_model, tmp_path, capsys):
    from tests.test_agents import script

    model, tok = lake_model
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    settings = {"env": "frozenlake-slippery", "agent": {"constrain_actions": True}}
    (tmp_path / "agent.json").write_text(json.dumps({"settings": settings}))
    assert run_cli(script("agent_policy_map").main, [str(tmp_path)]) == 0
    rows = [
        line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line
    ]
    others = [float(r[-2]) for r in rows[1:]]  # the "other" column under the header
    assert len(others) == 11 and all(o == 0.0 for o in others)
