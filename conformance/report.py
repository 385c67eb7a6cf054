"""The clause-by-clause conformance report (``--conformance-report PATH`` -> PATH.json, PATH.md).

Verdicts, per clause of ``spec/SPEC.md`` (headings ``### CLAUSE-ID: Title``):

- ``fail``: at least one test of the clause failed;
- ``declared convention``: its tests passed against the reference variant of a convention the
  adapter declares (listed in the row);
- ``pass``: its tests passed against the plain reference;
- ``not provided``: every test of the clause was skipped because the adapter does not provide the
  op or capability (the reason is given);
- ``not applicable``: no op of the adapter contract computes the clause (e.g. the KL controllers,
  or IN-2, which holds for ppo-ref's own functions and is tested in ``tests/``);
- ``not run``: no test of the clause ran (deselected, not collected, or skipped for another reason).

The pseudo-clause ``CONTRACT`` is the adapter's own attributes and declared conventions.
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import ppo_ref
from conformance.cases import spec_clauses
from conformance.support import Context
from ppo_ref.adapters import contract_problems, convention_problems
from ppo_ref.adapters.conventions import describe

__all__ = ["CONTRACT", "ConformanceRecorder", "TestRecord", "build_report", "render_markdown", "report_paths"]

CONTRACT = "CONTRACT"
VERDICTS = ("pass", "declared convention", "fail", "not provided", "not applicable", "not run")


@dataclass
class TestRecord:
    """The outcome of one test item (all phases folded): passed, failed or skipped, and why."""

    nodeid: str
    clauses: tuple[str, ...]
    outcome: str = "not run"
    message: str = ""


_EXPLANATION_STARTS = (
    "assert ",
    "+  where",
    "Failing test case",
    "Falsifying example",
    "# The test",
    "where ",
)


def _failure_message(report: pytest.TestReport) -> str:
    """The failure's own message: the ``E`` lines up to pytest's or Hypothesis' explanation."""
    text = report.longreprtext or ""
    errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    lines: list[str] = []
    for line in errors:
        if line.startswith(_EXPLANATION_STARTS):
            break
        if line:
            lines.append(line)
    if not lines:
        lines = errors[:1] or [line.strip() for line in text.splitlines() if line.strip()][-1:]
    message = " ".join(lines[:4])
    return message if len(message) <= 600 else message[:597] + "..."


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

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            clauses = tuple(c for marker in item.iter_markers("clause") for c in marker.args)
            if clauses and "conformance" in Path(str(item.path)).parts:
                self.records[item.nodeid] = TestRecord(item.nodeid, tuple(dict.fromkeys(clauses)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = self.records.get(report.nodeid)
        if record is None or record.outcome == "failed":
            return
        if report.failed:
            record.outcome, record.message = "failed", _failure_message(report)
        elif report.skipped:
            record.outcome, record.message = "skipped", _skip_reason(report)
        elif report.when == "call" and report.passed:
            record.outcome = "passed"

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.report_path is None:
            return
        report = build_report(self.context, list(self.records.values()), self.args)
        json_path, md_path = report_paths(self.report_path)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        md_path.write_text(render_markdown(report), encoding="utf-8")
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"conformance report: {json_path} and {md_path}")


def _clause_entry(clause: str, title: str, records: list[TestRecord], declared: list[str]) -> dict[str, Any]:
    counts = {name: sum(r.outcome == name for r in records) for name in ("passed", "failed", "skipped")}
    failed = [r for r in records if r.outcome == "failed"]
    skip_reasons = list(dict.fromkeys(r.message for r in records if r.outcome == "skipped"))
    not_provided = [reason for reason in skip_reasons if reason.startswith("not provided")]
    if failed:
        verdict = "fail"
    elif counts["passed"]:
        verdict = "declared convention" if declared else "pass"
    elif not_provided:
        verdict = "not provided"
    elif not records:
        verdict, skip_reasons = "not run", ["no test of this clause was collected in this run"]
    elif all(r.outcome == "skipped" and r.message.startswith("not applicable") for r in records):
        verdict = "not applicable"
    else:
        verdict = "not run"
    return {
        "id": clause,
        "title": title,
        "verdict": verdict,
        "tests": counts,
        "declared_conventions": declared,
        "failing_tests": [r.nodeid for r in failed],
        "first_failure": failed[0].message if failed else "",
        "skip_reasons": skip_reasons,
    }


def build_report(context: Context, records: list[TestRecord], args: Sequence[str]) -> dict[str, Any]:
    """The report as a JSON-ready dict (see the module docstring for the verdicts)."""
    adapter = context.adapter
    titles = {CONTRACT: "Adapter contract and declared conventions", **spec_clauses()}
    by_clause: dict[str, list[TestRecord]] = {clause: [] for clause in titles}
    for record in records:
        for clause in record.clauses:
            by_clause.setdefault(clause, []).append(record)
    touched = context.conventions.clauses()
    clauses = [
        _clause_entry(
            clause, titles.get(clause, "(not in SPEC.md)"), by_clause[clause], touched.get(clause, [])
        )
        for clause in by_clause
    ]
    problems = contract_problems(adapter) + convention_problems(getattr(adapter, "conventions", None))
    summary = {verdict: sum(c["verdict"] == verdict for c in clauses) for verdict in VERDICTS}
    return {
        "implementation": {
            "impl": context.impl,
            "name": str(getattr(adapter, "name", "?")),
            "version": str(getattr(adapter, "version", "?")),
            "provenance": str(getattr(adapter, "provenance", "?")),
            "ops": sorted(getattr(adapter, "ops", ()) or ()),
            "declared_conventions": {k: describe(v) for k, v in context.conventions.deviations().items()},
            "contract_problems": problems,
        },
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "ppo_ref_version": ppo_ref.__version__,
        "python": sys.version.split()[0],
        "command": "pytest " + " ".join(args),
        "summary": summary,
        "passed": summary["fail"] == 0,
        "clauses": clauses,
    }


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _notes(entry: dict[str, Any]) -> str:
    if entry["verdict"] == "fail":
        return f"{len(entry['failing_tests'])} failing; first: {entry['first_failure'][:160]}"
    if entry["declared_conventions"]:
        return "checked against the variant for " + ", ".join(f"`{d}`" for d in entry["declared_conventions"])
    if entry["verdict"] in ("not provided", "not applicable", "not run"):
        return "; ".join(entry["skip_reasons"])[:240]
    partial = [r for r in entry["skip_reasons"] if r.startswith("not provided")]
    text = "partly not provided: " + "; ".join(r.removeprefix("not provided: ") for r in partial)
    return text[:240] if partial else ""


def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: the implementation, a summary, one row per clause, then failures."""
    impl = report["implementation"]
    declared = ", ".join(f"`{k}={v}`" for k, v in impl["declared_conventions"].items()) or "none"
    summary = ", ".join(f"{n} {verdict}" for verdict, n in report["summary"].items() if n)
    lines = [
        f"# Conformance report: {impl['name']} {impl['version']}",
        "",
        f"**Result: {'PASS' if report['passed'] else 'FAIL'}** ({summary})",
        "",
        "| | |",
        "|---|---|",
        f"| Implementation | `{impl['name']}` {impl['version']} (`--impl={impl['impl']}`) |",
        f"| Provenance | {_cell(impl['provenance'])} |",
        f"| Ops provided | {', '.join(f'`{op}`' for op in impl['ops']) or 'none'} |",
        f"| Declared conventions | {_cell(declared)} |",
        f"| Date | {report['date']} |",
        f"| ppo-ref | {report['ppo_ref_version']} (Python {report['python']}) |",
        f"| Command | `{_cell(report['command'])}` |",
        "",
        "| Clause | Title | Verdict | Tests (pass/fail/skip) | Notes |",
        "|---|---|---|---|---|",
    ]
    for entry in report["clauses"]:
        verdict = "**FAIL**" if entry["verdict"] == "fail" else entry["verdict"]
        tests = entry["tests"]
        lines.append(
            f"| {entry['id']} | {_cell(entry['title'])} | {verdict} | "
            f"{tests['passed']}/{tests['failed']}/{tests['skipped']} | {_cell(_notes(entry))} |"
        )
    failures = [entry for entry in report["clauses"] if entry["verdict"] == "fail"]
    if impl["contract_problems"] or failures:
        lines += ["", "## Failures", ""]
    if impl["contract_problems"]:
        lines += ["### Adapter contract problems", ""]
        lines += [f"- {_cell(problem)}" for problem in impl["contract_problems"]]
        lines.append("")
    for entry in failures:
        lines += [
            f"### {entry['id']}: {entry['title']}",
            "",
            f"First failure: {_cell(entry['first_failure'])}",
            "",
        ]
        lines += [f"- `{nodeid}`" for nodeid in entry["failing_tests"]]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
