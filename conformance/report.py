"""The clause-by-clause conformance report (``--conformance-report PATH`` -> PATH.json, PATH.md):
the pytest plugin that records every conformance test's outcome and writes the report
(:class:`ConformanceRecorder`).

Its parts, each re-exported here: what is kept of one test (:mod:`.records`), the verdict of each
clause and the report as a dict (:mod:`.verdicts`, whose docstring lists the verdicts), the report as
Markdown (:mod:`.report_markdown`) and the compact terminal output (:mod:`.compact`).
"""

from __future__ import annotations

import json
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .cases import spec_clauses
from .compact import KIND_SEVERITY, compact_summary, counted, isolation, undeclared_conventions
from .inference import Inference
from .kinds import CONTRACT, KINDS, clause_kind
from .records import SUITE_DIR, ParsedFailure, TestRecord, failure_lines, parse_failure, suite_test_id
from .report_markdown import render_markdown
from .support import Context
from .verdicts import VERDICTS, build_report

__all__ = [
    "CONTRACT",
    "KINDS",
    "KIND_SEVERITY",
    "SUITE_DIR",
    "VERDICTS",
    "ConformanceRecorder",
    "ParsedFailure",
    "TestRecord",
    "build_report",
    "clause_kind",
    "compact_summary",
    "failure_lines",
    "isolation",
    "parse_failure",
    "render_markdown",
    "report_paths",
    "suite_test_id",
    "undeclared_conventions",
]


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
        return reason.removeprefix("Skipped: ")
    return str(longrepr)


def report_paths(path: str) -> tuple[Path, Path]:
    """(json, markdown) paths for ``--conformance-report PATH``: PATH is a stem; a trailing .json or
    .md is dropped first."""
    stem = Path(path)
    if stem.suffix in (".json", ".md"):
        stem = stem.with_suffix("")
    return stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".md")


@dataclass(eq=False)  # a pytest plugin: pluggy keeps plugins in sets, so identity hashing
class ConformanceRecorder:
    """A pytest plugin that records every conformance test's outcome and writes the report."""

    context: Context
    report_path: str | None
    args: Sequence[str]
    records: dict[str, TestRecord] = field(default_factory=dict)
    compact: bool = False
    inference: Inference | None = None
    items: list[pytest.Item] = field(default_factory=list)
    _texts: dict[str, str] = field(default_factory=dict)
    _explained: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)
    _suggested: dict[str, tuple[str, ...]] = field(default_factory=dict)
    _skips: dict[str, int] = field(default_factory=dict)

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.items = list(items)
        for item in items:
            clauses = tuple(c for marker in item.iter_markers("clause") for c in marker.args)
            ops = tuple(op for marker in item.iter_markers("ops") for op in marker.args)
            test_id = suite_test_id(Path(str(item.path)), item.nodeid)
            if clauses and test_id is not None:
                self.records[item.nodeid] = TestRecord(
                    test_id, tuple(dict.fromkeys(clauses)), ops=tuple(dict.fromkeys(ops))
                )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.failed and call.excinfo is not None and item.nodeid in self.records:
            # The exception's own text, notes included (Hypothesis' example, the reproductions),
            # whatever --tb style pytest prints it in.
            self._texts[item.nodeid] = "\n".join(
                "E   " + line for text in failure_lines(call.excinfo.value) for line in str(text).splitlines()
            )
            if report.when == "call" and self.inference is not None:
                self._infer(item, report)
        return report

    def _infer(self, item: pytest.Item, report: pytest.TestReport) -> None:
        """A failing value test: a convention that explains it turns the report into a pass (the
        record keeps the failure under the declared conventions and the declaration); otherwise
        the declarations that widen a tolerance or the inputs under which it passes are kept."""
        assert self.inference is not None
        try:
            match = self.inference.explain(item)
            found = self.inference.suggest(item) if match is None else []
        except (Exception, pytest.fail.Exception) as error:  # never the session's end: the FAIL stays
            failure = f"inference failed: {type(error).__name__}: {error}"
            report.sections.append(("ppo-ref conformance", failure))
            return
        if match is None:
            self._suggested[item.nodeid] = tuple(f"{s.declaration()}  # {s.why}" for s in found)
            return
        alternative = match.alternative
        self._explained[item.nodeid] = (tuple(alternative.declarations()), tuple(alternative.reasons()))
        report.outcome = "passed"
        report.longrepr = None
        report.sections.append(
            ("ppo-ref conformance", "matches undeclared convention: " + " ".join(alternative.declarations()))
        )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped:  # every skipped test, for the compact output's one line per reason
            reason = _skip_reason(report)
            self._skips[reason] = self._skips.get(reason, 0) + 1
        record = self.records.get(report.nodeid)
        if record is None or record.outcome == "failed":
            return
        if report.failed:
            parsed = parse_failure(self._texts.pop(report.nodeid, "") or report.longreprtext or "")
            record.outcome, record.message = "failed", parsed.message
            record.inputs, record.reproduction = parsed.inputs, parsed.reproduction
            record.suggestions = self._suggested.pop(report.nodeid, ())
        elif report.when == "call" and report.nodeid in self._explained:
            parsed = parse_failure(self._texts.pop(report.nodeid, ""))
            record.outcome, record.message = "matched", parsed.message
            record.inputs, record.reproduction = parsed.inputs, parsed.reproduction
            record.declarations, record.reasons = self._explained.pop(report.nodeid)
        elif report.skipped:
            record.outcome, record.message = "skipped", _skip_reason(report)
        elif report.when == "call" and report.passed:
            record.outcome = "passed"
            record.step_conventions = tuple(
                (str(value[0]), str(value[1]), str(value[2]))
                for name, value in report.user_properties
                if name == "step_convention" and isinstance(value, tuple) and len(value) == 3
            )

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.inference is not None and self.inference.reruns:
            terminalreporter.write_line(
                f"ppo-ref conformance inference: {counted(self.inference.reruns, 're-run')} of failing value "
                f"tests and their clauses, {self.inference.seconds:.1f} s"
            )
        matched = undeclared_conventions(list(self.records.values()))
        if matched and not self.compact:
            terminalreporter.write_sep("=", "ppo-ref conformance: undeclared conventions", yellow=True)
            for line in matched:
                terminalreporter.write_line(line)
        if not self.compact:
            return
        titles = {CONTRACT: "Adapter contract and declared conventions", **spec_clauses()}
        edge = self.context.conventions.edge_inputs
        lines = compact_summary(list(self.records.values()), titles, self._skips, edge)
        if lines:
            terminalreporter.write_sep("=", "ppo-ref conformance failures (compact)", red=True, bold=True)
            for line in lines:
                terminalreporter.write_line(line)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.report_path is None:
            return
        report = build_report(self.context, list(self.records.values()), self.args, self.inference)
        json_path, md_path = report_paths(self.report_path)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        md_path.write_text(render_markdown(report), encoding="utf-8")
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"conformance report: {json_path} and {md_path}")
