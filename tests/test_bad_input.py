"""Bad values the third reliability round found with tracebacks: each is now one `error:` line, exit 2."""

import pytest

from cartpole.cli import main as cartpole_main
from rlhf_toy.errors import run_cli
from rlhf_toy.lm.pipeline.cli import main as rlhf_main

CASES = [
    (rlhf_main, ["sft", "--seed", "-1"], "seed must be an integer from 0 to 4294967295"),
    (rlhf_main, ["sample", "--seed", "4294967296", "--prompt", "hi"], "seed must be an integer from 0"),
    (cartpole_main, ["train", "--seed", "-1"], "seed must be an integer from 0 to 4294967295"),
    (cartpole_main, ["train", "--seeds", "-5"], "distinct integers from 0 to 4294967295"),
    (cartpole_main, ["train", "--seeds", "99999999999999999999999"], "distinct integers from 0 to 4294967295"),
    (cartpole_main, ["eval", "--checkpoint", "x.pt", "--seed", "-3"], "seed must be an integer"),
    (rlhf_main, ["compare", "--best_of", "0"], "best_of must be comma-separated integers >= 1"),
    (rlhf_main, ["compare", "--seeds", "0,0"], "seeds must be distinct seeds"),
    (rlhf_main, ["compare", "--seeds", "0,-2"], "seeds must be an integer from 0"),
    (rlhf_main, ["sample", "--device", "mps", "--prompt", "hi"], "--device 'mps' is not supported"),
    (rlhf_main, ["tokenizer", "--device", "meta"], "--device 'meta' is not supported"),
    # an unknown flag: the closest real ones (spelling, prefix, initials) and --help, never an internal class name
    (rlhf_main, ["ppo", "--lr", "abc"], "unknown flag --lr; did you mean --learning_rate"),
    (rlhf_main, ["ppo", "--learnig_rate", "1"], "unknown flag --learnig_rate; did you mean --learning_rate?; see"),
    (rlhf_main, ["grpo", "--zzz", "1"], "unknown flag --zzz; see rlhf-toy grpo --help"),
    (cartpole_main, ["train", "--seeed", "1"], "unknown flag --seeed; did you mean --seed"),
]


@pytest.mark.parametrize("main,argv,message", CASES, ids=[" ".join(a) for _, a, _ in CASES])
def test_a_bad_value_is_one_error_line(main, argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_cli(main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err


def test_a_population_that_cannot_fit_in_memory_is_refused_before_allocating(tmp_path, capsys):
    assert run_cli(cartpole_main, ["train", "--seeds", "0-999999", "--out", str(tmp_path / "pop")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a population of 1000000 agents needs about" in err[0] and "--seeds 0-" in err[0]
    assert not (tmp_path / "pop").exists()


@pytest.mark.integration
def test_a_lora_rank_above_the_layer_width_is_refused(tmp_path):
    from rlhf_toy.errors import UserError
    from rlhf_toy.lm.models.base import load_base
    from rlhf_toy.lm.models.lora import LoraConfig, add_lora
    from tests.hf_models import tiny_model_dir

    model, _ = load_base(tiny_model_dir("llama", tmp_path / "llama"))
    with pytest.raises(UserError, match=r"--lora_r 100000 is above the narrowest targeted layer's width \(16\)"):
        add_lora(model, LoraConfig(lora_r=100000), "CAUSAL_LM")
    add_lora(model, LoraConfig(lora_r=16), "CAUSAL_LM")  # the width itself is allowed


def test_a_text_file_that_is_not_utf8_is_one_error_naming_the_line(tmp_path):
    from rlhf_toy.errors import UserError
    from rlhf_toy.lm.data.tasks import load_table

    bad = tmp_path / "prefs.jsonl"
    bad.write_bytes(
        b'{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "hi \xff", "chosen": "b", "rejected": "c"}\n'
    )
    with pytest.raises(UserError, match=r"is not UTF-8 text \(byte 0xff on line 2\); save it as UTF-8"):
        load_table(str(bad))


@pytest.mark.integration
def test_sample_reads_non_utf8_stdin_as_one_error(run_dir):
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "rlhf_toy.lm", "sample", "--model_dir", str(run_dir / "sft"), "--max_new_tokens", "4"]
    p = subprocess.run(cmd, input=b"My printer broke.\nhi \xff\n", capture_output=True, env=env, timeout=120)
    err = p.stderr.decode().strip().splitlines()
    assert p.returncode == 2 and err[-1] == "error: line 2 of standard input is not UTF-8 text; send UTF-8", err
    assert b"user: My printer broke." in p.stdout  # the good line before it was answered


def test_a_full_disk_is_one_error_and_the_previous_file_stays(tmp_path):
    """A real full disk: a 1 MB tmpfs (root can mount one here; CI runs as root)."""
    import subprocess

    import torch

    from rlhf_toy.errors import UserError
    from rlhf_toy.io import atomic_torch_save

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (not root)")
    try:
        atomic_torch_save({"w": torch.zeros(10)}, disk / "state.pt")
        before = (disk / "state.pt").read_bytes()
        with pytest.raises(UserError, match="is the disk full"):
            atomic_torch_save({"w": torch.zeros(1_000_000)}, disk / "state.pt")  # 4 MB into 1 MB
        assert (disk / "state.pt").read_bytes() == before
        assert [p.name for p in disk.iterdir()] == ["state.pt"]  # no temporary left
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)  # lazy: a failed write may still hold a file


def die(*args):
    import os

    os._exit(9)


def test_a_killed_population_worker_is_one_error(tmp_path, monkeypatch):
    from cartpole import population
    from cartpole.settings import CARTPOLE_PPO, TrainConfig
    from rlhf_toy.errors import UserError

    monkeypatch.setattr(population, "_train_share", die)  # the forked worker dies at once
    cfg = TrainConfig(seeds="0-3", workers=2, out=str(tmp_path / "pop"), progress=False, threads=1)
    with pytest.raises(UserError, match="a worker process of the population died"):
        population.train_population(cfg, cfg.seed_list, CARTPOLE_PPO)
    assert not (tmp_path / "pop" / "summary.json").exists()


@pytest.mark.parametrize(
    "main,argv,message",
    [
        (cartpole_main, ["train", "--total_steps", "abc"], "invalid int value: 'abc'; see cartpole train --help"),
        (rlhf_main, ["ppo", "--steps"], "argument --steps: expected one argument; see rlhf-toy ppo --help"),
        (rlhf_main, ["nope"], "unknown command 'nope'"),
    ],
)
def test_an_argparse_complaint_is_one_line_not_the_usage(main, argv, message, capsys):
    assert run_cli(main, argv) == 2
    out = capsys.readouterr()
    err = out.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err
    assert "usage:" not in out.out + out.err


def test_a_malformed_file_names_its_cause_in_one_line(tmp_path, capsys):
    bad = tmp_path / "prefs.jsonl"
    bad.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": \n')
    assert run_cli(rlhf_main, ["reward", "--run_dir", str(tmp_path / "run"), "--preferences_file", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot read {bad} as json" in err[0], err
    assert "An error occurred while generating the dataset" not in err[0]  # the wrapper, not the cause


@pytest.mark.integration
def test_lora_runs_print_no_future_warning(tmp_path):
    import warnings

    from rlhf_toy.lm.models.base import load_base
    from rlhf_toy.lm.models.lora import LoraConfig, add_lora
    from tests.hf_models import tiny_model_dir

    model, _ = load_base(tiny_model_dir("llama", tmp_path / "llama"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        add_lora(model, LoraConfig(lora_r=4), "CAUSAL_LM")
    assert not [w for w in seen if issubclass(w.category, FutureWarning)], [str(w.message) for w in seen]
