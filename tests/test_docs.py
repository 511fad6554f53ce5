"""The docs' rules: a short README, generated reference pages that match the code, every page in the site's
navigation, and every code block either included from a file a test runs or marked illustrative."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])
# Snippet includes: only files that a test runs (tests/test_examples.py runs every file in examples/).
RUN_BY_TESTS = {f"examples/{p.name}" for p in (ROOT / "examples").glob("*.py")}


def code_blocks(text: str) -> list[tuple[str, str]]:
    """`(info string, body)` of every fenced block."""
    return re.findall(r"^```([^\n]*)\n(.*?)^```", text, re.S | re.M)


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_code_block_is_run_by_a_test_or_marked_illustrative(page):
    for info, body in code_blocks(page.read_text()):
        included = re.findall(r'^--8<-- "([^"]+)"$', body, re.M)
        if included:
            assert set(included) <= RUN_BY_TESTS, f"{page.name}: includes {included}, which no test runs"
        else:
            assert 'title="illustrative' in info, (
                f"{page.name}: a block neither included nor illustrative: {body[:80]!r}"
            )


def test_the_code_block_rule_can_fail():
    assert code_blocks("```bash\nls\n```\n") == [("bash", "ls\n")]
    assert 'title="illustrative' not in code_blocks("```bash\nls\n```\n")[0][0]


def test_the_generated_reference_pages_match_the_code(capsys):
    from rlhf_toy.cli import parse_configs
    from rlhf_toy.lm.pipeline.cli import COMMANDS

    cmd = COMMANDS["ppo"]  # HfArgumentParser rewrites `Field.type` in place: the pages must not depend on it
    classes, _, defaults = cmd.load()
    parse_configs(classes, [], prog="ppo", help=cmd.help, defaults=defaults)
    gen = runpy.run_path(str(ROOT / "scripts" / "docs_reference.py"))
    assert gen["main"](["--check"]) == 0, capsys.readouterr().err
    for name, make in gen["PAGES"].items():
        assert (DOCS / "reference" / name).read_text() == make()


def test_a_stale_reference_page_is_caught(tmp_path, monkeypatch, capsys):
    gen = runpy.run_path(str(ROOT / "scripts" / "docs_reference.py"))
    main = gen["main"]
    out = tmp_path / "reference"
    out.mkdir()
    for name, make in gen["PAGES"].items():
        (out / name).write_text(make())
    (out / "presets.md").write_text("stale\n")
    main.__globals__["OUT"] = out
    assert main(["--check"]) == 1
    assert "presets.md" in capsys.readouterr().err


def nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in nav_pages(item)]
    if isinstance(node, dict):
        return [p for v in node.values() for p in nav_pages(v)]
    return []


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = set(nav_pages(config["nav"]))
    tables = {"lesson", "rlhf"}  # measured tables, linked from the Results pages
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if p.relative_to(DOCS).parts[0] not in tables}
    assert pages == listed


def test_the_algorithm_reference_lists_every_algorithm():
    from rlhf_toy.lm.algorithms.online import ALGORITHMS

    page = (DOCS / "reference" / "algorithms.md").read_text()
    assert all(f"`rlhf-toy {a.command}`" in page for a in ALGORITHMS.values())


def resolves(dotted: str) -> bool:
    """Whether `a.b.c` is a module, or a name in one (`rlhf_toy.ppo.ppo_update`)."""
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_name_the_docs_give_imports():
    """The API page's modules (`::: module`) and every dotted name a page gives in backticks (`rlhf_toy.ppo.X`)
    import: a renamed or moved function cannot leave the docs pointing at nothing."""
    names = set()
    for page in PAGES:
        text = page.read_text()
        names |= set(re.findall(r"^::: ([\w.]+)", text, re.M))
        names |= set(re.findall(r"`((?:rlhf_toy|cartpole)(?:\.\w+)+)`", text))
    assert len(names) > 20
    missing = sorted(n for n in names if not resolves(n))
    assert not missing, missing


def test_the_core_exports_what_the_how_tos_use():
    import rlhf_toy

    for name in ("NonFiniteUpdate", "dr_grpo_advantages", "kl_k2", "minibatch_loss", *rlhf_toy.__all__):
        assert hasattr(rlhf_toy, name), name


# The results pages; history.md is the archive of superseded runs, as they were written, and has no length rule.
RESULTS = sorted(p for p in (DOCS / "results").glob("*.md") if p.name != "history.md")


@pytest.mark.parametrize("page", RESULTS, ids=[p.name for p in RESULTS])
def test_a_results_page_states_the_current_state_in_under_200_lines(page):
    """A results page opens with its current figures and keeps superseded runs on the History page."""
    lines = page.read_text().splitlines()
    assert len(lines) < 200, f"{page.name}: {len(lines)} lines"


@pytest.mark.integration
def test_the_built_site_shows_no_test_marker(tmp_path):
    """The source marks code blocks no test runs (`title="illustrative"`); the site must not show that word as a
    block's title, where it reads as "not the real command" (scripts/docs_hooks.py takes it out)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", tmp_path],
                           cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert build.returncode == 0, build.stderr[-2000:]
    pages = list(tmp_path.rglob("*.html"))
    assert len(pages) > 20
    shown = [p.name for p in pages if '<span class="filename">illustrative' in p.read_text()]
    assert not shown, shown
    assert "<code" in (tmp_path / "tutorials" / "cartpole" / "index.html").read_text()  # the blocks are there
