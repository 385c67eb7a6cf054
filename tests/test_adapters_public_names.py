"""The adapters reach the math only through its public names (one path per formula, issue 13).

An adapter that imported a private helper of the math (``_mean_and_var``, a ``_``-prefixed
module) would depend on internals that may change without notice and could hide a second copy of
a formula; every name an adapter imports from a math module must be in that module's ``__all__``.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ADAPTERS = Path(__file__).resolve().parent.parent / "ppo_ref" / "adapters"
FILES = sorted(ADAPTERS.rglob("*.py"))


def _math_imports(path: Path) -> list[tuple[str, str]]:
    """``(module, name)`` for every ``from ppo_ref.X import name`` outside ``ppo_ref.adapters``."""
    found: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ppo_ref"):
            if node.module == "ppo_ref.adapters" or node.module.startswith("ppo_ref.adapters."):
                continue
            found.extend((node.module, alias.name) for alias in node.names)
    return found


def test_the_adapters_are_found() -> None:
    assert {"reference.py", "catalogue.py", "trl.py", "verl.py"} <= {path.name for path in FILES}


@pytest.mark.parametrize("path", FILES, ids=[str(path.relative_to(ADAPTERS)) for path in FILES])
def test_adapters_import_only_public_names_of_the_math(path: Path) -> None:
    for module_name, name in _math_imports(path):
        assert not any(part.startswith("_") for part in module_name.split(".")), (
            f"{path.name} imports from the private module {module_name}"
        )
        public = getattr(importlib.import_module(module_name), "__all__", [])
        assert name in public, f"{path.name} imports {name!r}, not in {module_name}.__all__"
