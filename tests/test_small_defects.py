"""The small defects a reviewer found (issue 36), each pinned: an empty exception message, a path in an ensemble's
member list, silent fallbacks that now say what they do."""

import json

import pytest

from rlhf_toy.errors import UserError, first_line, note_once
from rlhf_toy.lm.models.reward_ensemble import ENSEMBLE_FILE, member_dirs


def test_first_line_of_an_empty_message_does_not_crash_the_handler():
    assert first_line(RuntimeError()) == "(no message)"
    assert first_line(ValueError("\n\n  second line\nthird")) == "second line"
    assert first_line(ValueError("x" * 500), 10) == "x" * 10


def test_a_write_failure_with_no_message_is_one_line(tmp_path, monkeypatch):
    from rlhf_toy import io

    with pytest.raises(UserError, match=r"cannot write .*x\.pt \(write failed\); is the disk full"):
        io.raise_write_failure(RuntimeError("write failed\n"), tmp_path / "x.pt")
    monkeypatch.setattr(io, "disk_nearly_full", lambda path: True)  # a full disk that says nothing
    with pytest.raises(UserError, match=r"\(\(no message\)\); is the disk full"):  # it crashed the handler before
        io.raise_write_failure(RuntimeError(""), tmp_path / "x.pt")


@pytest.mark.parametrize("members", [["../outside"], [".."], ["/abs"], ["a/b"], [], "m0", [1], [""]])
def test_an_ensemble_member_list_that_names_a_path_is_refused(tmp_path, members):
    (tmp_path / ENSEMBLE_FILE).write_text(json.dumps({"members": members}))
    with pytest.raises(UserError, match="does not list the ensemble's members as directory names inside it"):
        member_dirs(tmp_path)


def test_note_once_says_a_thing_once(capsys):
    note_once("a fallback happened (test)")
    note_once("a fallback happened (test)")
    assert capsys.readouterr().err == "note: a fallback happened (test)\n"


@pytest.mark.integration
def test_leaving_the_lean_loop_is_said(tmp_path, capsys, monkeypatch):
    from rlhf_toy.lm.models import sampling
    from rlhf_toy.lm.models.base import load_base
    from tests.hf_models import tiny_model_dir

    model, tok = load_base(tiny_model_dir("gpt2", tmp_path / "gpt2"))
    monkeypatch.setattr(sampling, "lean_decoding", lambda m: None)  # a model the loop cannot drive
    s = sampling.sample(model, tok, ["hello"], 4)
    assert len(s.texts) == 1
    err = capsys.readouterr().err
    assert "is not a model the lean decoding loop can drive; sampling with transformers' generate" in err


@pytest.mark.integration
def test_ensemble_members_without_the_reward_report_are_said_to_use_defaults(tmp_path, capsys):
    from rlhf_toy.lm.pipeline.remedies import member_config
    from rlhf_toy.lm.pipeline.run import RunConfig

    reward, _ = member_config(RunConfig(run_dir=str(tmp_path / "run")), "ensemble")
    assert reward.ensemble == 5
    assert "the ensemble members train on the reward stage's defaults" in capsys.readouterr().err


@pytest.mark.parametrize("bf16", ["on"])
def test_autocast_around_training_reads_the_weights_each_step_leaves(bf16):
    """Autocast keeps a weight's bf16 copy until its outermost context exits: under one context around a whole
    step, every minibatch after the first read the step's first weights (found on 2026-12-06: an update's own
    approx-KL was 10-40x under fp32's; the SFT, reward and DPO stages on a GPU were wrapped the same way). The
    helper casts afresh unless the weights are fixed (sampling), where keeping the copy is right and cheaper.
    Runs on any CPU: autocast emulates bf16 where the CPU lacks it."""
    import torch

    from rlhf_toy.lm.models.devices import autocast

    cpu = torch.device("cpu")

    def two_forwards(weights_fixed: bool):
        torch.manual_seed(0)
        layer, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
        opt = torch.optim.SGD(layer.parameters(), lr=1.0)
        with autocast(cpu, bf16, weights_fixed=weights_fixed):
            first = layer(x)
            first.float().sum().backward()
            opt.step()
            second = layer(x)
        return first, second, layer(x)  # the last in fp32, outside

    first, second, _ = two_forwards(weights_fixed=False)
    assert first.dtype == torch.bfloat16 and not torch.equal(first, second)  # the step's new weights are read
    first, second, _ = two_forwards(weights_fixed=True)
    assert torch.equal(first, second)  # the kept copy: right only where nothing steps the weights
