"""Readable conformance failures (issue 15, item 4), driven as a user runs the suite: ``pytest
conformance/ --impl=... --conformance-output=compact`` in a subprocess, against a mutant whose one
bug (padding values leak into GAE) fails several clauses."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.cases import load_cases, run_case

ROOT = Path(__file__).resolve().parent.parent
MUTANT = "--impl=tests.mutants.zoo:FACTORIES.C1_padding_values_leak_into_gae"


def _suite(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider", "--conformance-examples=5"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.multiprocess  # runs pytest in a subprocess
def test_compact_output_is_one_block_per_failing_clause_with_one_reproduction(tmp_path: Path) -> None:
    stem = tmp_path / "report"
    run = _suite(
        "conformance/test_gae.py",
        "conformance/test_hand_cases.py",
        MUTANT,
        "--conformance-output=compact",
        f"--conformance-report={stem}",
    )
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    out = run.stdout
    blocks = [line for line in out.splitlines() if line.startswith("FAIL ")]
    # One bug in gae: one block, headed by the first failing clause; the others are grouped under it.
    assert blocks == ["FAIL GAE-2: Holes are skipped  [op gae]"], out[-4000:]
    assert "related (same op), not shown: GAE-3" in out
    assert "IN-1 (1 test)" in out
    # The block: the case, its input, expected against got (a NaN is a mismatch), one reproduction.
    assert "hand case: conformance/test_hand_cases.py::test_hand_case[GAE-2/" in out
    assert "  input:\n    rewards = torch.tensor(" in out
    assert "got nan, expected" in out and "max abs diff inf" in out
    assert "max abs diff 0," not in out
    assert out.count("import torch") == 1  # the reproduction, once
    # No tracebacks, no Hypothesis blob pointing into the suite's own code.
    assert "Traceback" not in out and "@reproduce_failure" not in out and "def test_" not in out
    assert len(out.splitlines()) < 60, len(out.splitlines())

    # The report keeps every failure's whole reproduction, and it runs.
    report = json.loads(stem.with_name("report.json").read_text(encoding="utf-8"))
    entry = next(c for c in report["clauses"] if c["id"] == "GAE-2")
    assert entry["verdict"] == "fail" and "entries differ" in entry["first_failure"]
    source = entry["first_failure_reproduction"]
    assert "import torch" in source and source.count("\n") >= 5
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(source, "reproduction", "exec"), {})
    assert printed.getvalue().count("tensor(") >= 2  # it runs, printing what to compare
    markdown = stem.with_name("report.md").read_text(encoding="utf-8")
    assert source in markdown  # the Markdown report keeps it whole too


@pytest.mark.multiprocess  # runs pytest in a subprocess, twice
def test_failing_examples_are_not_shrunk_unless_asked() -> None:
    """Shrinking (and Hypothesis' explain phase and blob) made failing runs 10-25x slower: off by
    default, on with --conformance-shrink."""
    test = "conformance/test_gae.py::test_holes_and_padding_are_skipped"
    quick = _suite(test, MUTANT)
    assert quick.returncode == 1
    assert "Explanation:" not in quick.stdout and "@reproduce_failure" not in quick.stdout
    assert "# --- reproduction" in quick.stdout  # the suite's own reproduction is still printed
    shrunk = _suite(test, MUTANT, "--conformance-shrink")
    assert shrunk.returncode == 1
    assert "@reproduce_failure" in shrunk.stdout


class _NanGae:
    """A GAE that returns NaN on the first position and the reference elsewhere."""

    def gae(self, **kwargs: object) -> object:
        import ppo_ref

        advantages, returns = ppo_ref.gae(**kwargs)  # type: ignore[arg-type]
        advantages = advantages.clone()
        advantages[0, 0] = float("nan")
        return advantages, returns


def test_a_nan_against_a_number_is_reported_as_a_mismatch() -> None:
    (case,) = [c for c in load_cases() if c.id == "GAE-1/three-step-lambda-0.5"]
    (message,) = run_case(case, _NanGae())
    assert "first mismatch at index (0, 0): got nan, expected 0.425" in message
    assert "max abs diff inf" in message and "max abs diff 0," not in message
