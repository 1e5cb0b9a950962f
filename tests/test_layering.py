"""Imports point down: ``unlearning/`` and ``evaluation/`` sit side by side and never import each other (shared
pieces live below both: ``idunlearn.conditions``, ``idunlearn.faces``); ``audit/`` sits on top of them. Read from the source, so an import inside a
function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "idunlearn"


def imported_modules(source: str, package: str) -> set[str]:
    """Absolute names of every module that ``import`` or ``from ... import`` in ``source`` (a module of the
    dotted ``package``) reaches; ``from .x import y`` counts as both ``package.x`` and ``package.x.y``."""
    parts, names = package.split("."), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = parts[:len(parts) - node.level + 1] if node.level else []
            stem = ".".join([*base, *(node.module.split(".") if node.module else [])])
            names.add(stem)
            names.update(f"{stem}.{alias.name}" for alias in node.names)
    return names


def package_imports(package: str) -> dict[str, set[str]]:
    """File (relative to the package root) -> modules it imports, for every module under ``idunlearn.<package>``."""
    return {str(path.relative_to(PACKAGE)): imported_modules(path.read_text(), ".".join(
                ["idunlearn", *path.relative_to(PACKAGE).parent.parts]))
            for path in sorted((PACKAGE / package).rglob("*.py"))}


def test_relative_and_function_level_imports_are_resolved():
    source = "from ..evaluation.generation import SIZE\ndef f():\n    from .. import evaluation\n    import torch.nn\n"
    assert imported_modules(source, "idunlearn.unlearning") == {
        "idunlearn.evaluation.generation", "idunlearn.evaluation.generation.SIZE", "idunlearn",
        "idunlearn.evaluation", "torch.nn"}
    assert "idunlearn.unlearning.conditions" in package_imports("unlearning")["unlearning/wid.py"]


@pytest.mark.parametrize("package, forbidden", [
    ("unlearning", "evaluation"), ("evaluation", "unlearning"),
    # models (generators and their training) sit below both
    ("models", "evaluation"), ("models", "unlearning"),
    # the audit sits on top of both: nothing below it imports it
    *[(below, "audit") for below in ("unlearning", "evaluation", "models", "faces")],
    # the tuning protocol (idunlearn.tuning) uses unlearning and evaluation; nothing below it imports it
    *[(below, "tuning") for below in ("unlearning", "evaluation", "models", "faces", "audit")],
    # forget requests (idunlearn.request) use everything below them
    *[(below, "request") for below in ("unlearning", "evaluation", "models", "faces", "audit")],
    # the rebuild (idunlearn.rebuild, rebuild_tables) uses models and unlearning's search; the audit reads it
    *[(below, name) for below in ("unlearning", "evaluation", "models", "faces") for name in
      ("rebuild", "rebuild_tables")]])
def test_imports_point_down(package, forbidden):
    prefix = f"idunlearn.{forbidden}"
    offending = {path: sorted(name for name in names if name == prefix or name.startswith(prefix + "."))
                 for path, names in package_imports(package).items()}
    assert {path: names for path, names in offending.items() if names} == {}
