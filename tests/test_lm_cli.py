"""Every stage of the LM pipeline through its CLI on a tiny config, and each kind of bad input."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_toy.errors import run_cli
from rlhf_toy.lm.pipeline.cli import main
from tests.helpers import PPO_TINY, stage

pytestmark = pytest.mark.integration  # trains or loads models, or runs whole commands

ROOT = Path(__file__).resolve().parents[1]


def test_each_stage_writes_its_outputs(run_dir):
    from datasets import load_from_disk
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    assert (run_dir / "tokenizer" / "tokenizer.json").is_file()
    AutoModelForCausalLM.from_pretrained(run_dir / "sft")
    sft = json.loads((run_dir / "sft.json").read_text())
    assert 0 < sft["entropy_floor"] < sft["eval_loss"] < 2 and 0 <= sft["on_topic_rate"] <= 1
    ds = load_from_disk(str(run_dir / "preferences"))
    assert {"prompt", "chosen", "rejected", "chosen_score", "rejected_score", "label"} <= set(ds.column_names)
    assert len(ds) > 40 and all(c != r for c, r in zip(ds["chosen_score"], ds["rejected_score"]))
    rm = AutoModelForSequenceClassification.from_pretrained(run_dir / "reward_model")
    assert rm.config.reward_std > 0
    reward = json.loads((run_dir / "reward.json").read_text())
    assert 0 <= reward["heldout_accuracy"] <= 1 and "heldout_correlation" in reward


def test_sample_command_chats(run_dir):
    p = subprocess.run(
        [sys.executable, "-m", "rlhf_toy.lm", "sample", "--model_dir", str(run_dir / "sft"), "--n", "2"],
        input="My printer won't start.\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("bot:") == 2


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_preference_file_without_the_columns(run_copy, tmp_path, capsys):
    bad = write_jsonl(tmp_path / "prefs.jsonl", [{"prompt": "hi", "answer": "yo"}])
    out = run_copy
    shutil.rmtree(out / "reward_model")
    assert stage("reward", out, "--preferences_file", str(bad)) == 2
    assert "lacks the column(s) ['chosen', 'rejected']" in capsys.readouterr().err
    assert not (out / "reward_model").exists()


def test_empty_dataset(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    assert stage("tokenizer", tmp_path / "run", "--data", str(tmp_path / "empty.jsonl")) == 2
    assert "is empty" in capsys.readouterr().err
    assert not (tmp_path / "run" / "tokenizer").exists()


def test_prompt_longer_than_the_context(tmp_path, capsys):
    rows = [{"prompt": f"short question {i}", "response": f"short answer {i}"} for i in range(30)]
    rows.append({"prompt": " ".join(["word"] * 200), "response": "ok"})
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    assert stage("tokenizer", tmp_path / "run", "--data", str(data)) == 0
    assert stage("sft", tmp_path / "run", "--data", str(data)) == 2
    assert "too long for the context of 64" in capsys.readouterr().err
    assert not (tmp_path / "run" / "sft").exists()


def copy_with_foreign_tokenizer(run_copy, tmp_path, model_subdir):
    """The run's copy `run_copy` (never the session's run itself), its `model_subdir` given a tokenizer of
    another vocabulary."""
    out = run_copy
    assert stage("tokenizer", tmp_path / "other", "--vocab_size", "300") == 0
    for f in (tmp_path / "other" / "tokenizer").iterdir():
        shutil.copy(f, out / model_subdir / f.name)
    return out


def test_tokenizer_that_does_not_match_the_model(run_copy, tmp_path, capsys):
    out = copy_with_foreign_tokenizer(run_copy, tmp_path, "sft")
    assert stage("preferences", out, "--judge", "tests.judges:length") == 2
    assert "does not match" in capsys.readouterr().err


@pytest.mark.parametrize(
    "judge,message",
    [
        ("no_such_module_xyz:score", "cannot import judge"),
        ("tests.judges:nope", "cannot import judge"),
        ("tests.judges:broken", "not numbers"),
        ("missing_colon", "must look like module:function"),
    ],
)
def test_bad_judges(judge, message, run_copy, tmp_path, capsys):
    out = run_copy
    shutil.rmtree(out / "preferences")
    assert stage("preferences", out, "--judge", judge) == 2
    assert message in capsys.readouterr().err
    assert not (out / "preferences").exists()


def test_custom_judges_and_data(tmp_path):
    from rlhf_toy.lm.data.tasks import get_task

    rows = [{"prompt": f"q{i}", "chosen": f"a{i} q{i}", "rejected": "x"} for i in range(20)]
    data = write_jsonl(tmp_path / "trl.jsonl", rows)
    task = get_task("helpdesk", str(data), "tests.judges:prompt_overlap")
    assert len(task.train) + len(task.eval) == 20
    assert task.judge(["q1 hello"], ["q1 hello there"]) == [2.0]
    assert get_task("chatterbot", judge="tests.judges:length").judge(["a"], ["abc"]) == [3.0]


def test_cli_exit_code_and_one_line(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "rlhf_toy.lm", "sft", "--run_dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert p.returncode == 2 and "no tokenizer in" in p.stderr and "Traceback" not in p.stderr


def test_ppo_evaluate_and_resume(run_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    base = ["--run_dir", str(out), "--progress", "False", "--threads", "1"]
    assert run_cli(main, ["ppo", *base, *PPO_TINY, "--save_every", "1"]) == 0
    AutoModelForCausalLM.from_pretrained(out / "ppo" / "policy")  # plain HF loading
    rows = [json.loads(x) for x in (out / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "objective/score",
        "objective/gold",
        "objective/kl",
        "objective/beta",
        "policy/entropy",
        "ppo/clip_fraction",
        "ppo/approx_kl",
        "ppo/value_loss",
        "ppo/explained_variance",
        "policy/response_length",
        "policy/eos_rate",
        "time/step_s",
    ):
        assert key in rows[0]
    assert (out / "ppo" / "curves.png").stat().st_size > 5000
    # Resume from the step-2 checkpoint for one more step.
    assert run_cli(main, ["ppo", *base, *PPO_TINY[2:], "--steps", "3", "--resume"]) == 0
    rows = [json.loads(x) for x in (out / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert (
        run_cli(
            main,
            [
                "evaluate",
                *base,
                "--eval_prompts",
                "6",
                "--best_of",
                "2,4",
                "--max_new_tokens",
                "16",
                "--judge",
                "tests.judges:length",
            ],
        )
        == 0
    )
    table = (out / "eval.md").read_text()
    for name in ("SFT", "best-of-2", "best-of-4", "PPO (ppo)"):
        assert f"| {name} |" in table
    names = [r["name"] for r in json.loads((out / "eval.json").read_text())["rows"]]
    assert names == ["SFT", "best-of-2", "best-of-4", "PPO (ppo)"]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--kl_coef", "-0.1"], "kl_coef must be >= 0"),
        (["--kl_target", "-1"], "kl_target must be > 0"),
        (["--batch_size", "100000"], "larger than the prompt set"),
        (["--resume"], "nothing to resume"),
    ],
)
def test_ppo_bad_input(extra, message, run_dir, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    args = ["ppo", "--run_dir", str(out), "--progress", "False", "--steps", "1", "--judge", "tests.judges:length"]
    assert run_cli(main, [*args, *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (out / "ppo" / "policy").exists()


def test_ppo_refuses_a_reward_model_with_another_tokenizer(run_copy, tmp_path, capsys):
    out = copy_with_foreign_tokenizer(run_copy, tmp_path, "reward_model")
    assert run_cli(main, ["ppo", "--run_dir", str(out), "--progress", "False", "--steps", "1"]) == 2
    assert "does not match the reward model" in capsys.readouterr().err


def test_one_thread_by_default_and_every_stage_line_says_its_threads(tmp_path, capsys):
    """The default runs alike on a quiet or a busy machine (two processes that each spin two threads slow each
    other 10-100x); the numbers depend on the thread count, so each stage's line says it."""
    from rlhf_toy.lm.pipeline.run import RunConfig

    assert RunConfig().threads == 1
    capsys.readouterr()
    assert run_cli(main, ["tokenizer", "--run_dir", str(tmp_path / "run"), "--progress", "False",
                          "--vocab_size", "400", "--max_train_pairs", "500"]) == 0  # fmt: skip
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["stage"] == "tokenizer" and line["threads"] == 1
