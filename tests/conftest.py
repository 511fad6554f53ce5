"""Test-wide settings: offline, one torch thread (two processes with two threads each slow down 10-100x here). The
suite runs in two pytest-xdist workers (`pyproject.toml`), so a 2-core machine runs two single-thread processes.

To check that no test depends on one machine's numerics, run the suite under other numerics:
`RLHF_TOY_TEST_THREADS=2 pytest -n 0` (torch threads of the tests and of the stages they run) and
`RLHF_TOY_TEST_DETERMINISTIC=1` (`torch.use_deterministic_algorithms`).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
THREADS = int(os.environ.get("RLHF_TOY_TEST_THREADS", "1"))
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

torch.set_num_threads(THREADS)
if os.environ.get("RLHF_TOY_TEST_DETERMINISTIC"):
    torch.use_deterministic_algorithms(True)

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory):
    """Stages 1-4 of a tiny helpdesk run, built once per session; tests copy it before changing anything."""
    from tests.helpers import stage

    d = tmp_path_factory.mktemp("run")
    # A judge that always tells replies apart (their length): a model this small rarely names the topic yet.
    for name in ("tokenizer", "sft", "preferences", "reward"):
        assert stage(name, d, "--judge", "tests.judges:length") == 0, name
    return d


@pytest.fixture
def run_copy(run_dir, tmp_path):
    """A copy of the session's tiny run directory, for a test that writes into it."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    return out


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium (the system's, through Playwright), shared by the page tests: the labeling page's and the
    report's. A machine without it fails here with the install to make, rather than skipping the tests."""
    from rlhf_toy.lm.labeling.browser import headless_chromium

    with headless_chromium() as b:
        yield b


@pytest.fixture(scope="session")
def artifacts():
    """Where the page tests save their screenshots (`$TEST_ARTIFACTS`, default ./test-artifacts)."""
    from pathlib import Path

    path = Path(os.environ.get("TEST_ARTIFACTS", "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path
