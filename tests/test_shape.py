"""The package's shape: no import cycle among its modules, none among its folders, and no import inside a function
that would hide one.

Module-level imports are read from the source (AST), `if TYPE_CHECKING:` blocks included (a cycle that only the
type checker follows is still a cycle in the design), so the check sees what Python would execute on import;
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


def module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports at module level, and those under a module-level `if` (`if TYPE_CHECKING:`, say)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in tree.body:
        body = [node] if not isinstance(node, ast.If) else node.body + node.orelse
        found += [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
    return found


def folder(mod: str) -> str:
    """The folder (package) a module lives in: `rlhf_toy.lm.pipeline.cli` -> `rlhf_toy.lm.pipeline`."""
    path = modules()[mod]
    return mod if path.name == "__init__.py" else mod.rpartition(".")[0]


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Which folder imports which, from the module graph: the edges of a module to modules of other folders, a
    package's own `__init__` re-exports aside (it sits above its folder's modules)."""
    out: dict[str, set[str]] = {}
    for mod, targets in graph.items():
        if modules()[mod].name == "__init__.py":
            continue
        for t in targets:
            if folder(t) != folder(mod) and not t.startswith(folder(mod) + ".") and modules()[t].name != "__init__.py":
                out.setdefault(folder(mod), set()).add(folder(t))
    return out


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {}
    for mod, path in known.items():
        edges = set()
        for node in module_level_imports(ast.parse(path.read_text())):
            edges.update(resolve(mod, path, node, known))
        graph[mod] = edges - {mod}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle among non-package modules (a package's __init__ re-exporting its modules is not one), or None."""
    return find_cycle_in(graph, {m for m, p in modules().items() if p.name == "__init__.py"})


def find_cycle_in(graph: dict[str, set[str]], packages: set[str]) -> list[str] | None:
    """A cycle in `graph` through no node of `packages`, or None."""
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


def test_type_checking_imports_count():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import X\n")
    assert [n.module for n in module_level_imports(tree) if isinstance(n, ast.ImportFrom)] == ["typing", "b"]


def test_no_import_cycle_between_folders():
    """A folder is a layer: `lm.data` below `lm.models` below `lm.algorithms` below `lm.pipeline`; two folders
    that import each other are one tangled layer."""
    graph = folder_graph(import_graph())
    cycle = find_cycle_in(graph, set())
    assert cycle is None, " -> ".join(cycle or [])


def test_the_layers_keep_their_order():
    """`lm/__init__` states the order from the bottom up: data never imports models, algorithms or pipeline."""
    graph = folder_graph(import_graph())
    order = ["rlhf_toy.lm.data", "rlhf_toy.lm.models", "rlhf_toy.lm.algorithms", "rlhf_toy.lm.pipeline"]
    for i, low in enumerate(order):
        above = set(order[i + 1 :]) & graph.get(low, set())
        assert not above, f"{low} imports {sorted(above)}, a layer above it"


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


def test_the_command_list_loads_no_model_library():
    """`rlhf-toy --help` (and any command's table entry) imports the algorithm records and the core, not
    transformers, datasets or the stages: the command table names what it runs by reference. (Its time is a
    benchmark's business; what it imports is this test's.)"""
    import subprocess
    import sys

    code = (
        "import sys, contextlib, io\n"
        "from rlhf_toy.lm.pipeline.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    main(['--help'])\n"
        "heavy = [m for m in ('transformers', 'datasets', 'rlhf_toy.lm.pipeline.stages') if m in sys.modules]\n"
        "print(heavy, 'grpo' in out.getvalue())\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.stdout.strip() == "[] True", p.stdout + p.stderr
