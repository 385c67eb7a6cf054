"""Run the conformance suite against several implementations, one pytest session each, in one process.

    python -m tests.mutants.run_suite --out DIR IMPL [IMPL ...]

For each IMPL this runs ``pytest conformance/ -x -q -p no:cacheprovider --impl=IMPL
--conformance-report=DIR/run-NN`` through ``pytest.main`` (torch and the suite are imported once,
which keeps the whole zoo within minutes on two cores) and appends one record to
``DIR/results.json``: the exit code, the counts of passed / failed / errored / deselected tests and
of collection errors, the seconds it took, the paths of its JSON report and the tail of its output.
Run it from the repository root (``tests.mutants.zoo`` and ``conformance`` must be importable).

A mutant differs from ``mine`` in exactly one op, so a test that calls only other ops gives it
mine's verdict: a pass. For an IMPL that is a mutant, the session therefore deselects the tests
whose ``ops`` markers all name other ops (tests without an ``ops`` marker stay); the verdict is the
one the whole suite would give, in a fraction of the time. ``--whole-suite`` turns this off.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

OUTPUT_TAIL = 4000


@dataclass
class RunRecord:
    """The outcome of one conformance session."""

    impl: str
    exit_code: int = -1
    passed: int = 0
    failed: int = 0
    errors: int = 0
    collection_errors: int = 0
    deselected: int = 0
    failed_tests: list[str] = field(default_factory=list)
    seconds: float = 0.0
    report: str = ""
    output_tail: str = ""


class OutcomeCounter:
    """A pytest plugin counting test outcomes by phase: a failing call is a failed test, a failing
    setup or teardown an error, a failing collector a collection error."""

    def __init__(self, record: RunRecord) -> None:
        self.record = record

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed and report.when == "call":
            self.record.failed += 1
            self.record.failed_tests.append(report.nodeid)
        elif report.failed:
            self.record.errors += 1
        elif report.passed and report.when == "call":
            self.record.passed += 1

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.record.collection_errors += 1

    def pytest_deselected(self, items: Sequence[pytest.Item]) -> None:
        self.record.deselected += len(items)


class OpFocus:
    """A pytest plugin deselecting the tests that cannot tell a mutant of ``op`` from ``mine``: those
    with ``ops`` markers, none of which names ``op``."""

    def __init__(self, op: str) -> None:
        self.op = op

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        kept: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        for item in items:
            named = {name for marker in item.iter_markers("ops") for name in marker.args}
            (dropped if named and self.op not in named else kept).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept


def mutated_op(impl: str) -> str | None:
    """The op a mutant of the zoo replaces (None when ``impl`` is not such a mutant)."""
    from tests.mutants.zoo import MUTANTS

    for spec in MUTANTS.values():
        if spec.impl == impl:
            return spec.op
    return None


def run_one(
    impl: str, report_stem: Path, extra_args: Sequence[str] = (), whole_suite: bool = False
) -> RunRecord:
    """One ``pytest conformance/ -x`` session against ``impl`` (plus ``extra_args``), output captured;
    for a mutant, only the tests that call its op unless ``whole_suite``."""
    record = RunRecord(impl=impl, report=str(report_stem) + ".json")
    op = None if whole_suite else mutated_op(impl)
    plugins: list[object] = [OutcomeCounter(record)]
    if op is not None:
        plugins.append(OpFocus(op))
    args = [
        "conformance/",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--impl={impl}",
        f"--conformance-report={report_stem}",
        *extra_args,
    ]
    output = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        record.exit_code = int(pytest.main(args, plugins=plugins))
    record.seconds = round(time.perf_counter() - start, 2)
    record.output_tail = output.getvalue()[-OUTPUT_TAIL:]
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="directory for the reports and results.json")
    parser.add_argument(
        "--pytest-args",
        default="",
        help="extra pytest arguments for every session, one shell-quoted string (\"-k 'not hand_case'\")",
    )
    parser.add_argument(
        "--whole-suite",
        action="store_true",
        help="run every test against a mutant too, not only the tests that call its op",
    )
    parser.add_argument("impls", nargs="+", help="--impl values, run in this order")
    options = parser.parse_args(argv)
    options.out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, object]] = []
    for number, impl in enumerate(options.impls):
        stem = options.out / f"run-{number:02d}"
        results.append(asdict(run_one(impl, stem, shlex.split(options.pytest_args), options.whole_suite)))
        (options.out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
