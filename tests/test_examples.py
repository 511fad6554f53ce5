"""The docs' examples are files (included into the pages with `--8<--`), and each runs and learns."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hf_models import tiny_model_dir

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def test_the_core_example_runs_in_its_own_environment_and_learns():
    code = (ROOT / "examples" / "corridor.py").read_text()
    assert "import gymnasium" not in code and "CartPole" not in code
    p = subprocess.run(
        [sys.executable, ROOT / "examples" / "corridor.py"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=ENV,
    )
    assert p.returncode == 0, p.stderr
    assert "P(right)" in p.stdout


def test_core_does_not_import_gymnasium():
    code = "import sys, rlhf_toy.ppo, rlhf_toy.advantages, rlhf_toy.losses; print('gymnasium' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.stdout.strip() == "False", p.stderr


@pytest.mark.parametrize("flags", [[], ["--lora"]], ids=["full-weights", "lora"])
def test_the_own_model_example_raises_the_reward_with_full_weights_and_with_lora(tmp_path, flags):
    """On a tiny random Llama (chat template, no PAD) built offline; both paths must raise the reward."""
    model_dir = tiny_model_dir("llama", tmp_path / "llama")
    p = subprocess.run(
        [sys.executable, ROOT / "examples" / "own_model.py", str(model_dir), *flags],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env=ENV,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    first, last = map(float, re.search(r"first 5 steps ([\d.]+) -> last 5 ([\d.]+)", p.stdout).groups())
    assert last > first + 0.2, p.stdout
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "my_rlhf_model")  # plain transformers loads the result


def test_the_checker_example_scores_as_trl_would_call_it():
    """examples/checker.py (included in the own-checker how-to); tests/test_checkable.py trains with it end to
    end through --reward_fn."""
    from examples.checker import brevity, exact_answer

    assert exact_answer(prompts=["a", "b"], completions=["it is 12", "13 or 14"], answer=["12", "13"]) == [1.0, 0.0]
    assert brevity(prompts=["a"], completions=["one two"]) == [0.9]


def test_the_library_works_from_a_wheel_without_the_repository(tmp_path):
    """A non-editable install: the wheel `pip` builds from this tree, installed on its own (no editable finder, no
    repository on the path), imports `rlhf_toy`, holds its page templates and no benchmark harness, and runs the
    core example and a command's --help from another directory."""
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, ROOT],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("rlhf_toy-*.whl")
    install = subprocess.run([*pip, "install", "--no-deps", "--target", site, wheel], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    installed = {str(p.relative_to(site)) for p in site.rglob("*") if p.is_file()}
    assert "rlhf_toy/report/template.html" in installed and "rlhf_toy/lm/labeling/page.html" in installed
    assert not any("benchlib" in p or p.startswith("scripts/") or "floor.py" in p for p in installed)
    env = {**ENV, "PYTHONPATH": str(site)}  # the wheel's files first; the dependencies from this environment
    where = subprocess.run([sys.executable, "-c", "import rlhf_toy; print(rlhf_toy.__file__)"], capture_output=True,
                           text=True, cwd=tmp_path, env=env)  # fmt: skip
    assert where.stdout.startswith(str(site)), (where.stdout, where.stderr)
    run = subprocess.run([sys.executable, ROOT / "examples" / "corridor.py"], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=120)  # fmt: skip
    assert run.returncode == 0 and "P(right)" in run.stdout, run.stderr
    cli = subprocess.run([sys.executable, "-m", "rlhf_toy.lm", "grpo", "--help"], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=120)  # fmt: skip
    assert cli.returncode == 0 and "--group_size" in cli.stdout, cli.stderr
