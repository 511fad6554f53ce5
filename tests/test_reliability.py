"""Issue 12: atomic checkpoints, safe loading, honest resume, locks, and one-line errors where tracebacks were."""

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import KILL_AT_STEP, PPO_TINY, THREADS, stage

pytestmark = pytest.mark.integration  # trains or loads models, or runs whole commands

ROOT = Path(__file__).resolve().parents[1]
PPO = ["--save_every", "1", *PPO_TINY]  # 2 steps, a checkpoint after each


def copy_run(run_dir, tmp_path):
    """A copy of the session's run under `tmp_path` (two copies in one test need two folders)."""
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    return out


def rows(ppo_dir):
    """The logged rows without the wall-clock columns (those differ between any two runs)."""
    return [
        {k: v for k, v in r.items() if not k.startswith("time/")}
        for r in map(json.loads, (ppo_dir / "metrics.jsonl").read_text().splitlines())
    ]


def cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def one_line_error(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and all(n in last for n in needles), last


# 1. A checkpoint is one atomic unit: a kill between the policy and the trainer-state writes loses nothing.


def test_kill_between_policy_and_state_then_resume_equals_uninterrupted(run_dir, tmp_path):
    full, killed = copy_run(run_dir, tmp_path / "a"), copy_run(run_dir, tmp_path / "b")
    args = ["--progress", "False", "--threads", THREADS, *PPO]  # as stage() runs the uninterrupted one
    assert stage("ppo", full, *PPO, "--steps", "3") == 0  # the later --steps wins
    p = subprocess.run(
        [sys.executable, "-c", KILL_AT_STEP.format(step=2), "ppo", "--run_dir", str(killed), *args, "--steps", "3"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert p.returncode == -9, p.stderr[-2000:]
    state = torch.load(killed / "ppo" / "checkpoint" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 1  # the step-2 checkpoint never landed: step 1's policy and state, together
    assert [r["step"] for r in rows(killed / "ppo")] == [1, 2]  # the history was flushed before the checkpoint
    assert any(".tmp-" in n.name for n in (killed / "ppo").iterdir())  # the killed writer's temporary ...
    assert stage("ppo", killed, *PPO, "--steps", "3", "--resume") == 0
    assert not any(".tmp-" in n.name for n in (killed / "ppo").iterdir())  # ... is swept by the next writer
    assert rows(killed / "ppo") == rows(full / "ppo")  # steps 2 and 3 replayed exactly
    for a, b in zip(
        torch.load(full / "ppo" / "checkpoint" / "trainer_state.pt")["value_head"].values(),
        torch.load(killed / "ppo" / "checkpoint" / "trainer_state.pt")["value_head"].values(),
    ):
        assert torch.equal(a, b)


# 2. The trainer state is loaded with weights_only=True: a pickle payload is refused, not run.
class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {Path('/tmp') / 'rlhf_toy_payload_ran'}",))


@pytest.mark.parametrize("damage", ["pickle", "truncated"])
def test_damaged_or_crafted_trainer_state_is_refused(damage, run_dir, tmp_path, capsys):
    out = copy_run(run_dir, tmp_path)
    assert stage("ppo", out, *PPO) == 0
    state = out / "ppo" / "checkpoint" / "trainer_state.pt"
    marker = Path("/tmp/rlhf_toy_payload_ran")
    marker.unlink(missing_ok=True)
    if damage == "pickle":
        state.write_bytes(pickle.dumps({"step": 1, "x": Payload()}))
    else:
        state.write_bytes(state.read_bytes()[:200])
    assert stage("ppo", out, *PPO, "--steps", "3", "--resume") == 2
    err = capsys.readouterr().err
    assert "is not a readable trainer state" in err and "Traceback" not in err
    assert not marker.exists()


def test_truncated_model_weights_are_one_line(run_dir, tmp_path):
    out = copy_run(run_dir, tmp_path)
    weights = out / "sft" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    p = cli(
        "rlhf_toy.lm", "preferences", "--run_dir", str(out), "--judge", "tests.judges:length", "--progress", "False"
    )
    one_line_error(p, "cannot load the SFT model")


# 3. A resumed run keeps exactly the rows up to the checkpoint; a bad line is a one-line error.
def test_resume_keeps_the_history_up_to_the_checkpoint(run_dir, tmp_path):
    out = copy_run(run_dir, tmp_path)
    assert stage("ppo", out, *PPO) == 0
    metrics = out / "ppo" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(lines) + '\n{"step": 3, "objective/sc')  # a kill mid-line after step 2
    assert stage("ppo", out, *PPO, "--steps", "3", "--resume") == 0
    assert [r["step"] for r in rows(out / "ppo")] == [1, 2, 3]


def test_a_bad_line_in_the_metrics_is_one_line(run_dir, tmp_path, capsys):
    out = copy_run(run_dir, tmp_path)
    assert stage("ppo", out, *PPO) == 0
    metrics = out / "ppo" / "metrics.jsonl"
    metrics.write_text("not json\n" + metrics.read_text())
    assert stage("ppo", out, *PPO, "--steps", "3", "--resume") == 2
    assert "line 1, is not a JSON object" in capsys.readouterr().err


# 4. Resume refuses settings that differ from the saved run's, naming each.
def test_resume_with_changed_settings_is_refused(run_dir, tmp_path, capsys):
    out = copy_run(run_dir, tmp_path)
    assert stage("ppo", out, *PPO) == 0
    before = (out / "ppo" / "summary.json").read_text()
    assert stage("ppo", out, *PPO, "--steps", "3", "--resume", "--kl_coef", "0.3", "--batch_size", "4") == 2
    err = capsys.readouterr().err
    assert "--kl_coef 0.3 (saved: 0.1)" in err and "--batch_size 4 (saved: 8)" in err
    assert (out / "ppo" / "summary.json").read_text() == before
    assert stage("ppo", out, *PPO, "--steps", "3", "--resume") == 0  # the same settings and more steps: fine
    assert json.loads((out / "ppo" / "summary.json").read_text())["config"]["kl_coef"] == 0.1


# 5. One writer per output directory.
def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    from rlhf_toy.errors import UserError
    from rlhf_toy.io import output_lock

    with output_lock(tmp_path / "out"):
        p = cli("cartpole", "train", "--out", str(tmp_path / "out"), "--total_steps", "512", "--progress", "False")
        one_line_error(p, "is in use by pid", str(os.getpid()))
        with pytest.raises(UserError, match="in use by pid"), output_lock(tmp_path / "out"):
            pass
    with output_lock(tmp_path / "out"):  # released: free again
        pass


# 6. One-line errors where there were tracebacks.
def test_cartpole_out_is_a_file_or_read_only(tmp_path):
    (tmp_path / "file").write_text("x")
    one_line_error(cli("cartpole", "train", "--out", str(tmp_path / "file"), "--total_steps", "512"), "is a file")
    if os.geteuid() != 0:  # root writes anywhere: the read-only case needs an ordinary user
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        one_line_error(cli("cartpole", "train", "--out", str(ro / "x"), "--total_steps", "512"), "cannot write")
    one_line_error(
        cli("cartpole", "train", "--out", "/sys/rlhf_toy_cannot_write", "--total_steps", "512"), "cannot write"
    )


def test_run_dir_is_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    one_line_error(cli("rlhf_toy.lm", "tokenizer", "--run_dir", str(tmp_path / "file")), "is a file")


def test_preference_file_with_a_number_for_chosen(run_dir, tmp_path, capsys):
    out = copy_run(run_dir, tmp_path)
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text("".join(json.dumps({"prompt": f"q{i}", "chosen": i, "rejected": "no"}) + "\n" for i in range(5)))
    assert stage("reward", out, "--preferences_file", str(prefs)) == 2
    assert "has a int in 'chosen'" in capsys.readouterr().err


@pytest.mark.parametrize("judge,message", [("os:getcwd", "takes 0 argument(s)"), ("os:sep", "not a function")])
def test_judges_are_checked_when_loaded(judge, message, run_dir, tmp_path):
    out = copy_run(run_dir, tmp_path)
    shutil.rmtree(out / "preferences")
    p = cli("rlhf_toy.lm", "preferences", "--run_dir", str(out), "--judge", judge, "--progress", "False")
    one_line_error(p, message)
    assert not (out / "preferences").exists()


# 7. Smaller ones.
def test_sample_refuses_a_reward_model_and_a_reply_that_does_not_fit(run_dir):
    p = cli("rlhf_toy.lm", "sample", "--model_dir", str(run_dir / "reward_model"), "--prompt", "hi")
    one_line_error(p, "not a causal language model")
    p = cli("rlhf_toy.lm", "sample", "--model_dir", str(run_dir / "sft"), "--prompt", "hi", "--max_new_tokens", "200")
    one_line_error(p, "too long for the context of 64")


def test_evaluate_refuses_a_missing_policy_before_sampling(run_dir, tmp_path, capsys):
    out = copy_run(run_dir, tmp_path)
    assert stage("evaluate", out, "--policies", "nosuch", "--judge", "tests.judges:length") == 2
    assert "no trained policy in" in capsys.readouterr().err and not (out / "eval.md").exists()


def test_minibatch_larger_than_the_batch_is_refused(run_dir, tmp_path, capsys):
    out = copy_run(run_dir, tmp_path)
    assert stage("ppo", out, *PPO, "--minibatch_size", "16") == 2
    assert "minibatch_size (16) is larger than the batch (8" in capsys.readouterr().err
    p = cli("cartpole", "train", "--out", str(tmp_path / "cp"), "--minibatch_size", "4096")
    one_line_error(p, "minibatch_size (4096) is larger than the batch")


def test_total_steps_round_up_to_whole_rollouts_and_say_so(tmp_path):
    p = cli(
        "cartpole",
        "train",
        "--out",
        str(tmp_path / "cp"),
        "--total_steps",
        "2000",
        "--eval_every",
        "0",
        "--eval_episodes",
        "1",
        "--progress",
        "False",
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.strip().splitlines()[-1])["env_steps"] == 2048
    assert "training 2048 env steps" in p.stderr


def test_outputs_are_readable_by_others(run_dir):
    """Every file the stages wrote, the weights included (safetensors writes them 0600 through a temporary)."""
    files = [p for p in run_dir.rglob("*") if ".lock" not in p.name]
    assert any(p.name == "model.safetensors" for p in files)
    for path in files:  # (run_dir itself is pytest's)
        assert path.stat().st_mode & 0o044 == 0o044, (path, oct(path.stat().st_mode))


def test_help_of_a_no_flag_reads_the_right_way():
    p = cli("cartpole", "train", "--help")
    text = " ".join(p.stdout.split())
    assert "--no_anneal_lr, --no-anneal-lr Turn anneal_lr off" in text


# A user's own preference file: a held-out split with pairwise accuracy, enough steps, a guarded normalization.
def test_user_preference_file_reports_heldout_accuracy(run_dir, tmp_path):
    out = copy_run(run_dir, tmp_path)
    shutil.rmtree(out / "reward_model")
    (out / "reference_samples.json").unlink()
    rows_ = [
        {
            "prompt": f"My {d} won't start ({i}).",
            "chosen": f"Happy to help! Restart the {d}. Have a great day!",
            "rejected": f"Whatever. Restart the {d}. Deal with it.",
        }
        for i, d in enumerate(["printer", "laptop", "router", "phone", "lamp"] * 32)
    ]
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text("".join(json.dumps(r) + "\n" for r in rows_))
    p = cli(
        "rlhf_toy.lm",
        "reward",
        "--run_dir",
        str(out),
        "--preferences_file",
        str(prefs),
        "--progress",
        "False",
        "--batch_size",
        "64",
        "--min_steps",
        "40",
    )
    assert p.returncode == 0, p.stderr[-2000:]
    m = json.loads(p.stdout.strip().splitlines()[-1])
    assert m["heldout_pairs"] == 16 and m["pairs"] == 144  # 10% of 160 prompts, seeded
    assert m["steps"] >= 40 and m["epochs"] > 2  # 3 steps an epoch: more epochs to reach --min_steps
    assert m["heldout_accuracy"] >= 0.9  # an easy file: the model learns it
    assert m["norm_std"] > 0.05


def test_a_kill_between_the_two_renames_of_a_directory_swap_restores_the_previous_version(tmp_path):
    """`atomic_dir` moves the old directory aside, then the new one in: a kill between the two leaves only
    `.NAME.tmp-old`. The next writer (taking the lock) puts it back instead of sweeping it away."""
    from rlhf_toy.io import output_lock

    (tmp_path / ".checkpoint.tmp-old").mkdir()
    (tmp_path / ".checkpoint.tmp-old" / "trainer_state.pt").write_text("step 4")
    (tmp_path / ".checkpoint.tmp-abc123").mkdir()  # the new version, half written: swept
    with output_lock(tmp_path):
        assert (tmp_path / "checkpoint" / "trainer_state.pt").read_text() == "step 4"
        assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


# What a run trains against: --resume checks the models' identity; stages do not replace models being read.
def test_resume_against_a_retrained_reward_model_is_refused(run_dir, tmp_path, capsys):
    out = copy_run(run_dir, tmp_path)
    assert stage("ppo", out, *PPO) == 0
    assert stage("reward", out, "--seed", "1") == 0  # another reward model under the same path
    assert stage("ppo", out, *PPO, "--steps", "3", "--resume") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--resume against other models than the saved run's" in err[0]
    assert "reward_model changed" in err[0] and "sft" not in err[0].split("changed")[0].split("/")[-1]


HOLD = """
import sys, time
from pathlib import Path
from rlhf_toy.io import output_lock
from rlhf_toy.lm.pipeline.rundir import RunDir
hold = RunDir(sys.argv[1]).reading() if sys.argv[2] == "read" else output_lock(sys.argv[1])
with hold:
    Path(sys.argv[3]).write_text("held")
    time.sleep(60)
"""


@pytest.mark.parametrize("held,command,message", [
    ("read", "sft", "is being read by a running stage"),
    ("write", "ppo", "is being written by pid"),
])  # fmt: skip
def test_a_model_being_read_is_not_replaced_and_a_run_being_written_is_not_read(
    run_dir, tmp_path, capsys, held, command, message
):
    out = copy_run(run_dir, tmp_path)
    flag = tmp_path / "held"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(out), held, str(flag)], env=env)
    try:
        for _ in range(600):
            if flag.exists():
                break
            time.sleep(0.05)
        before = (out / "sft" / "model.safetensors").stat().st_mtime_ns
        extra = PPO if command == "ppo" else []
        assert stage(command, out, *extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
        assert (out / "sft" / "model.safetensors").stat().st_mtime_ns == before
    finally:
        p.kill()
        p.wait()
    assert stage("sft", out) == 0  # the reader is gone: its registration does not block a writer


@pytest.mark.parametrize("command", ["reward", "dpo"])
def test_a_preference_pair_longer_than_the_context_is_refused_before_training(run_dir, tmp_path, capsys, command):
    out = copy_run(run_dir, tmp_path)
    rows_ = [{"prompt": f"My printer {i} won't start.", "chosen": "Restart it.", "rejected": "No."} for i in range(20)]
    rows_[3]["rejected"] = "Whatever, deal with it. " * 200  # far past the tiny model's context
    prefs = tmp_path / "long.jsonl"
    prefs.write_text("".join(json.dumps(r) + "\n" for r in rows_))
    before = (out / "reward_model" / "model.safetensors").read_bytes()
    assert stage(command, out, "--preferences_file", str(prefs)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"preference pair 3 of {prefs} is" in err[0] and "longer than the context" in err[0]
    assert (out / "reward_model" / "model.safetensors").read_bytes() == before
    assert not (out / "dpo").exists()
