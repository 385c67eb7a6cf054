"""Run the conformance suite from Python and get the report as an object.

    from ppo_ref_conformance.api import run_conformance      # installed (pip install ppo-ref)
    from conformance.api import run_conformance              # in a ppo-ref checkout

    report = run_conformance("my_module:make_adapter", report="conformance-report")
    print(report.passed, report.spec_version, report.ppo_ref_version)
    for clause in report.failures():
        print(clause.id, clause.first_failure, clause.reproduction, sep="\\n")

:func:`run_conformance` runs the same pytest session as ``pytest --pyargs ppo_ref_conformance
--impl=NAME --conformance-report=PATH``, in this process (``pytest.main``), and loads the JSON report
it wrote into a :class:`ConformanceReport`: one :class:`ClauseResult` per clause with its verdict
(``pass``, ``declared convention``, ``fail`` with the falsifying input and a reproduction, ``not
provided``, ``not applicable``, ``not run``; see :mod:`.report`). The JSON and Markdown files are
the ones the command line writes.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from ppo_ref.adapters import AdapterLoadError, UnknownAdapterError, get_adapter

from . import plugin

# .report is imported inside the functions: it imports Hypothesis, which pytest's assertion rewriting
# wants to import itself in run_conformance's session.

__all__ = ["ClauseResult", "ConformanceReport", "run_conformance"]


@dataclass(frozen=True)
class ClauseResult:
    """One clause's row of the report."""

    id: str
    title: str
    verdict: str
    """``pass``, ``declared convention``, ``matches undeclared convention``, ``fail``, ``not
    provided``, ``not applicable`` or ``not run``."""
    passed_tests: int
    failed_tests: int
    skipped_tests: int
    declared_conventions: tuple[str, ...]
    """The adapter's declared conventions this clause was checked against (``declared convention``)."""
    failing_tests: tuple[str, ...]
    first_failure: str
    """The first failing test's message: expected against got, and the input it failed on."""
    first_failure_test: str
    reproduction: str
    """Python code that reruns the first failing call."""
    reasons: tuple[str, ...]
    """Why tests were skipped (``not provided: ...``, ``not applicable: ...``)."""
    kind: str = "value"
    """``value`` (the numbers, on inputs as the adapter declares them), ``robustness`` (``ROB-*``:
    garbage in masked-out slots) or ``contract``."""
    undeclared_conventions: tuple[str, ...] = ()
    """For ``matches undeclared convention``: the lines to paste into the adapter's conventions."""
    suggestions: tuple[str, ...] = ()
    """For ``fail``: declarations that widen a tolerance or change the inputs under which the failing
    tests pass (a hint, not a match)."""

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> ClauseResult:
        """A clause entry of the JSON report."""
        if not isinstance(entry, Mapping):
            kind = type(entry).__name__
            raise ValueError(f"entry: expected a mapping (a clause of the JSON report), got {kind}")
        from .report import VERDICTS

        try:
            verdict = str(entry["verdict"])
            if verdict not in VERDICTS:
                raise ValueError(f"entry: unknown verdict {verdict!r} (one of {', '.join(VERDICTS)})")
            tests = entry["tests"]
            return cls(
                id=str(entry["id"]),
                title=str(entry["title"]),
                verdict=verdict,
                passed_tests=int(tests["passed"]),
                failed_tests=int(tests["failed"]),
                skipped_tests=int(tests["skipped"]),
                declared_conventions=tuple(str(d) for d in entry["declared_conventions"]),
                failing_tests=tuple(str(t) for t in entry["failing_tests"]),
                first_failure=str(entry["first_failure"]),
                first_failure_test=str(entry.get("first_failure_test", "")),
                reproduction=str(entry.get("first_failure_reproduction", "")),
                reasons=tuple(str(r) for r in entry["skip_reasons"]),
                kind=str(entry.get("kind", "value")),
                undeclared_conventions=tuple(str(d) for d in entry.get("undeclared_conventions", ())),
                suggestions=tuple(str(d) for d in entry.get("suggestions", ())),
            )
        except (KeyError, TypeError) as error:
            raise ValueError(f"entry: not a clause of a conformance report ({error!r})") from error


@dataclass(frozen=True)
class ConformanceReport:
    """The conformance report of one implementation (the JSON report, typed)."""

    impl: str
    """The ``--impl`` value the suite ran with."""
    name: str
    version: str
    passed: bool
    """No clause failed."""
    spec_version: str
    """The version of ``spec/SPEC.md`` the implementation was checked against."""
    ppo_ref_version: str
    summary: Mapping[str, int]
    """Verdict -> number of clauses."""
    clauses: tuple[ClauseResult, ...]
    contract_problems: tuple[str, ...]
    data: Mapping[str, Any]
    """The JSON report as loaded (every field, e.g. ``date`` and ``command``)."""
    exit_code: int | None = None
    """pytest's exit status (0: every test passed), when the report comes from :func:`run_conformance`."""
    json_path: Path | None = None
    markdown_path: Path | None = None

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        *,
        exit_code: int | None = None,
        json_path: Path | None = None,
        markdown_path: Path | None = None,
    ) -> ConformanceReport:
        """The report from the JSON report's content."""
        if not isinstance(data, Mapping):
            raise ValueError(f"data: expected a mapping (the JSON report), got {type(data).__name__}")
        try:
            implementation = data["implementation"]
            return cls(
                impl=str(implementation["impl"]),
                name=str(implementation["name"]),
                version=str(implementation["version"]),
                passed=bool(data["passed"]),
                spec_version=str(data["spec_version"]),
                ppo_ref_version=str(data["ppo_ref_version"]),
                summary={str(k): int(v) for k, v in data["summary"].items()},
                clauses=tuple(ClauseResult.from_dict(entry) for entry in data["clauses"]),
                contract_problems=tuple(str(p) for p in implementation["contract_problems"]),
                data=data,
                exit_code=exit_code,
                json_path=json_path,
                markdown_path=markdown_path,
            )
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"data: not a conformance report ({error!r})") from error

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> ConformanceReport:
        """The report from a JSON file written by ``--conformance-report``."""
        if not isinstance(path, (str, os.PathLike)):
            raise ValueError(f"path: expected a path, got {type(path).__name__}")
        json_path = Path(path)
        if not json_path.is_file():
            raise ValueError(f"path: {json_path} is not a file")
        try:
            data = json.loads(json_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"path: {json_path} is not JSON ({error})") from error
        markdown: Path | None = json_path.with_suffix(".md")
        if markdown is not None and not markdown.is_file():
            markdown = None
        return cls.from_dict(data, json_path=json_path, markdown_path=markdown)

    def clause(self, clause_id: str) -> ClauseResult:
        """The row of ``clause_id`` (e.g. ``"GAE-2"``, or ``"CONTRACT"``)."""
        for entry in self.clauses:
            if entry.id == clause_id:
                return entry
        raise ValueError(f"clause_id: no clause {clause_id!r} in the report")

    def verdicts(self) -> dict[str, str]:
        """Clause id -> verdict, in the spec's order."""
        return {entry.id: entry.verdict for entry in self.clauses}

    def failures(self) -> tuple[ClauseResult, ...]:
        """The failing clauses."""
        return tuple(entry for entry in self.clauses if entry.verdict == "fail")

    def to_markdown(self) -> str:
        """The Markdown report (what ``--conformance-report`` writes to ``PATH.md``)."""
        from .report import render_markdown

        return render_markdown(dict(self.data))


def _entry_point_installed() -> bool:
    """Whether pytest will load the suite's plugin itself (ppo-ref installed with its entry point)."""
    return any(ep.name == plugin.ENTRY_POINT for ep in metadata.entry_points(group="pytest11"))


def run_conformance(
    impl: str,
    *,
    report: str | os.PathLike[str] | None = None,
    examples: int | None = None,
    output: str = "compact",
    pytest_args: Sequence[str] = (),
) -> ConformanceReport:
    """Run the whole conformance suite against ``impl`` and return its report.

    ``impl``: what ``--impl`` takes: ``mine``, a built-in third-party name, an entry point of group
    ``ppo_ref.adapters``, or ``module:attribute`` importable from ``sys.path``. ``report``: the stem
    of the report files (``report.json``, ``report.md``; default: a temporary directory, deleted
    after the report is loaded, and the returned paths are None). ``examples``: Hypothesis examples
    per property (default: the suite's, 20). ``output``: ``compact`` (default) or ``full``, as
    ``--conformance-output``. ``pytest_args``: more pytest arguments (``["-q"]``, ``["-x"]``,
    ``["-k", "gae"]``).

    The session is ``pytest SUITE_DIR --impl=... --conformance-report=...`` with ``-p
    no:cacheprovider``, under pytest's own configuration lookup from the current directory. A
    failing clause does not raise: it is a ``fail`` row (and ``exit_code`` 1). Raises ``ValueError``
    for a bad argument or an adapter that does not load, and ``RuntimeError`` when pytest ends
    without writing the report (an internal or usage error; pytest printed why).
    """
    if not isinstance(impl, str) or not impl.strip():
        raise ValueError(f"impl: expected a non-empty adapter name or module:attribute, got {impl!r}")
    if report is not None and not isinstance(report, (str, os.PathLike)):
        raise ValueError(f"report: expected a path stem or None, got {type(report).__name__}")
    if examples is not None and (isinstance(examples, bool) or not isinstance(examples, int) or examples < 1):
        raise ValueError(f"examples: expected a positive integer or None, got {examples!r}")
    if output not in ("compact", "full"):
        raise ValueError(f"output: expected 'compact' or 'full', got {output!r}")
    if isinstance(pytest_args, str) or not all(isinstance(a, str) for a in pytest_args):
        raise ValueError(f"pytest_args: expected a sequence of strings, got {pytest_args!r}")
    try:
        get_adapter(impl)
    except (UnknownAdapterError, AdapterLoadError) as error:
        raise ValueError(f"impl: {error}") from error

    with tempfile.TemporaryDirectory(prefix="ppo-ref-conformance-") as scratch:
        stem = Path(scratch, "report") if report is None else Path(report)
        args = [str(plugin.SUITE_DIR), f"--impl={impl}", f"--conformance-report={stem}"]
        args += [f"--conformance-output={output}", "-p", "no:cacheprovider"]
        if examples is not None:
            args.append(f"--conformance-examples={examples}")
        args += list(pytest_args)
        # With ppo-ref installed, pytest loads the plugin through its entry point; otherwise (a
        # checkout used without installing) it is passed here, never both.
        plugins: list[object] = [] if _entry_point_installed() else [plugin]
        exit_code = int(pytest.main(args, plugins=plugins))
        from .report import report_paths

        json_path, markdown_path = report_paths(str(stem))
        if not json_path.is_file():
            raise RuntimeError(f"the conformance suite wrote no report (pytest exit status {exit_code})")
        data = json.loads(json_path.read_text(encoding="utf-8"))
        if report is None:
            return ConformanceReport.from_dict(data, exit_code=exit_code)
        return ConformanceReport.from_dict(
            data, exit_code=exit_code, json_path=json_path, markdown_path=markdown_path
        )
