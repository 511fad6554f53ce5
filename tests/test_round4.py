"""The fourth reliability round (issue 37): each case failed on the main of 2026-12-06 and holds now."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_toy.errors import UserError, run_cli
from tests.helpers import PPO_TINY, stage

ROOT = Path(__file__).resolve().parents[1]


def one_error(capsys, *needles):
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: ") and all(n in err[-1] for n in needles), err
    assert not any("Traceback" in line for line in err), err
    return err[-1]


# 1. `label --out` naming a file that is not a label log: refused before a byte of it changes
@pytest.mark.parametrize(
    "name,content",
    [
        ("prefs.jsonl", b'{"prompt": "a", "chosen": "b", "rejected": "c"}\n' * 3 + b'{"prompt": "d", "chosen": "e"}'),
        ("notes.txt", b"remember to buy milk"),
        ("half.jsonl", b'{"pair_id": "3f2a", "prompt": "hi", "labeler": "ana", "choice": "left"}\nnot a label row'),
    ],
)
def test_a_label_log_that_is_not_one_is_refused_untouched(tmp_path, name, content):
    from rlhf_toy.lm.labeling.store import LabelLog

    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(UserError, match="is not a label log"):
        LabelLog(path).open()
    assert path.read_bytes() == content


def test_a_label_logs_partial_last_line_from_a_kill_is_still_cut(tmp_path, capsys):
    from rlhf_toy.lm.labeling.store import LabelLog, label_row

    row = label_row("0123456789abcdef", "hi", "a", "b", "left", "ana", "m", None)
    path = tmp_path / "human_preferences.jsonl"
    whole = (json.dumps(row) + "\n").encode()
    path.write_bytes(whole + whole[:30])
    state = LabelLog(path).open()
    assert path.read_bytes() == whole and state.decided == 1
    assert "dropped a partial last line (30 bytes)" in capsys.readouterr().err


# 2. a label log is read as labels whatever its name; `label --out` names a .jsonl file
def test_a_label_log_named_json_is_still_read_as_labels(tmp_path):
    from rlhf_toy.lm.labeling.store import label_row, retraction_row
    from rlhf_toy.lm.pipeline.label import LabelConfig
    from rlhf_toy.lm.pipeline.rundir import RunDir

    rows = [
        label_row("0000000000000001", "p1", "a", "b", "tie", "ana", "m", None),
        label_row("0000000000000002", "p2", "c", "d", "skip", "ana", "m", None),
        label_row("0000000000000003", "p3", "e", "f", "right", "ana", "m", None),
        retraction_row("0000000000000003", "ana"),
        label_row("0000000000000004", "p4", "g", "h", "left", "ana", "m", None),
    ]
    path = tmp_path / "labels.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = RunDir(tmp_path).load_preferences(str(path))
    assert pairs["prompt"] == ["p1", "p4"] and pairs["label"] == [0.5, 1.0]  # the skip and the retraction dropped
    with pytest.raises(UserError, match="out must be a .jsonl file"):
        LabelConfig(out="labels.json")


# 3. one kind of run never writes over another's directory
def test_cartpole_train_refuses_a_policy_run_and_ppo_refuses_a_cartpole_run(tmp_path, capsys):
    from cartpole.cli import main as cartpole_main
    from rlhf_toy.lm.pipeline.cli import main as rlhf_main

    policy = tmp_path / "run" / "ppo"
    (policy / "policy").mkdir(parents=True)
    (policy / "summary.json").write_text('{"algorithm": "ppo"}')
    (policy / "metrics.jsonl").write_text('{"step": 1}\n')
    before = sorted(p.name for p in policy.iterdir())
    argv = ["train", "--out", str(policy), "--total_steps", "256", "--n_steps", "64", "--num_envs", "4"]
    assert run_cli(cartpole_main, argv) == 2
    one_error(capsys, "holds a policy run, not a CartPole run")
    assert sorted(p.name for p in policy.iterdir()) == before
    assert (policy / "metrics.jsonl").read_text() == '{"step": 1}\n'

    cp = tmp_path / "cp"
    cp.mkdir()
    (cp / "final.pt").write_bytes(b"x")
    (cp / "summary.json").write_text('{"env_id": "CartPole-v1"}')
    assert run_cli(rlhf_main, ["ppo", "--run_dir", str(tmp_path / "run"), "--policy_dir", str(cp)]) == 2
    one_error(capsys, "holds a CartPole run, not a policy run")
    assert sorted(p.name for p in cp.iterdir()) == ["final.pt", "summary.json"]


def test_folder_kinds():
    from rlhf_toy.io import folder_kind

    assert folder_kind(ROOT / "nonexistent") is None


# 11. a refused command on a new --run_dir leaves nothing behind
def test_a_refused_ppo_on_a_new_run_dir_leaves_no_folder(tmp_path, capsys):
    from rlhf_toy.lm.pipeline.cli import main as rlhf_main

    new = tmp_path / "new" / "run"
    assert run_cli(rlhf_main, ["ppo", "--run_dir", str(new), "--progress", "False"]) == 2
    one_error(capsys)
    assert not (tmp_path / "new").exists()


# 7. a reward module that fails at import, or a spec without a module, is one line
@pytest.mark.parametrize(
    "source,spec,needle",
    [
        ("def good(:\n", "badsyntax_mod:good", "SyntaxError"),
        ("raise ValueError('no config')\n", "valueerror_mod:good", "ValueError: no config"),
        (None, ":good", "must name a module and a function"),
        (None, ".mod:good", "must name a module and a function"),
        (None, "json:", "must name a module and a function"),
    ],
)
def test_a_reward_module_that_fails_at_import_is_one_line(tmp_path, monkeypatch, source, spec, needle):
    from rlhf_toy.lm.data.rewards import import_function

    if source is not None:
        (tmp_path / f"{spec.split(':')[0]}.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match=needle):
        import_function(spec)


# 9. one validation for a reward function's output, whichever path calls it; 15. a float32 overflow said so
@pytest.mark.parametrize(
    "out,needle",
    [
        ({0: 5.0, 1: 5.0}, "not numbers"),
        ("77", "not numbers"),
        (["1.0", "2.0"], "not numbers"),
        ([1e39, 0.0], r"1e\+39 for completion 0, beyond torch.float32's range"),
    ],
)
def test_reward_function_output_is_checked_alike(out, needle):
    from rlhf_toy.lm.algorithms.rlhf import checked_scores
    from rlhf_toy.lm.data.rewards import RewardFunctions

    fn = lambda prompts, completions, **kw: out  # noqa: E731
    rf = RewardFunctions([fn], [1.0], {"p": {}, "q": {}})
    needle = needle.replace("completion", "(completion|reply)")
    with pytest.raises(UserError, match=needle):  # the command's path: each function, then the sum in float32
        checked_scores(rf(["p", "q"], ["a", "b"]), 2, rf)
    with pytest.raises(UserError, match=needle):  # the Python API's path: a callable reward
        checked_scores(fn(["p", "q"], ["a", "b"]), 2, fn)


# 10. rows with one prompt and different columns: refused, never checked against the first row's answer
def test_rows_with_one_prompt_and_different_columns_are_refused(tmp_path):
    from rlhf_toy.lm.data.tasks import load_pairs

    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "What is 2 + 2?", "answer": "4"}, {"prompt": "Name a prime.", "answer": "2"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in [*rows, {"prompt": "Name a prime.", "answer": "3"}]))
    with pytest.raises(UserError, match=r"row 3 repeats an earlier row's prompt 'Name a prime.' with other columns"):
        load_pairs(str(path), prompts_only=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in [*rows, rows[1]]))  # an exact repeat is fine
    train, held, columns = load_pairs(str(path), prompts_only=True)
    assert columns["Name a prime."] == {"answer": "2"}


# 8. a reply that opens an HTML comment cannot blank the report
def test_the_reports_data_cannot_end_or_hide_its_script():
    from rlhf_toy.report.page import script_json

    nasty = {"reply": "<!--<script> </script> & done"}
    text = script_json(nasty)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == nasty


# 13. hand-damaged run files: one line each
@pytest.mark.parametrize(
    "name,content,needle",
    [
        ("settings.json", b"{not json", "settings.json is not readable JSON"),
        ("metrics.jsonl", b'{"step": 1}\n{"step": 2, "x": "\xff"}\n', "metrics.jsonl is not UTF-8 text (line 2)"),
        ("metrics.jsonl", b'{"step": "two"}\n', "'step' is 'two', not an integer"),
        ("samples.jsonl", b'{"step": 1, "samples": "oops"}\n', "'samples' is not a list of replies"),
    ],
)
def test_report_on_damaged_run_files_is_one_line(tmp_path, capsys, name, content, needle):
    from rlhf_toy.lm.pipeline.cli import main as rlhf_main

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    (tmp_path / name).write_bytes(content)
    assert run_cli(rlhf_main, ["report", str(tmp_path)]) == 2
    one_error(capsys, needle)


def test_a_corrupt_summary_is_one_line(tmp_path):
    from rlhf_toy.lm.pipeline.rundir import PolicyDir

    (tmp_path / "summary.json").write_bytes(b'{"algorithm": "ppo"')
    with pytest.raises(UserError, match="summary.json is not readable JSON"):
        PolicyDir(tmp_path).check_kind("ppo")


# 14. the label server answers only requests addressed to its own host names
def test_the_label_server_refuses_a_foreign_host_header():
    from fastapi.testclient import TestClient

    from rlhf_toy.lm.labeling.app import allowed_hosts, build_app

    app = build_app(session=None, hosts=allowed_hosts("127.0.0.1"))  # type: ignore[arg-type]
    client = TestClient(app, base_url="http://127.0.0.1:8765")
    assert client.get("/").status_code == 200
    assert client.get("/", headers={"host": "localhost:8765"}).status_code == 200
    assert client.get("/", headers={"host": "evil.example:8765"}).status_code == 400
    assert allowed_hosts("0.0.0.0") == ["*"]  # every interface: the token guards it
    assert "192.168.1.5" in allowed_hosts("192.168.1.5")


# 4. a LoRA rank above GPT-2's Conv1D layers' width is refused before anything trains
def test_a_lora_rank_above_gpt2s_conv1d_width_is_refused():
    pytest.importorskip("peft")
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlhf_toy.lm.models.lora import LoraConfig, add_lora

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=16))
    with pytest.raises(UserError, match=r"--lora_r 100000 is above the narrowest targeted layer's width \(32\)"):
        add_lora(model, LoraConfig(lora_r=100000), "CAUSAL_LM")


# 5. a full disk while saving a model (safetensors) is one line, the old model kept
def test_a_full_disk_while_saving_a_model_is_one_line(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlhf_toy.lm.models.chat import load_tokenizer  # noqa: F401  (the same save path the stages use)
    from rlhf_toy.lm.models.checkpoints import save_model

    class Tok:
        def save_pretrained(self, path):
            (Path(path) / "tokenizer.json").write_text("{}")

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (not root)")
    try:
        small = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20, n_positions=8))
        save_model(disk / "sft", small, Tok())
        before = sorted(p.name for p in (disk / "sft").iterdir())
        big = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=256, n_head=2, vocab_size=2000, n_positions=8))
        with pytest.raises(UserError, match="is the disk full"):
            save_model(disk / "sft", big, Tok())
        assert sorted(p.name for p in (disk / "sft").iterdir()) == before
        assert [p.name for p in disk.iterdir()] == ["sft"]  # no temporary left
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.integration
class TestOnARun:
    """Cases that need the session's tiny run."""

    # 6. the reward stage never replaces a model that is not a reward model, nor one another run reads
    def test_reward_refuses_the_sft_model_and_a_read_reward_dir(self, run_copy, tmp_path, capsys):
        sft = sorted(p.name for p in (run_copy / "sft").iterdir())
        assert stage("reward", run_copy, "--judge", "tests.judges:length", "--reward_dir", "sft") == 2
        one_error(capsys, "--reward_dir", "is the run's SFT model")
        assert sorted(p.name for p in (run_copy / "sft").iterdir()) == sft
        assert stage("ppo", run_copy, *PPO_TINY, "--policy_dir", str(run_copy / "sft")) == 2
        one_error(capsys, "holds a model, not a policy run")

        shared = tmp_path / "shared_rm"
        shutil.copytree(run_copy / "reward_model", shared)
        from rlhf_toy.io import reader_lock

        with reader_lock(shared, "reward model"):  # a ppo of another run scoring with it
            other = tmp_path / "other"
            shutil.copytree(run_copy, other)
            assert stage("reward", other, "--judge", "tests.judges:length", "--reward_dir", str(shared)) == 2
            one_error(capsys, "is being read by a running stage")

    def test_a_policy_stage_reads_a_reward_dir_outside_its_run_under_a_reader_lock(self, run_copy, tmp_path):
        from rlhf_toy.lm.pipeline.rundir import RunDir

        shared = tmp_path / "shared_rm"
        shutil.copytree(run_copy / "reward_model", shared)
        rd = RunDir(run_copy, str(shared))
        with rd.reading():
            assert [p.suffix for p in (shared / ".readers").iterdir()] == [".lock"]
        assert not (shared / ".readers").exists()


# issue 37, part 3: an evaluation with other policies, reward or data never overwrites the run's headline table
@pytest.mark.integration
def test_an_evaluation_never_overwrites_another(run_copy, capsys):
    quick = ["--eval_prompts", "3", "--max_new_tokens", "6", "--judge", "tests.judges:length"]
    assert stage("ppo", run_copy, *PPO_TINY, "--steps", "1") == 0
    assert stage("ppo", run_copy, *PPO_TINY, "--steps", "1", "--policy_dir", "ppo_b") == 0
    assert stage("evaluate", run_copy, *quick, "--best_of", "2") == 0
    headline = (run_copy / "eval.md").read_text()
    assert headline.startswith("Evaluation: policies ppo;") and "best_of 2" in headline
    assert stage("evaluate", run_copy, *quick, "--best_of", "", "--policies", "ppo_b") == 0
    assert (run_copy / "eval.md").read_text() == headline
    other = json.loads((run_copy / "eval-ppo_b_reward_model_helpdesk.json").read_text())
    assert other["settings"]["policies"] == ["ppo_b"] and len(other["rows"]) == 2
    assert stage("evaluate", run_copy, *quick, "--best_of", "", "--policies", "ppo_b", "--temperature", "0.7") == 0
    assert (
        json.loads((run_copy / "eval-ppo_b_reward_model_helpdesk-2.json").read_text())["settings"]["temperature"] == 0.7
    )
    assert stage("evaluate", run_copy, *quick, "--best_of", "2") == 0  # the headline's own settings: rewritten
    assert sorted(p.name for p in run_copy.glob("eval*.md")) == [
        "eval-ppo_b_reward_model_helpdesk-2.md",
        "eval-ppo_b_reward_model_helpdesk.md",
        "eval.md",
    ]


# 12. no library FutureWarning before a refusal or in a GPT-2 LoRA run
@pytest.mark.integration
def test_a_gpt2_lora_run_prints_no_library_warnings(run_copy):
    pytest.importorskip("peft")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "default"}
    cmd = [sys.executable, "-m", "rlhf_toy.lm", "ppo", "--run_dir", str(run_copy), "--progress", "False"]
    cmd += [*PPO_TINY, "--lora_r", "4", "--steps", "1", "--save_every", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Warning" not in p.stderr, p.stderr[-2000:]
    p = subprocess.run([*cmd[:-4], "--resume", "--lora_r", "0"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert p.returncode == 2 and "Warning" not in p.stderr, p.stderr[-2000:]
    assert p.stderr.strip().splitlines()[-1].startswith("error: ")


def test_a_whole_float_step_from_torchrun_is_still_a_step(tmp_path):
    """Under torchrun the logged row is the ranks' mean, so `step` is 3.0: a whole number, read as a step."""
    from rlhf_toy.logging import read_jsonl

    (tmp_path / "metrics.jsonl").write_text('{"step": 1.0}\n{"step": 2.0, "x": 1}\n')
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl", steps=True)] == [1.0, 2.0]
    (tmp_path / "metrics.jsonl").write_text('{"step": 1.5}\n')
    with pytest.raises(UserError, match="'step' is 1.5, not an integer"):
        read_jsonl(tmp_path / "metrics.jsonl", steps=True)
