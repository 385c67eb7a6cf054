"""The worked examples in ppo-ref's docstrings run, and print what they say (doctests).

Every module of the ``ppo_ref`` package whose source holds a ``>>>`` example is collected here, so
the examples of a new module are checked as soon as it has one. The examples run in their module's
namespace (``torch`` and the module's functions are in scope), as ``python -m doctest`` would.
"""

from __future__ import annotations

import doctest
import importlib
import io
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ppo_ref"
MATH_MODULES = ("advantages", "kl", "logprobs", "losses", "masked")
"""The reference math: each of these must hold examples (a module losing all of them is a failure)."""


def _modules_with_examples() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>>" in path.read_text(encoding="utf-8"):
            parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = _modules_with_examples()


def test_the_math_modules_have_examples() -> None:
    assert {f"ppo_ref.{name}" for name in MATH_MODULES} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report = io.StringIO()
    for test in finder.find(module, name, globs=dict(vars(module))):
        runner.run(test, out=report.write)
    results = runner.summarize(verbose=False)
    assert results.attempted > 0, f"{name}: '>>>' in the source but no docstring example was found"
    assert results.failed == 0, report.getvalue()
