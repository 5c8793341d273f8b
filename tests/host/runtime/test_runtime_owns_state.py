"""The runtime owns its state (ADR 0043): its modules reach each other's objects through their
public methods (the sandboxes through `SandboxTable`, the runtime through `RuntimeParts`),
never through another object's `_private` attributes; and none of its parts imports `core`
(also an import contract in pyproject.toml, which sees only what is imported)."""

from __future__ import annotations

import ast
from pathlib import Path

import pandastack.host.runtime as runtime_package

RUNTIME_DIR = Path(runtime_package.__file__).parent
# Private names of the standard library that are its public interface.
STDLIB_PRIVATE = {("os", "_exit")}


def _private_reaches(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, `obj._name`) for each attribute access of a single-underscore name on anything
    but `self` or `cls`."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or name.startswith("__"):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and (owner.id in ("self", "cls") or
                                            (owner.id, name) in STDLIB_PRIVATE):
            continue
        found.append((node.lineno, f"{ast.unparse(owner)}.{name}"))
    return found


def _modules() -> list[Path]:
    modules = sorted(RUNTIME_DIR.rglob("*.py"))
    assert len(modules) > 10  # the walk found the package
    return modules


def test_no_module_of_the_runtime_touches_another_objects_privates() -> None:
    offenders = [f"{path.name}:{line}: {text}" for path in _modules()
                 for line, text in _private_reaches(ast.parse(path.read_text()))]
    assert offenders == []


def test_the_check_sees_a_reach_into_the_runtime() -> None:
    source = "def f(rt):\n    return rt._records, self_like._save(1), self._own, os._exit\n"
    assert [text for _, text in _private_reaches(ast.parse(source))] == [
        "rt._records", "self_like._save"]


def test_no_part_of_the_runtime_imports_core() -> None:
    importers = []
    for path in _modules():
        if path.stem in ("core", "__init__"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if any(n == "pandastack.host.runtime.core" for n in names):
                importers.append(f"{path.name}:{node.lineno}")
    assert importers == []
