"""The README's core example is the file examples/corridor.py, and it runs and learns."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_block(section: str) -> str:
    text = (ROOT / "README.md").read_text()
    body = text.split(f"## {section}", 1)[1]
    return re.search(r"```python\n(.*?)```", body, re.S).group(1)


def test_readme_core_example_is_the_example_file_and_it_learns():
    code = readme_block("Use the PPO core in your own project")
    assert code == (ROOT / "examples" / "corridor.py").read_text()
    assert "import gymnasium" not in code and "CartPole" not in code
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "P(right)" in p.stdout


def test_core_does_not_import_gymnasium():
    code = "import sys, rlhf_toy.ppo, rlhf_toy.advantages, rlhf_toy.losses; print('gymnasium' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.stdout.strip() == "False", p.stderr


def test_readme_own_model_example_is_the_example_file_and_it_learns(tmp_path):
    """The README's RLHF-your-own-model example, on a tiny random Llama (chat template, no PAD) built offline."""
    from tests.hf_models import tiny_model_dir

    code = readme_block("RLHF on your own Hugging Face model")
    assert code == (ROOT / "examples" / "own_model.py").read_text()
    model_dir = tiny_model_dir("llama", tmp_path / "llama")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, ROOT / "examples" / "own_model.py", str(model_dir)], capture_output=True,
                       text=True, cwd=tmp_path, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    first, last = map(float, re.search(r"first 5 steps ([\d.]+) -> last 5 ([\d.]+)", p.stdout).groups())
    assert last > first + 0.1, p.stdout
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "my_rlhf_model")  # plain transformers loads the result
