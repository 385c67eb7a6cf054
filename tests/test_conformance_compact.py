"""Readable conformance failures (issue 15, item 4), driven as a user runs the suite: ``pytest
conformance/ --impl=... --conformance-output=compact`` in a subprocess, against a mutant whose one
bug (padding values leak into GAE) fails several clauses."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.cases import load_cases, run_case
from conformance.report import TestRecord as Record  # not collected as a test class
from conformance.report import compact_summary, isolation

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
    # One block per failing clause, value clauses first, robustness last; within gae's clauses the
    # one whose hand case isolates the cause (a padded value, no holes, no NaN) leads: GAE-3, not
    # GAE-2 (issue 20). Each block says the clause's kind.
    assert blocks[0] == "FAIL (value) GAE-3: Terminal or bootstrap after the last action token  [op gae]", out
    assert blocks[-1].startswith("FAIL (robustness) ROB-2: "), out
    assert {b.split(":")[0] for b in blocks} >= {
        "FAIL (value) GAE-2",
        "FAIL (value) GAE-4",
        "FAIL (value) IN-1",
        "FAIL (value) RPP-1",
    }
    # The headline block: the case, its input, expected against got, one reproduction.
    assert "hand case: conformance/test_hand_cases.py::test_hand_case[GAE-3/c1-padded-value-ignored]" in out
    assert "  input:\n    rewards = torch.tensor(" in out
    assert "got nan, expected" in out and "max abs diff inf" in out  # a NaN is a mismatch
    assert "max abs diff 0," not in out
    assert out.count("import torch") == 2  # one reproduction per kind's headline (value, robustness)
    # No tracebacks, no Hypothesis blob pointing into the suite's own code, and the skipped tests
    # summarised one line per reason instead of pytest's line per reason and source line.
    assert "Traceback" not in out and "@reproduce_failure" not in out and "def test_" not in out
    # (the count is pytest's own: it grows with the spec's hand cases, 78 before STEP-6's two)
    skipped = re.search(r" (\d+) skipped in ", out)
    assert skipped is not None, out[-2000:]
    assert "SKIPPED [" not in out and f"skipped: {skipped.group(1)} tests, by reason" in out
    assert "    50  not applicable: IN-2 input validation" in out
    assert len(out.splitlines()) < 110, len(out.splitlines())

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


def _record(
    nodeid: str, clause: str, inputs: str, outcome: str = "failed", message: str = "x: differ"
) -> Record:
    return Record(
        nodeid, (clause,), outcome=outcome, message=message, ops=("gae",), inputs=inputs, reproduction=""
    )


def test_the_block_whose_case_isolates_the_cause_leads_and_value_comes_before_robustness() -> None:
    """Issue 20, with records as the recorder keeps them (no suite run): GAE-2's case has holes and
    NaN, GAE-3's is plain padding, so GAE-3 heads gae's blocks; the robustness block comes last
    although ROB-2 is listed first; every block names its kind."""
    holes = "mask = torch.tensor([[1, 0, 0, 1]], dtype=torch.bool)\n"
    holes += "rewards = torch.tensor([[0.0, nan, nan, 1.0]])"
    padded = "mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)\nrewards = torch.tensor([[0.0, 1.0, 0.0]])"
    records = [
        _record("conformance/test_hand_cases.py::test_hand_case_robustness[ROB-2/x]", "ROB-2", padded + "x"),
        _record("conformance/test_hand_cases.py::test_hand_case[GAE-2/holes]", "GAE-2", holes),
        _record("conformance/test_hand_cases.py::test_hand_case[GAE-3/padded]", "GAE-3", padded),
        _record("conformance/test_gae.py::test_x", "GAE-3", ""),
    ]
    titles = {"ROB-2": "Garbage: GAE", "GAE-2": "Holes are skipped", "GAE-3": "Terminal or bootstrap"}
    lines = compact_summary(records, titles, edge_inputs={"holes"})  # a pipeline that makes holes
    heads = [line for line in lines if line.startswith("FAIL ")]
    assert heads == [
        "FAIL (value) GAE-3: Terminal or bootstrap  [op gae]",
        "FAIL (value) GAE-2: Holes are skipped  [op gae]",
        "FAIL (robustness) ROB-2: Garbage: GAE  [op gae]",
    ]
    assert isolation(records[2]) < isolation(records[1]) < isolation(records[3])  # hand cases first
    # undeclared, holes are an edge input: GAE-2 is an edge block, after the value ones
    lines = compact_summary(records, titles)
    heads = [line for line in lines if line.startswith("FAIL ")]
    assert heads == [
        "FAIL (value) GAE-3: Terminal or bootstrap  [op gae]",
        "FAIL (edge) GAE-2: Holes are skipped  [op gae]",
        "FAIL (robustness) ROB-2: Garbage: GAE  [op gae]",
    ]
    assert "(value 1, edge 1, robustness 1)" in lines[-1] or any(
        "(value 1, edge 1, robustness 1)" in x for x in lines
    )


def test_skipped_tests_are_one_line_per_reason() -> None:
    skipped = {
        "not provided: op 'entropy' is not in the adapter's ops": 3,
        "not provided: op 'gae' is not in the adapter's ops": 2,
        "not applicable: IN-2 input validation is checked for ppo-ref's own functions only (tests/)": 7,
    }
    lines = compact_summary([_record("conformance/test_gae.py::test_x", "GAE-1", "")], {}, skipped)
    tail = lines[lines.index("skipped: 12 tests, by reason") :]
    assert tail == [
        "skipped: 12 tests, by reason",
        "     7  not applicable: IN-2 input validation is checked for ppo-ref's own functions only (tests/)",
        "     5  not provided: op '...' is not in the adapter's ops ('entropy', 'gae')",
    ]
    # a reason with two quoted names is kept whole; the apostrophe of "adapter's" is no quote
    two = "not provided: op 'kl_loss' is not in the adapter's ops; not provided: the keyword 'counts'"
    lines = compact_summary([], {}, {two: 2, "not provided: op 'gae' is not in the adapter's ops": 1})
    assert lines[1:] == [f"     2  {two}", "     1  not provided: op 'gae' is not in the adapter's ops"]


def test_a_matched_convention_prints_the_declaration_and_its_reason() -> None:
    record = Record(
        "conformance/test_masked.py::test_x",
        ("MASK-3",),
        outcome="matched",
        declarations=('"whiten_variance": "biased",',),
        reasons=("whiten_variance: biased (seen in OpenRLHF)",),
    )
    lines = compact_summary([record], {"MASK-3": "Whitening"})
    assert lines[:3] == [
        "MATCHES UNDECLARED CONVENTION in MASK-3: declare in the adapter's conventions",
        '    "whiten_variance": "biased",',
        "  legitimate because whiten_variance: biased (seen in OpenRLHF)",
    ]
    assert "0 failing tests in 0 clauses" in lines[-1]
