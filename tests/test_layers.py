"""The packages' imports run only downward: a static check of every module's imports.

Floors, lowest first: ``xielu`` (the activations, torch only) and ``settings`` (a section's
base, its rules and its error); ``model`` and ``data`` (neither
imports the other); ``training`` (the loop and its runtime); ``eval`` (which loads what training
wrote and runs models through training's runtime); ``scripts``; then ``train.py``, the
composition root that hands the trainer its components (the downstream evaluator). A module may
import its own package and any package on a lower floor, nothing on its own floor or above, so
there is no circle either. Lazy imports inside functions count: they are imports all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from train_helpers import ROOT

FLOORS = {"xielu": 0, "settings": 0, "model": 1, "data": 1, "training": 2, "eval": 3, "scripts": 4}


def imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
    return found & set(FLOORS)


MODULES = [
    (package, path)
    for package in FLOORS
    for path in sorted((ROOT / package).rglob("*.py"))
    if ".venv" not in path.parts
]


@pytest.mark.parametrize(
    "package,path", MODULES, ids=[str(p.relative_to(ROOT)) for _, p in MODULES]
)
def test_a_module_imports_only_its_own_package_and_lower_floors(package, path):
    upward = {
        other
        for other in imported_packages(path)
        if other != package and FLOORS[other] >= FLOORS[package]
    }
    assert not upward, f"{path.relative_to(ROOT)} imports {sorted(upward)}, not below {package}"


def test_the_check_sees_a_lazy_import_running_up(tmp_path):
    module = tmp_path / "lazy.py"
    module.write_text("def f():\n    from eval.downstream import during_training\n")
    assert imported_packages(module) == {"eval"}


def imported_modules(path: Path) -> set[str]:
    """Every module of this repository a file imports (lazy imports too), by dotted name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_two_modules_import_each_other_round_a_circle():
    """Within the floors, modules import in one direction too: a circle (``training.config``
    and ``training.schedule`` once imported each other, one of them lazily) means neither can
    be understood, or imported, first. Packages' ``__init__`` files re-export and are left out."""
    modules = {module_name(p): p for _, p in MODULES if p.name != "__init__.py"}
    graph = {name: imported_modules(path) & set(modules) - {name} for name, path in modules.items()}
    visiting, done, circles = set(), set(), []

    def visit(name: str, trail: list[str]) -> None:
        if name in done:
            return
        if name in visiting:
            circles.append([*trail[trail.index(name) :], name])
            return
        visiting.add(name)
        for other in sorted(graph[name]):
            visit(other, [*trail, name])
        visiting.discard(name)
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert not circles, "\n".join(" -> ".join(c) for c in circles)
