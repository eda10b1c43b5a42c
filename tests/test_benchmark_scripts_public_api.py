"""The scripts in benchmarks/ use mmagent's public API only: what they measure is what users call."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


def _private_uses(tree: ast.AST) -> list[str]:
    """mmagent names a script imports that start with an underscore (module paths included), and any private
    attribute it reaches (``policy._encode``, ``stream._decode``, ...)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mmagent"):
            found += [f"from {node.module} import {a.name}" for a in node.names
                      if any(p.startswith("_") for p in node.module.split(".") + [a.name])]
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names
                      if a.name.startswith("mmagent") and any(p.startswith("_") for p in a.name.split("."))]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append(f".{node.attr} (line {node.lineno})")
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_benchmark_scripts_use_no_private_names(script: Path) -> None:
    assert _private_uses(ast.parse(script.read_text())) == []


def test_the_check_sees_private_names() -> None:
    tree = ast.parse("from mmagent.training.rl import _update\nfrom mmagent.policy._x import y\npolicy._encode(1)\n")
    assert sorted(_private_uses(tree)) == ["._encode (line 3)", "from mmagent.policy._x import y",
                                           "from mmagent.training.rl import _update"]
