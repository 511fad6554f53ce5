"""The package's shape: no import cycle among its modules, and no import inside a function that would hide one.

Module-level imports are read from the source (AST), so the check sees what Python would execute on import;
an import inside a function is allowed for third-party optional extras (peft, gguf, stable-baselines3) but not
for the project's own modules, unless its line says why (a comment), as `cartpole watch`'s does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rlhf_toy", "cartpole")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def resolve(mod: str, path: Path, node: ast.ImportFrom | ast.Import, known: dict[str, Path]) -> list[str]:
    """The project modules one import statement loads (submodules named in `from pkg import sub` included)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    if node.level:
        base = package.split(".")
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    found = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
    return found + ([target] if target in known else [])


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {}
    for mod, path in known.items():
        edges = set()
        for node in ast.parse(path.read_text()).body:  # module level only: what runs on import
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(resolve(mod, path, node, known))
        graph[mod] = edges - {mod}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle among non-package modules (a package's __init__ re-exporting its modules is not one), or None."""
    packages = {m for m, p in modules().items() if p.name == "__init__.py"}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if n in packages:
                continue
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (c := visit(n)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in packages and m not in state and (c := visit(m)):
            return c
    return None


def test_no_import_cycle():
    assert find_cycle(import_graph()) is None, " -> ".join(find_cycle(import_graph()) or [])


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("mod", sorted(modules()))
def test_no_function_level_import_of_the_project(mod):
    path = modules()[mod]
    source = path.read_text()
    lines = source.splitlines()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in PACKAGES):
                assert "#" in lines[node.lineno - 1], f"{path.name}:{node.lineno} imports the project in a function"


def test_the_library_never_reaches_into_scripts():
    """The library works from a normal (non-editable) install: no path into the repository's scripts/."""
    for path in (ROOT / "rlhf_toy").rglob("*.py"):
        text = path.read_text()
        assert '"scripts"' not in text and "'scripts'" not in text and "parents[3]" not in text, path.name
