"""Presets are readable: each is its config dataclass's defaults plus its own differences, one level.

A preset is a module-level UPPERCASE instance of a config dataclass. It must be built by calling the dataclass
itself (never `replace(OTHER_PRESET, ...)`, which once leaked clip annealing into the lesson unseen), and every
keyword it passes must differ from that dataclass's default (so what a preset lists is exactly what matters).
The reference page of every preset's values is generated and checked in tests/test_docs.py.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for p in [*ROOT.glob("rlhf_toy/**/*.py"), *ROOT.glob("cartpole/*.py")] if p.name != "__main__.py")


def module_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def preset_assignments(path: Path) -> list[tuple[str, ast.expr]]:
    """`(NAME, value)` of every module-level assignment to an UPPERCASE name whose value is a call."""
    out = []
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id.isupper()
            and isinstance(node.value, ast.Call)
        ):
            out.append((node.targets[0].id, node.value))
    return out


def all_presets() -> list[tuple[Path, str, ast.Call]]:
    found = []
    for path in SOURCES:
        module = importlib.import_module(module_of(path))
        for name, call in preset_assignments(path):
            value = getattr(module, name)
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                found.append((path, name, call))
    return found


PRESETS = all_presets()


def test_the_presets_are_found():
    names = {name for _, name, _ in PRESETS}
    assert {"LM_PPO", "LM_GRPO", "CARTPOLE_PPO", "LESSON_PPO", "LESSON_BREAK_CLIP_PPO", "SMOLLM2_RLHF"} <= names


@pytest.mark.parametrize("path,name,call", PRESETS, ids=[n for _, n, _ in PRESETS])
def test_a_preset_is_its_dataclass_defaults_plus_its_own_differences(path, name, call):
    module = importlib.import_module(module_of(path))
    value = getattr(module, name)
    cls = type(value)
    assert getattr(call.func, "id", None) == cls.__name__, f"{name} is not built by calling {cls.__name__} itself"
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.init}
    for kw in call.keywords:
        assert kw.arg is not None, f"{name} unpacks another mapping (**...): list its own values"
        assert getattr(value, kw.arg) != defaults[kw.arg], (
            f"{name}.{kw.arg} repeats the default ({defaults[kw.arg]!r}): list only what differs"
        )


def test_no_preset_is_derived_from_another():
    for path in SOURCES:
        for name, call in preset_assignments(path):
            func = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")
            if func == "replace":
                pytest.fail(f"{path.name}: {name} = replace(...) derives a preset from another")
