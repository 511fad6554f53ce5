"""The reward-hacking lab: ensemble objectives against hand computations, WARM's averaging and its check, the
length penalty and the gain-length correlation, the over-optimization reading of a training curve, and the stages
and `compare --remedies` end to end on the session's tiny run."""

import json
import math
import shutil

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from rlhf_toy.errors import UserError
from rlhf_toy.lm.algorithms.reward import RewardConfig, bootstrap_pairs, member_seeds
from rlhf_toy.lm.models.reward_ensemble import (
    ScoredReward,
    average_weights,
    combine_scores,
    load_scored_reward,
    weights_digest,
)
from rlhf_toy.lm.pipeline.evaluate import evaluation_table, length_link
from rlhf_toy.lm.pipeline.frontier import gold_peak
from rlhf_toy.lm.pipeline.remedies import REMEDIES, member_config
from rlhf_toy.lm.pipeline.run import RunConfig
from tests.helpers import PPO_TINY, stage

# -- objectives ------------------------------------------------------------------------------------------------


def test_the_three_objectives_against_a_hand_computation():
    scores = torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, -1.0]])  # [K=2, B=3]
    assert combine_scores(scores, "mean").tolist() == [2.0, 0.0, 0.5]
    assert combine_scores(scores, "worst").tolist() == [1.0, 0.0, -1.0]
    # population variance over 2 members: ((a - b) / 2)^2 -> 1, 0, 2.25; mean - 0.5 * var
    assert combine_scores(scores, "uncertainty", 0.5).tolist() == pytest.approx([1.5, 0.0, 0.5 - 1.125])
    assert torch.equal(combine_scores(scores, "uncertainty", 0.0), combine_scores(scores, "mean"))


class Fixed:
    """A stand-in member for the objective arithmetic alone (the stages below use real reward models)."""

    def __init__(self, values):
        self.values = torch.tensor(values)

    def score_texts(self, prompts, responses):
        return self.values


def test_scored_reward_combines_members_then_subtracts_the_length_penalty():
    reward = ScoredReward([Fixed([1.0, 2.0]), Fixed([3.0, 0.0])], "worst", length_penalty=0.1)
    out = reward.score_texts(["p", "p"], ["one two three", "one"])
    assert out.tolist() == pytest.approx([1.0 - 0.3, 0.0 - 0.1])
    assert reward.member_texts(["p", "p"], ["a", "b"]).shape == (2, 2)


@pytest.mark.parametrize("objective", ["worst", "uncertainty"])
def test_a_conservative_objective_on_one_model_is_refused(objective):
    with pytest.raises(UserError, match="reward --ensemble"):
        ScoredReward([Fixed([1.0])], objective)


def test_member_seeds_ensemble_members_differ_warm_members_share_their_start():
    ens = member_seeds(7, RewardConfig(ensemble=3))
    assert [(m.init, m.order) for m in ens] == [(7, 7), (8, 8), (9, 9)]
    warm = member_seeds(7, RewardConfig(warm=3))
    assert [(m.init, m.order) for m in warm] == [(7, 7), (7, 8), (7, 9)]
    shared = member_seeds(7, RewardConfig(ensemble=2, shared_init=True))
    assert [m.init for m in shared] == [7, 7]
    assert [(m.init, m.order) for m in member_seeds(7, RewardConfig())] == [(7, 7)]


def test_a_bootstrap_resample_is_seeded_and_keeps_the_size():
    pairs = {"prompt": list("abcdefgh"), "chosen": list("ABCDEFGH"), "rejected": list("12345678")}
    a, b = bootstrap_pairs(pairs, 1), bootstrap_pairs(pairs, 1)
    assert a == b and len(a["prompt"]) == 8 and len(set(a["prompt"])) < 8
    assert all(pairs["chosen"][pairs["prompt"].index(p)] == c for p, c in zip(a["prompt"], a["chosen"]))


# -- WARM ------------------------------------------------------------------------------------------------------


def tiny_classifier(seed):
    from transformers import GPT2Config

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=50, n_positions=32, n_embd=16, n_layer=1, n_head=2, num_labels=1, pad_token_id=0)
    return AutoModelForSequenceClassification.from_config(cfg)


def test_warm_averages_the_weights_of_members_of_one_initialization():
    a, b = tiny_classifier(0), tiny_classifier(0)
    init = weights_digest(a)
    assert weights_digest(b) == init
    with torch.no_grad():
        for p in b.parameters():
            p.add_(1.0)  # "fine-tuned" differently
    a.config.reward_init = b.config.reward_init = init
    avg = average_weights([a, b])
    for pa, pb, pm in zip(a.parameters(), b.parameters(), avg.parameters()):
        assert torch.allclose(pm, (pa + pb) / 2)
    assert avg.config.warm_members == 2


def test_warm_refuses_members_of_different_initializations():
    a, b = tiny_classifier(0), tiny_classifier(1)
    a.config.reward_init, b.config.reward_init = weights_digest(a), weights_digest(b)
    with pytest.raises(UserError, match="one initialization"):
        average_weights([a, b], ["member_0", "member_1"])


# -- length and over-optimization readings ---------------------------------------------------------------------


def test_length_link_against_a_hand_computation():
    ref = {"gold_scores": [0.0, 0.0, 0.0, 0.0], "words": [5, 5, 5, 5]}
    row = {"gold_scores": [0.1, 0.2, 0.3, 0.4], "words": [6, 7, 8, 9]}
    link = length_link(row, ref)
    assert link["words_gain"] == pytest.approx(2.5) and link["gain_length_r"] == pytest.approx(1.0)
    flat = {"gold_scores": [0.1, 0.2, 0.3, 0.4], "words": [5, 5, 5, 5]}
    assert math.isnan(length_link(flat, ref)["gain_length_r"])


def eval_row(name, gold, words):
    return {
        "name": name,
        "gold": float(np.mean(gold)),
        "gold_se": 0.01,
        "gold_scores": gold,
        "rm_score": 0.0,
        "kl": 0.0,
        "on_topic": None,
        "distinct_2": 0.5,
        "repetition": 0.0,
        "length_words": float(np.mean(words)),
        "words": words,
        "samples": [],
    }


def test_the_evaluation_table_warns_when_gains_go_with_longer_replies():
    sft = eval_row("SFT", [0.0, 0.0, 0.0, 0.0], [5, 5, 5, 5])
    longer = eval_row("PPO", [0.1, 0.2, 0.3, 0.4], [6, 7, 8, 9])
    same = eval_row("DPO", [0.1, 0.2, 0.3, 0.4], [5, 4, 5, 6])
    table = evaluation_table([sft, longer, same])
    assert "| 1.00 |" in table
    warnings = [line for line in table.splitlines() if line.startswith("**Length.**")]
    assert len(warnings) == 1 and "PPO" in warnings[0] and "+2.5 words" in warnings[0]


def curve(gold, score):
    return [
        {"objective/gold": g, "objective/score": s, "objective/kl": 0.1 * i}
        for i, (g, s) in enumerate(zip(gold, score))
    ]


def test_gold_peak_reads_the_peak_the_drop_and_the_proxy_meanwhile():
    gold = [0.0] * 5 + [1.0] * 5 + [0.5] * 10  # smoothed over 5 steps: peaks at 1.0 at step 10
    score = list(range(20))
    o = gold_peak([curve(gold, score), curve(gold, score)])
    assert o["peak_gold"] == pytest.approx(1.0) and o["peak_step"] == 10
    assert o["final_gold"] == pytest.approx(0.5) and o["gold_drop"] == pytest.approx(0.5)
    assert o["proxy_after_peak"] == pytest.approx(10.0)


def test_every_remedy_names_a_known_objective_and_setting():
    for r in REMEDIES.values():
        cfg = r.run_config(RunConfig())
        assert cfg.reward_objective in ("mean", "worst", "uncertainty")
        assert set(r.rl) <= {"kl_in", "kl_estimator"}
        assert r.ranks_best_of_n == (not r.rl)


# -- the stages end to end -------------------------------------------------------------------------------------


def test_an_ensemble_trains_saves_and_drives_ppo_and_evaluation(run_copy, capsys):
    out = run_copy
    assert stage("reward", out, "--ensemble", "2", "--reward_dir", "ens", "--reward_objective", "worst") == 0
    listing = json.loads((out / "ens" / "ensemble.json").read_text())
    assert listing["members"] == ["member_0", "member_1"] and listing["init"] == "seeded"
    report = json.loads((out / "ens.json").read_text())
    assert [m["name"] for m in report["members"]] == ["member_0", "member_1"]
    assert all(0 <= m["heldout_accuracy"] <= 1 for m in report["members"])
    assert report["heldout_accuracy"] == report["ensemble_worst"]["heldout_accuracy"]
    a, b = (AutoModelForSequenceClassification.from_pretrained(out / "ens" / m) for m in listing["members"])
    assert a.config.reward_init != b.config.reward_init  # different seeds, different heads
    # member 0 is the run's single reward model of the same seed and settings
    single = AutoModelForSequenceClassification.from_pretrained(out / "reward_model")
    assert weights_digest(a) == weights_digest(single)
    flags = ["--reward_dir", "ens", "--reward_objective", "uncertainty", "--uncertainty_coef", "0.5"]
    assert stage("ppo", out, *PPO_TINY, *flags, "--policy_dir", "ppo_ens") == 0
    assert stage("evaluate", out, *flags, "--policies", "ppo_ens", "--eval_prompts", "4", "--best_of", "1,2") == 0
    assert "gain-length r" in (out / "eval.md").read_text()


def test_warm_trains_members_from_one_start_and_averages_them(run_copy):
    out = run_copy
    assert stage("reward", out, "--warm", "2", "--reward_dir", "warm", "--bootstrap") == 0
    report = json.loads((out / "warm.json").read_text())
    assert report["warm_members"] == 2 and len(report["members"]) == 2 and "heldout_accuracy" in report
    model = AutoModelForSequenceClassification.from_pretrained(out / "warm")
    assert model.config.warm_members == 2
    assert stage("ppo", out, *PPO_TINY, "--reward_dir", "warm", "--policy_dir", "ppo_warm") == 0


def test_warm_from_an_ensemble_needs_one_initialization(run_copy, capsys):
    out = run_copy
    assert stage("reward", out, "--ensemble", "2", "--reward_dir", "ens") == 0
    capsys.readouterr()
    assert stage("reward", out, "--warm_from", "ens", "--reward_dir", "w") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "one initialization" in err[0] and not (out / "w").exists()
    assert stage("reward", out, "--ensemble", "2", "--shared_init", "--reward_dir", "ens2") == 0
    assert stage("reward", out, "--warm_from", "ens2", "--reward_dir", "w2") == 0
    assert json.loads((out / "w2.json").read_text())["warm_members"] == 2


def test_compare_runs_each_remedy_and_ranks_best_of_n_by_each_reward(run_copy):
    """The lab end to end, tiny: the ensemble and WARM models are trained with the run's reward settings."""
    out = run_copy
    assert member_config(RunConfig(run_dir=str(out)), "ensemble")[0].min_steps == 10  # the tiny run's settings
    args = ["--methods", "ppo", "--seeds", "0", "--episodes", "16", "--batch_size", "8", "--eval_prompts", "4"]
    args += ["--best_of", "1,2", "--judge", "tests.judges:length", "--name", "lab", "--max_new_tokens", "16"]
    remedies = "none,ensemble_worst,warm,length,kl_k3_loss"
    assert stage("compare", out, *args, "--remedies", remedies) == 0
    assert (out / "reward_ensemble" / "ensemble.json").is_file() and (out / "reward_warm" / "config.json").is_file()
    report = json.loads((out / "lab.json").read_text())
    assert list(report["methods"]) == ["ppo", "ppo_ensemble_worst", "ppo_warm", "ppo_length", "ppo_kl_k3_loss"]
    assert list(report["best_of_n_by_reward"]) == ["none", "ensemble_worst", "warm", "length"]
    assert report["methods"]["ppo"]["overoptimization"]["peak_step"] >= 1
    summary = json.loads((out / "lab_ppo_kl_k3_loss_s0" / "summary.json").read_text())
    assert summary["config"]["kl_in"] == "loss" and summary["config"]["kl_estimator"] == "k3"
    assert "Best-of-n ranked by each remedy's reward" in (out / "lab.md").read_text()
    assert (out / "lab.png").is_file()


# -- bad input -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--ensemble", "0"], "ensemble"),
        (["--warm", "0"], "warm"),
        (["--ensemble", "2", "--warm", "2"], "warm"),
        (["--reward_objective", "worst"], "--ensemble"),
        (["--ensemble", "1", "--reward_objective", "uncertainty"], "--ensemble"),
        (["--ensemble", "2", "--uncertainty_coef", "-1"], "uncertainty_coef"),
        (["--length_penalty", "-0.1"], "length_penalty"),
        (["--reward_objective", "median"], "reward_objective"),
        (["--warm_from", "reward_model"], "ensemble directory"),
    ],
)
def test_bad_reward_settings_are_one_line_each(run_copy, capsys, extra, message):
    assert stage("reward", run_copy, *extra, "--reward_dir", "bad") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err
    assert not (run_copy / "bad").exists()


def test_a_conservative_objective_on_one_reward_model_stops_ppo_before_sampling(run_copy, capsys):
    assert stage("ppo", run_copy, *PPO_TINY, "--reward_objective", "worst") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "one model" in err[0] and "--ensemble" in err[0]


def test_a_damaged_ensemble_is_one_line(run_copy, capsys):
    out = run_copy
    assert stage("reward", out, "--ensemble", "2", "--reward_dir", "ens") == 0
    shutil.rmtree(out / "ens" / "member_1")
    capsys.readouterr()
    assert stage("ppo", out, *PPO_TINY, "--reward_dir", "ens") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lacks its member member_1" in err[0]


def test_an_ensemble_member_of_another_tokenizer_is_refused(run_copy, tmp_path):
    out = run_copy
    assert stage("reward", out, "--ensemble", "2", "--reward_dir", "ens") == 0
    vocab = out / "ens" / "member_1" / "tokenizer.json"
    tok = json.loads(vocab.read_text())
    model_vocab = tok["model"]["vocab"]
    first, second = list(model_vocab)[:2]
    model_vocab[first], model_vocab[second] = model_vocab[second], model_vocab[first]
    vocab.write_text(json.dumps(tok))
    from rlhf_toy.lm.models.chat import load_tokenizer

    with pytest.raises(UserError, match="another tokenizer"):
        load_scored_reward(out / "ens", load_tokenizer(out / "sft"))


def test_a_length_penalty_on_a_program_reward_is_refused(tmp_path):
    from rlhf_toy.lm.pipeline.stages import task_reward

    run = RunConfig(run_dir=str(tmp_path), task="arithmetic", length_penalty=0.1, progress=False, threads=1)
    with pytest.raises(UserError, match="program"):
        task_reward(run, run.start(), None, torch.device("cpu"))


def test_resume_refuses_another_objective_or_length_penalty(run_copy, capsys):
    out = run_copy
    assert stage("ppo", out, *PPO_TINY, "--save_every", "1") == 0
    capsys.readouterr()
    assert stage("ppo", out, *PPO_TINY, "--steps", "3", "--resume", "--length_penalty", "0.1") == 2
    assert "--length_penalty 0.1 (saved: 0.0)" in capsys.readouterr().err
    assert stage("ppo", out, *PPO_TINY, "--steps", "3", "--resume") == 0


@pytest.mark.parametrize("remedies, message", [("nope", "names from none,"), ("none,none", "distinct names")])
def test_bad_remedies_are_one_line(tmp_path, capsys, remedies, message):
    assert stage("compare", tmp_path / "run", "--remedies", remedies) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
