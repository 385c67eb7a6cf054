"""The documentation's Python examples run as printed (issue 15; found across README.md and docs/ by
``tests/docs_text.py``, issue 29): the quick-start snippet prints what its
comments say and imports only what it uses; the Python API example trains and records its reward."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_text import python_block_after


def run(source: str, cwd: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-c", source], cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def unused_imports(source: str) -> list[str]:
    tree = ast.parse(source)
    imported = {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    return sorted(imported - used)


@pytest.mark.multiprocess
def test_quick_start_snippet_prints_what_its_comments_say(tmp_path: Path) -> None:
    source = python_block_after("Use the functions directly")
    assert unused_imports(source) == []
    promised = [line.split("#", 1)[1].strip() for line in source.splitlines() if line.startswith("print(")]
    printed = run(source, tmp_path).splitlines()
    assert len(printed) == len(promised) >= 2
    for got, comment in zip(printed, promised, strict=True):
        assert comment.startswith(got), (got, comment)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_python_api_example_trains_and_records_its_reward(tmp_path: Path) -> None:
    source = python_block_after("## From Python: `PPOTrainer` and `TrainingSetup`")
    assert unused_imports(source) == []
    printed = run(source, tmp_path)
    assert re.search(r"^score -?\d\.\d{3} -> -?\d\.\d{3}$", printed, flags=re.MULTILINE), printed
    assert "reward: function __main__:vowels" in printed
    summary = json.loads((tmp_path / "runs" / "vowels" / "summary.json").read_text())
    assert summary["task"] == "vowels" and summary["iterations_done"] == 3
    assert summary["config"]["task"] is None  # no built-in task was used: none is claimed
    assert summary["reward"]["evaluation"] == "function __main__:vowels"
