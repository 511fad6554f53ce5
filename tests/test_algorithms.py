"""REINFORCE, RLOO, GRPO and DPO on the same core as PPO: their advantages, their learning, their bad input."""

import json
import math
import shutil
from dataclasses import replace

import pytest
import torch

from rlhf_toy.advantages import discounted_returns
from rlhf_toy.lm.algorithms.online import (
    ALGORITHMS,
    LM_GRPO,
    LM_PPO,
    LM_REINFORCE,
    LM_REINFORCE_BASELINE,
    LM_RLOO,
    OnlineAlgorithm,
    Signals,
)
from rlhf_toy.lm.algorithms.rlhf import RLHFConfig, RLHFTrainer
from rlhf_toy.lm.data import helpdesk
from rlhf_toy.lm.models.base import load_base
from rlhf_toy.ppo import RolloutBatch, minibatch_loss
from tests.helpers import PPO_TINY, stage
from tests.hf_models import tiny_model_dir

pytestmark = pytest.mark.integration  # trains or loads models, or runs whole commands

PROMPTS = list(dict.fromkeys(d.prompt for d in helpdesk.generate(200, seed=0)))
PRESETS = {name: (a.preset, a.default_group_size) for name, a in ALGORITHMS.items()}


def advantages_and_returns(name, rewards, scores, kl, values, mask, beta, ppo, group_size, kl_in_loss):
    signals = Signals(rewards, scores, kl, values, mask, 0.0 if kl_in_loss else beta)
    return ALGORITHMS[name].advantages(signals, ppo, group_size)


def random_experience(B=8, R=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, R + 1, (B,), generator=g)
    mask = (torch.arange(R)[None] < lengths[:, None]).float()
    kl = torch.rand(B, R, generator=g) * mask
    scores = torch.randn(B, generator=g)
    values = torch.randn(B, R, generator=g) * mask
    rewards = -0.1 * kl
    rewards[torch.arange(B), lengths - 1] += scores
    return rewards, scores, kl, values, mask


def test_reinforce_advantages_are_returns_to_go_with_or_without_the_baseline():
    rewards, scores, kl, values, mask = random_experience()
    adv, ret = advantages_and_returns("reinforce", rewards, scores, kl, values, mask, 0.1, LM_REINFORCE, 1, False)
    naive = torch.flip(torch.cumsum(torch.flip(rewards * mask, [1]), 1), [1])  # gamma 1: sum of later rewards
    torch.testing.assert_close(adv, naive * mask)
    dones = torch.zeros_like(mask, dtype=torch.bool)
    torch.testing.assert_close(ret, discounted_returns(rewards.T, dones.T, gamma=1.0, mask=mask.T).T)
    adv_b, _ = advantages_and_returns(
        "reinforce_baseline", rewards, scores, kl, values, mask, 0.1, LM_REINFORCE_BASELINE, 1, False
    )
    torch.testing.assert_close(adv_b, (naive - values) * mask)


def test_rloo_and_grpo_give_every_token_of_a_reply_its_group_advantage():
    rewards, scores, kl, values, mask = random_experience()
    seq = scores - 0.1 * kl.sum(1)
    adv, _ = advantages_and_returns("rloo", rewards, scores, kl, values, mask, 0.1, LM_RLOO, 4, False)
    for i in range(8):
        group = seq[(i // 4) * 4 : (i // 4) * 4 + 4]
        loo = (group.sum() - seq[i]) / 3
        torch.testing.assert_close(adv[i], (seq[i] - loo) * mask[i])
    adv, _ = advantages_and_returns("grpo", rewards, scores, kl, values, mask, 0.1, LM_GRPO, 4, True)
    first = adv[:, 0].view(2, 4)  # KL in the loss: the group is normalized on the scores alone
    torch.testing.assert_close(
        first,
        (scores.view(2, 4) - scores.view(2, 4).mean(1, keepdim=True)) / (scores.view(2, 4).std(1, keepdim=True) + 1e-4),
    )


def test_grpo_kl_in_the_loss_is_the_k3_estimate_times_beta():
    B, R = 4, 3
    g = torch.Generator().manual_seed(0)
    logp, old, ref = (torch.randn(B, R, generator=g) - 2 for _ in range(3))
    mask = torch.ones(B, R)
    mb = RolloutBatch(None, torch.zeros(B, R), old, torch.zeros(B, R), torch.zeros(B, R), torch.zeros(B, R), mask, ref)
    loss, parts = minibatch_loss(logp, torch.zeros(B, R), torch.zeros(B, R), mb, LM_GRPO, 0.2, "clipped", 0.5)
    k3 = (torch.exp(ref - logp) - (ref - logp) - 1).mean()
    torch.testing.assert_close(parts["kl_loss"], k3)
    torch.testing.assert_close(loss, parts["policy_loss"] + 0.5 * k3)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_model_dir("llama", tmp_path_factory.mktemp("llama"))


@pytest.mark.parametrize("algorithm", ["reinforce", "reinforce_baseline", "rloo", "grpo", "dr_grpo", "dapo", "gspo"])
def test_each_online_method_raises_a_rule_reward(llama, algorithm):
    preset, k = PRESETS[algorithm]
    model, tok = load_base(llama)

    def share_of_e(prompts, texts):
        return [sum(c == "e" for c in t) / max(1, len(t)) for t in texts]

    cfg = RLHFConfig(
        steps=40,
        batch_size=16,
        max_new_tokens=8,
        kl_coef=0.01,
        **({"value_lr_scale": 1.0} if ALGORITHMS[algorithm].uses_critic else {}),  # a critic-free one refuses it
        group_size=k,
        kl_in="loss" if algorithm == "grpo" else "reward",
        # DAPO's rollout but dynamic sampling (tested on its own: here the policy soon writes only "e"s, every
        # group's rewards become equal, and dynamic sampling rightly stops the run)
        # (the record's: the trainer applies it; given here explicitly so that the test reads as it runs)
        **{key: v for key, v in ALGORITHMS[algorithm].rollout.items() if key not in ("kl_coef", "dynamic_sampling")},
        dynamic_sampling=False,
    )
    trainer = RLHFTrainer(
        model,
        share_of_e,
        tok,
        cfg,
        replace(preset, learning_rate=1e-2, minibatch_size=8),
        PROMPTS,
        seed=0,
        algorithm=algorithm,
    )
    rows = [trainer.step() for _ in range(40)]
    first = sum(r["objective/score"] for r in rows[:5]) / 5
    last = sum(r["objective/score"] for r in rows[-5:]) / 5
    assert last > first + 0.1, (first, last)
    assert all(math.isfinite(r["objective/kl"]) for r in rows)


def critic_free_trainer(model_dir, algorithm):
    """A trainer of `algorithm`'s preset on the tiny model, rewarding length: 8 replies in groups of its size."""
    preset, k = PRESETS[algorithm]
    model, tok = load_base(model_dir)
    return RLHFTrainer(
        model,
        lambda p, t: [float(len(x)) for x in t],
        tok,
        RLHFConfig(batch_size=8, group_size=k, max_new_tokens=8),
        replace(preset, minibatch_size=8),
        PROMPTS,
        seed=0,
        algorithm=algorithm,
    )


@pytest.mark.parametrize("algorithm", ["rloo", "grpo"])
def test_critic_free_rollouts_take_log_probs_from_the_sampler(llama, algorithm):
    """Without a critic, a rollout's log-probs come from `generate`'s logits instead of a second forward pass: the
    same experience (draws, KL, advantages) as with the forward pass, to float rounding; with a value loss that
    counts (vf_coef > 0) the forward pass and the value head run as before."""
    from rlhf_toy.lm.algorithms import rlhf as rlhf_module

    preset = PRESETS[algorithm][0]
    record = ALGORITHMS[algorithm]
    assert not record.needs_values(preset) and record.needs_values(replace(preset, vf_coef=0.5))
    assert ALGORITHMS["ppo"].needs_values(LM_PPO)
    assert ALGORITHMS["reinforce_baseline"].needs_values(LM_REINFORCE_BASELINE)
    trainer = critic_free_trainer(llama, algorithm)
    tok = trainer.tok
    prompts = trainer.next_prompts()
    runs = {}
    for name, critic in (("sampler", False), ("forward", True)):
        torch.manual_seed(1)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(OnlineAlgorithm, "needs_values", lambda self, p, c=critic: c)
            runs[name] = rlhf_module.make_experience(
                trainer.policy,
                trainer.ref_model,
                trainer.reward_model,
                tok,
                prompts,
                0.1,
                trainer.cfg,
                trainer.ppo,
                record,
            )
    a, b = runs["sampler"].batch, runs["forward"].batch
    assert torch.equal(a.actions, b.actions)
    m = a.mask.bool()
    for x, y in ((a.logprobs, b.logprobs), (a.advantages, b.advantages), (runs["sampler"].kl, runs["forward"].kl)):
        torch.testing.assert_close(x[m], y[m], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("algorithm", ["rloo", "grpo"])
def test_without_a_critic_the_value_head_is_frozen_and_never_run(llama, algorithm):
    """A critic-free update spends nothing on the value head (it is not run, has no gradient, never moves), and
    trains the language model as when the head ran with a zero-weight loss, as it did before."""
    steps = {}
    for name, head_runs in (("frozen", False), ("run", True)):
        trainer = critic_free_trainer(llama, algorithm)
        assert not trainer.policy.critic and not any(p.requires_grad for p in trainer.policy.value_head.parameters())
        head = [p.detach().clone() for p in trainer.policy.value_head.parameters()]
        calls: list[int] = []
        trainer.policy.value_head.register_forward_hook(lambda *a, calls=calls: calls.append(1))
        if head_runs:  # the behaviour before: the head ran and took part in the update with vf_coef 0
            trainer.policy.critic = True
            trainer.policy.value_head.requires_grad_(True)
        trainer.step()
        assert bool(calls) == head_runs
        if not head_runs:
            assert all(torch.equal(a, b) for a, b in zip(head, trainer.policy.value_head.parameters()))
        steps[name] = [p.detach().clone() for p in trainer.policy.lm.parameters()]
    # to float rounding: the gradient norm that clipping reads no longer sums the head's zero gradients
    for a, b in zip(steps["frozen"], steps["run"]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


def test_groups_are_whole_prompts_repeated(llama):
    model, tok = load_base(llama)
    trainer = RLHFTrainer(
        model,
        lambda p, t: [0.0] * len(t),
        tok,
        RLHFConfig(batch_size=8, group_size=4),
        replace(LM_RLOO, minibatch_size=8),
        PROMPTS,
        seed=0,
        algorithm="rloo",
    )
    prompts = trainer.next_prompts()
    assert prompts[:4] == [prompts[0]] * 4 and prompts[4:] == [prompts[4]] * 4 and prompts[0] != prompts[4]


@pytest.mark.parametrize("command", ["reinforce", "reinforce-baseline", "rloo", "grpo"])
def test_online_commands_run_on_the_tiny_run(run_copy, tmp_path, command):
    out = run_copy
    assert stage(command, out, *PPO_TINY) == 0
    name = command.replace("-", "_")
    summary = json.loads((out / name / "summary.json").read_text())
    assert summary["algorithm"] == name and summary["steps"] == 2
    assert (
        stage(
            "evaluate",
            out,
            "--policies",
            name,
            "--eval_prompts",
            "8",
            "--best_of",
            "",
            "--judge",
            "tests.judges:length",
        )
        == 0
    )


def test_dpo_raises_held_out_implicit_reward_accuracy(run_copy, tmp_path):
    out = run_copy
    assert stage("dpo", out, "--epochs", "2", "--batch_size", "16", "--learning_rate", "1e-3") == 0
    summary = json.loads((out / "dpo" / "summary.json").read_text())
    acc = summary["heldout_accuracy"]
    assert acc[-1] > acc[0], acc
    assert summary["loss_last"] < summary["loss_first"]
    assert (out / "dpo" / "policy" / "config.json").is_file()


@pytest.mark.parametrize(
    "command,extra,message",
    [
        ("rloo", ["--group_size", "1"], "at least 2 samples per prompt"),
        ("grpo", ["--group_size", "1"], "at least 2 samples per prompt"),
        ("rloo", ["--group_size", "3"], "not a multiple of group_size"),
    ],
)
def test_bad_group_settings(run_copy, tmp_path, capsys, command, extra, message):
    out = run_copy
    assert stage(command, out, *PPO_TINY, *extra) == 2
    assert message in capsys.readouterr().err
    assert not (out / command).exists()


def test_dpo_without_preference_pairs(run_copy, tmp_path, capsys):
    out = run_copy
    shutil.rmtree(out / "preferences")
    assert stage("dpo", out) == 2
    assert "no preferences" in capsys.readouterr().err


# The comparison ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["bon", "rl"])
def test_gao_fit_recovers_the_functional_form(form):
    from rlhf_toy.lm.pipeline.frontier import fit_gao

    d = torch.linspace(0.2, 3.0, 12).numpy()
    alpha, beta = 0.8, 0.3
    r = d * (alpha - beta * (d if form == "bon" else torch.log(torch.tensor(d)).numpy()))
    fit = fit_gao(d, r, form)
    assert fit["alpha"] == pytest.approx(alpha, rel=1e-6) and fit["beta"] == pytest.approx(beta, rel=1e-6)
    peak = alpha / (2 * beta) if form == "bon" else math.exp(alpha / beta - 1)
    assert fit["peak_d"] == pytest.approx(peak, rel=1e-6)


def test_compare_runs_every_method_and_draws_the_frontier(run_copy, tmp_path):
    out = run_copy
    assert (
        stage(
            "compare",
            out,
            "--methods",
            "ppo,reinforce,rloo,grpo,dpo",
            "--seeds",
            "0,1",
            "--episodes",
            "16",
            "--batch_size",
            "8",
            "--eval_prompts",
            "8",
            "--best_of",
            "1,2,4",
            "--judge",
            "tests.judges:length",
        )
        == 0
    )
    report = json.loads((out / "compare.json").read_text())
    assert set(report["methods"]) == {"ppo", "reinforce", "rloo", "grpo", "dpo"}
    assert all(m["seeds"] == 2 for m in report["methods"].values())
    assert report["methods"]["ppo"]["fit"] is not None and report["methods"]["dpo"]["fit"] is None
    assert (out / "compare.png").is_file() and "best-of-4" in (out / "compare.md").read_text()


def test_a_named_comparison_passes_its_beta_and_minibatch_and_keeps_the_default_outputs(run_copy, tmp_path):
    out = run_copy
    assert (
        stage(
            "compare",
            out,
            "--methods",
            "ppo",
            "--seeds",
            "0",
            "--episodes",
            "16",
            "--batch_size",
            "8",
            "--kl_coef",
            "0.05",
            "--minibatch_size",
            "8",
            "--name",
            "frontier",
            "--eval_prompts",
            "4",
            "--best_of",
            "1,2",
            "--judge",
            "tests.judges:length",
        )
        == 0
    )
    ran = json.loads((out / "frontier_ppo_s0" / "summary.json").read_text())
    assert ran["config"]["kl_coef"] == 0.05 and ran["ppo"]["minibatch_size"] == 8 and ran["config"]["steps"] == 2
    report = json.loads((out / "frontier.json").read_text())
    expected = {"episodes": 16, "batch_size": 8, "kl_coef": 0.05, "minibatch_size": 8, "seeds": [0]}
    assert {k: report["settings"][k] for k in expected} == expected
    assert list(report["settings"]["remedies"]) == ["none"]
    assert (out / "frontier.png").is_file() and (out / "frontier.md").is_file()
    assert not (out / "compare.json").exists() and not (out / "compare_ppo_s0").exists()


@pytest.mark.parametrize(
    "flag,value,fix",
    [
        ("--name", "../elsewhere", "letters, digits"),
        ("--kl_coef", "-1", ">= 0"),
        ("--minibatch_size", "128", "between 1 and batch_size (64)"),
    ],
)
def test_a_comparison_with_a_bad_setting_is_one_error_line(run_dir, tmp_path, flag, value, fix, capsys):
    assert stage("compare", tmp_path / "run", flag, value) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and flag.lstrip("-") in err[0] and fix in err[0]


def test_a_gao_peak_far_beyond_the_fitted_range_is_reported_as_such():
    from rlhf_toy.lm.pipeline.frontier import fit_gao, format_fit

    d = torch.linspace(0.2, 1.5, 12).numpy()
    inside = fit_gao(d, d * (0.8 - 0.3 * d), "bon")  # peak at d = 1.33, inside the data
    assert inside["max_d"] == pytest.approx(1.5)
    assert format_fit(inside)[2] == f"{inside['peak_gain']:+.3f} ({inside['peak_d'] ** 2:.1f})"
    far = fit_gao(d, d * (0.5 - 0.01 * torch.log(torch.tensor(d)).numpy()), "rl")  # peak at d = e^49
    assert format_fit(far)[2] == "beyond the data (KL > 9)"
    assert format_fit(fit_gao(d, 0.5 * d + 0.1 * d * d, "bon"))[2] == "none"  # beta < 0: no peak


# The algorithm table --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_algorithm_of_the_table_has_its_command_its_comparison_row_its_docs_and_runs_a_step(llama, name):
    """Walks the table: the command (with the record's preset and group size as its defaults), `compare`'s
    methods, the generated reference page, and one step on a tiny Llama."""
    from pathlib import Path

    from rlhf_toy.cli import parse_configs
    from rlhf_toy.lm.pipeline.cli import COMMANDS
    from rlhf_toy.lm.pipeline.compare import METHODS

    record = ALGORITHMS[name]
    cmd = COMMANDS[record.command]
    classes, _, defaults = cmd.load()
    _, rl, ppo, _, _ = parse_configs(classes, [], prog=record.command, help=cmd.help, defaults=defaults)
    assert ppo == record.preset and rl.group_size == record.default_group_size
    assert all(getattr(rl, key) == value for key, value in record.rollout.items())
    assert name in METHODS
    page = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "algorithms.md").read_text()
    assert f"`rlhf-toy {record.command}`" in page and record.label in page
    model, tok = load_base(llama)
    k = record.default_group_size
    trainer = RLHFTrainer(
        model,
        lambda p, t: [float(len(x)) for x in t],
        tok,
        RLHFConfig(batch_size=4 * k if k > 1 else 4, group_size=k, max_new_tokens=4),
        replace(record.preset, minibatch_size=4 if k == 1 else k),
        PROMPTS,
        seed=0,
        algorithm=name,
    )
    row = trainer.step()
    assert row["step"] == 1 and math.isfinite(row["objective/kl"]) and "ppo/policy_loss" in row


@pytest.mark.parametrize("name", list(ALGORITHMS))
@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_every_algorithm_takes_its_kl_in_the_loss(llama, name, estimator):
    """The KL's place is a setting of every online algorithm: in the loss, the rewards carry no KL and the update
    reports a KL loss term."""
    model, tok = load_base(llama)
    record = ALGORITHMS[name]
    k = record.default_group_size
    cfg = RLHFConfig(  # a beta for every one: DAPO's record has none (kl_coef 0)
        batch_size=4 * k if k > 1 else 4,
        group_size=k,
        max_new_tokens=4,
        kl_coef=0.1,
        kl_in="loss",
        kl_estimator=estimator,
        mask_truncated=False,  # DAPO's record masks replies cut at the limit: at 4 tokens that would be all of them
    )
    trainer = RLHFTrainer(
        model,
        lambda p, t: [float(len(x)) for x in t],
        tok,
        cfg,
        replace(record.preset, minibatch_size=4 if k == 1 else k),
        PROMPTS,
        seed=0,
        algorithm=name,
    )
    trainer.step()  # the first update moves the policy off the reference
    row = trainer.step()
    assert row["ppo/kl_loss"] > 0 and math.isfinite(row["objective/kl"])


def test_a_minibatch_that_would_split_groups_is_refused_with_the_fix(run_copy, tmp_path, capsys):
    out = run_copy
    assert stage("grpo", out, *PPO_TINY, "--minibatch_size", "6") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "minibatch_size (6) is not a multiple of group_size (4)" in err[0]
    assert "--minibatch_size 4" in err[0] and not (out / "grpo").exists()


def test_the_old_kl_in_loss_flag_names_its_new_spelling(run_copy, tmp_path, capsys):
    out = run_copy
    assert stage("grpo", out, *PPO_TINY, "--kl_in_loss") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--kl_in_loss was renamed --kl_in loss" in err[0]


def test_compare_with_several_betas_runs_one_variant_per_beta(run_copy, tmp_path):
    """The lesson's over-optimization warning (formerly `overopt`) is a comparison of PPO at several betas."""
    out = run_copy
    assert (
        stage(
            "compare",
            out,
            "--methods",
            "ppo,dpo",
            "--seeds",
            "0",
            "--episodes",
            "16",
            "--batch_size",
            "8",
            "--kl_coef",
            "0,0.1",
            "--name",
            "overopt",
            "--eval_prompts",
            "4",
            "--best_of",
            "1,2",
            "--judge",
            "tests.judges:length",
        )
        == 0
    )
    report = json.loads((out / "overopt.json").read_text())
    assert list(report["methods"]) == ["ppo_beta0", "ppo_beta0.1", "dpo"]
    assert report["settings"]["kl_coef"] == [0.0, 0.1]
    assert json.loads((out / "overopt_ppo_beta0.1_s0" / "summary.json").read_text())["config"]["kl_coef"] == 0.1
    assert "| ppo_beta0.1 |" in (out / "overopt.md").read_text()


def test_the_old_overopt_command_and_old_flags_say_what_replaced_them(tmp_path, capsys):
    assert stage("overopt", tmp_path / "run") == 2
    assert "compare --methods ppo" in capsys.readouterr().err
    assert stage("ppo", tmp_path / "run", "--ppo_dir", "x") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--ppo_dir was renamed --policy_dir" in err[0]


def test_a_policy_directory_written_before_the_rename_is_still_read(run_copy, tmp_path):
    """0.1 wrote a run's summary as ppo.json: `evaluate` still reads the algorithm's label from it."""
    out = run_copy
    assert stage("rloo", out, *PPO_TINY) == 0
    (out / "rloo" / "summary.json").rename(out / "rloo" / "ppo.json")
    assert (
        stage(
            "evaluate",
            out,
            "--policies",
            "rloo",
            "--eval_prompts",
            "4",
            "--best_of",
            "",
            "--judge",
            "tests.judges:length",
        )
        == 0
    )
    names = [r["name"] for r in json.loads((out / "eval.json").read_text())["rows"]]
    assert "RLOO (rloo)" in names


def test_an_output_directory_holds_one_kind_of_run_and_a_refusal_leaves_nothing(run_copy, capsys):
    out = run_copy
    assert stage("ppo", out, *PPO_TINY) == 0
    before = sorted(p.name for p in (out / "ppo").iterdir())
    assert stage("dpo", out, "--policy_dir", "ppo") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a finished ppo run; pass another --policy_dir for dpo" in err[0]
    assert sorted(p.name for p in (out / "ppo").iterdir()) == before
    assert stage("grpo", out, *PPO_TINY, "--policy_dir", "ppo") == 2
    assert stage("ppo", out, *PPO_TINY, "--resume", "--policy_dir", "fresh") == 2  # nothing to resume
    assert "nothing to resume" in capsys.readouterr().err
    assert not (out / "fresh").exists()
