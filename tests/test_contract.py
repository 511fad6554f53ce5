"""The algorithm record is a contract: what it says, the trainer does, through the Python API as through the
command; a setting an algorithm does not read is refused, never ignored."""

import copy
import math
import pickle
import subprocess
import sys
from dataclasses import replace

import pytest

from cartpole.cli import COMMANDS as CARTPOLE_COMMANDS
from cartpole.train import CARTPOLE_PPO, TrainConfig, train
from rlhf_toy.cli import parse_configs
from rlhf_toy.config import given
from rlhf_toy.errors import UserError, run_cli
from rlhf_toy.lm.algorithms.online import ALGORITHMS, LM_DAPO, LM_PPO
from rlhf_toy.lm.algorithms.rlhf import RLHFConfig, RLHFTrainer
from rlhf_toy.lm.data import helpdesk
from rlhf_toy.lm.models.base import load_base
from rlhf_toy.lm.pipeline.cli import COMMANDS, main
from rlhf_toy.ppo import PPOConfig
from tests.hf_models import tiny_model_dir

PROMPTS = list(dict.fromkeys(d.prompt for d in helpdesk.generate(200, seed=0)))


def command_configs(name: str, *flags: str) -> tuple[RLHFConfig, PPOConfig]:
    """The `(RLHFConfig, PPOConfig)` the algorithm's command builds from `flags`."""
    record = ALGORITHMS[name]
    cmd = COMMANDS[record.command]
    classes, _, defaults = cmd.load()
    _, rl, ppo, _, _ = parse_configs(classes, list(flags), record.command, cmd.help, defaults, cmd.unread)
    return rl, ppo


# Which fields a config was given -----------------------------------------------------------------------------


def test_a_config_remembers_the_fields_it_was_given():
    assert given(RLHFConfig(batch_size=16, kl_coef=0.1)) == {"batch_size", "kl_coef"}
    assert given(RLHFConfig()) == frozenset()
    assert given(PPOConfig(3e-4)) == {"learning_rate"}  # positional too
    assert given(replace(LM_PPO, n_epochs=2)) == {f for f in LM_PPO.to_dict()}  # replace gives every field
    assert given(LM_DAPO) == {"learning_rate", "anneal_lr", "n_epochs", "minibatch_size", "gamma",
                              "clip_range_high", "normalize_advantages", "vf_coef", "max_grad_norm"}  # fmt: skip


def test_a_copied_config_keeps_what_it_was_given():
    cfg = RLHFConfig(batch_size=16)
    assert given(copy.deepcopy(cfg)) == given(pickle.loads(pickle.dumps(cfg))) == {"batch_size"}
    assert copy.deepcopy(cfg) == cfg  # equality is the fields', not what was given


# The record decides --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_the_record_and_its_command_give_the_same_settings(name):
    record = ALGORITHMS[name]
    assert command_configs(name) == record.configs()
    assert record.settle(None, None) == record.configs()
    assert record.settle(*command_configs(name)) == record.configs()  # the command's configs give every field
    flags = ["--batch_size", "16", "--max_new_tokens", "8", "--learning_rate", "1e-4"]
    overrides = {"batch_size": 16, "max_new_tokens": 8, "learning_rate": 1e-4}
    assert record.settle(*command_configs(name, *flags)) == record.configs(**overrides) == command_configs(name, *flags)


def test_dapo_through_the_api_is_dapo(capsys):
    """The issue's case: a caller gives a batch and a group size and DAPO's preset; DAPO's rollout (dynamic sampling,
    overlong shaping, truncated replies masked, no KL penalty) is what runs. A field the caller gave wins, said once."""
    rl, ppo = ALGORITHMS["dapo"].settle(RLHFConfig(batch_size=16, group_size=4), LM_DAPO)
    assert rl.dynamic_sampling and rl.overlong_buffer == 0.25 and rl.mask_truncated and rl.kl_coef == 0.0
    assert rl.batch_size == 16 and ppo == LM_DAPO
    assert "note" not in capsys.readouterr().err  # batch_size is no setting of the record's
    rl, _ = ALGORITHMS["dapo"].settle(RLHFConfig(batch_size=16, kl_coef=0.1), None)
    rl, _ = ALGORITHMS["dapo"].settle(RLHFConfig(batch_size=16, kl_coef=0.1), None)
    assert rl.kl_coef == 0.1 and rl.dynamic_sampling and rl.group_size == 4  # 0.1 is the dataclass's default
    assert capsys.readouterr().err.count("note: dapo runs with kl_coef=0.1 (its record: 0.0)") == 1


def test_a_grouped_algorithm_names_the_setting_not_a_flag():
    with pytest.raises(UserError, match=r"rloo needs at least 2 samples per prompt.*set group_size to 4"):
        ALGORITHMS["rloo"].configs(group_size=1)


@pytest.mark.integration
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_the_trainer_runs_what_the_command_runs_and_steps(tmp_path_factory, name):
    """Walks the table: a trainer built through the Python API with no configs, or with a config that gives only a
    batch, runs the settings the command would, and one step of it runs."""
    model, tok = load_base(tiny_model_dir("llama", tmp_path_factory.mktemp("llama")))
    k = ALGORITHMS[name].default_group_size
    batch = {"batch_size": 4 * k, "max_new_tokens": 4, "minibatch_size": 2 * k}
    reward = lambda p, t: [float(len(x)) for x in t]  # noqa: E731
    trainer = RLHFTrainer(model, reward, tok, RLHFConfig(batch_size=4 * k, max_new_tokens=4),
                          PPOConfig(minibatch_size=2 * k), PROMPTS, seed=0, algorithm=name)  # fmt: skip
    flags = [x for key, value in batch.items() for x in (f"--{key}", str(value))]
    assert (trainer.cfg, trainer.ppo) == command_configs(name, *flags)
    assert (trainer.cfg, trainer.ppo) == ALGORITHMS[name].configs(**batch)
    row = trainer.step()
    assert row["step"] == 1 and math.isfinite(row["objective/kl"])
    if name == "dapo":
        assert "sampling/filled_groups" in row and row["objective/beta"] == 0.0


# A setting an algorithm does not read is refused -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "flag", "why"),
    [
        ("rloo", "--ratio_level sequence", "plain policy gradient"),
        ("grpo", "--gae_lambda 0.5", "compare whole replies"),
        ("grpo", "--vf_coef 0.5", "no critic"),
        ("reinforce", "--no_clip", "no ratio to clip"),
        ("reinforce", "--gae_lambda=0.9", "returns, not GAE"),
        ("dr_grpo", "--gamma 0.9", "no per-token discount"),
    ],
)
def test_a_flag_the_algorithm_does_not_read_is_refused_with_one_line(capsys, name, flag, why):
    code = run_cli(main, [ALGORITHMS[name].command, *flag.split()])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: --{flag.split()[0][2:].split('=')[0]}")
    assert why in err and "drop it" in err


def test_a_setting_the_algorithm_does_not_read_is_refused_through_the_api():
    with pytest.raises(UserError, match="rloo does not read ratio_level"):
        ALGORITHMS["rloo"].configs(ratio_level="sequence")
    with pytest.raises(UserError, match="grpo does not read gae_lambda"):
        ALGORITHMS["grpo"].settle(None, replace(ALGORITHMS["grpo"].preset, gae_lambda=0.5))
    with pytest.raises(UserError, match="'lr' is not a setting"):
        ALGORITHMS["ppo"].configs(lr=1.0)
    # a config that only repeats the record's value of an unread field contradicts nothing
    assert ALGORITHMS["grpo"].settle(None, replace(ALGORITHMS["grpo"].preset, gamma=1.0))[1].gamma == 1.0


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_help_lists_only_the_flags_an_algorithm_reads(capsys, name):
    record = ALGORITHMS[name]
    with pytest.raises(SystemExit):
        main([record.command, "--help"])
    out = capsys.readouterr().out
    for field in record.unread:
        assert f"--{field} " not in out and f"--{field}\n" not in out, field
    assert "--learning_rate" in out and "--batch_size" in out


def test_none_turns_off_a_setting_the_record_gives_a_value():
    # PPO's record clips the value at 0.2 and the gradient norm at 1.0; "(None: no clip)" must be reachable.
    _, ppo = command_configs("ppo")
    assert ppo.clip_range_vf == 0.2 and ppo.max_grad_norm == 1.0
    _, ppo = command_configs("ppo", "--clip_range_vf", "None", "--max_grad_norm", "none", "--target_kl", "null")
    assert ppo.clip_range_vf is None and ppo.max_grad_norm is None and ppo.target_kl is None
    _, ppo = command_configs("ppo", "--clip_range_vf", "0.5")
    assert ppo.clip_range_vf == 0.5
    with pytest.raises(UserError, match="invalid float value: 'x'"):  # still a float otherwise
        command_configs("ppo", "--clip_range_vf", "x")
    with pytest.raises(UserError, match="invalid float value: 'None'"):  # a setting that may not be None
        command_configs("ppo", "--learning_rate", "None")


def test_cartpole_refuses_the_sequence_settings():
    cmd = CARTPOLE_COMMANDS["train"]
    with pytest.raises(UserError, match="--loss_aggregation is not read here: a CartPole sample is one env step"):
        parse_configs(cmd.load()[0], ["--loss_aggregation", "sequence"], "cartpole train", cmd.help, cmd.defaults,
                      cmd.unread)  # fmt: skip
    with pytest.raises(UserError, match="ratio_level='sequence' means nothing here"):
        train(TrainConfig(), replace(CARTPOLE_PPO, ratio_level="sequence"))  # refused before any work


@pytest.mark.integration
def test_a_refused_flag_from_the_installed_command_is_one_line():
    out = subprocess.run(
        [sys.executable, "-m", "rlhf_toy.lm", "grpo", "--gae_lambda", "0.5"], capture_output=True, text=True
    )
    assert out.returncode == 2 and out.stderr.startswith("error: --gae_lambda is not read here") and not out.stdout
    assert "Traceback" not in out.stderr


def test_compares_help_names_every_method():
    from dataclasses import fields

    from rlhf_toy.lm.pipeline.compare import METHODS, CompareConfig

    help_text = next(f.metadata["help"] for f in fields(CompareConfig) if f.name == "methods")
    assert all(m in help_text for m in METHODS) and set(ALGORITHMS) <= set(METHODS)
