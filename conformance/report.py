"""The clause-by-clause conformance report (``--conformance-report PATH`` -> PATH.json, PATH.md).

Verdicts, per clause of ``spec/SPEC.md`` (headings ``### CLAUSE-ID: Title``):

- ``fail``: at least one test of the clause failed;
- ``declared convention``: its tests passed against the reference variant of a convention the
  adapter declares (listed in the row);
- ``matches undeclared convention``: tests of the clause failed, and every one of them passes (with
  every other test of the clause that calls the same ops) against the reference variant of a
  convention the adapter does not declare: the row gives the declaration to paste into the adapter
  and the reason the convention is legitimate (:mod:`.inference`; ``--conformance-inference=off``
  turns the search off);
- ``pass``: its tests passed against the plain reference;
- ``not provided``: every test of the clause was skipped because the adapter does not provide the
  op or capability (the reason is given);
- ``not applicable``: no op of the adapter contract computes the clause (e.g. the KL controllers,
  or IN-2, which holds for ppo-ref's own functions and is tested in ``tests/``);
- ``not run``: no test of the clause ran (deselected, not collected, or skipped for another reason).

The pseudo-clause ``CONTRACT`` is the adapter's own attributes and declared conventions.

The report also records what the implementation was checked against: ``spec_version`` (the
``Spec version:`` line of ``spec/SPEC.md``, :data:`~.cases.SPEC_VERSION`) and ``ppo_ref_version``.
Test ids are the suite's own (``conformance/test_gae.py::...``, :func:`suite_test_id`), so a run of
the installed suite and a run from a checkout write the same report.
"""

from __future__ import annotations

import ast
import datetime as _dt
import json
import re
import sys
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import ppo_ref
from ppo_ref.adapters import contract_problems, convention_problems
from ppo_ref.adapters.conventions import describe

from .cases import SPEC_VERSION, spec_clauses
from .inference import MATCH, Inference
from .support import CONTRACT, KINDS, Context, clause_kind

__all__ = [
    "CONTRACT",
    "KINDS",
    "SUITE_DIR",
    "ConformanceRecorder",
    "ParsedFailure",
    "TestRecord",
    "build_report",
    "clause_kind",
    "compact_summary",
    "failure_lines",
    "parse_failure",
    "render_markdown",
    "report_paths",
    "suite_test_id",
]

VERDICTS = ("pass", "declared convention", MATCH, "fail", "not provided", "not applicable", "not run")


@dataclass
class TestRecord:
    """The outcome of one test item (all phases folded): passed, failed or skipped, and why.

    A failure keeps its message (expected against got), the input it failed on and the whole
    reproduction (Python code), parsed from the failure's text by :func:`parse_failure`.
    """

    nodeid: str
    clauses: tuple[str, ...]
    outcome: str = "not run"
    message: str = ""
    ops: tuple[str, ...] = ()
    inputs: str = ""
    reproduction: str = ""
    declarations: tuple[str, ...] = ()
    """For a test a convention explains (outcome ``matched``): the lines to paste."""
    reasons: tuple[str, ...] = ()
    """Why each of those conventions is legitimate (its meaning and where it is seen)."""
    suggestions: tuple[str, ...] = ()
    """For a failing test: declarations that widen a tolerance or change the inputs, under which it
    passes (``declaration  # why``)."""


_MESSAGE_ENDS = (
    "assert ",
    "+  where",
    "Failing test case",
    "Falsifying example",
    "# The test",
    "where ",
    "reproduce:",
    "# --- reproduction",
    "Explanation:",
    "You can reproduce",
    "import torch",
)
_EXCEPTION_PREFIXES = ("AssertionError: ", "Failed: ")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][\w\[\], ]* = ")


@dataclass(frozen=True)
class ParsedFailure:
    """A failure's text split into what a reader needs: the message (expected against got), the
    input it failed on, and one whole reproduction (the last one noted: the failing call)."""

    message: str
    inputs: str
    reproduction: str


def _error_lines(text: str) -> list[str]:
    """The ``E`` lines of a pytest failure, stripped (the reproductions' code is flat)."""
    return [line[1:].strip() for line in text.splitlines() if line == "E" or line.startswith("E ")]


def _reproductions(lines: list[str]) -> list[list[str]]:
    """Every reproduction in the lines: Hypothesis notes (``# --- reproduction``) and hand cases
    (the code after ``reproduce:``, or a block that starts with ``import torch``)."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in lines:
        starts = line.startswith("# --- reproduction") or (line == "import torch" and current is None)
        if line == "reproduce:" or starts:
            current = [] if line == "reproduce:" else [line]
            blocks.append(current)
            continue
        if current is None:
            continue
        if not line or line.startswith(("assert ", "Explanation:", "You can reproduce", "Failing test case")):
            current = None
            continue
        if _looks_like_code(line):
            current.append(line)
        else:  # the next problem's message of a hand case: the block has ended
            current = None
    return [block for block in blocks if block]


def _looks_like_code(line: str) -> bool:
    return line.startswith(("import ", "from ", "print(", "#", "nan, inf")) or bool(_ASSIGNMENT.match(line))


def _input_lines(reproduction: list[str]) -> list[str]:
    """The lines of a reproduction that define the inputs and make the call."""
    keep = []
    for line in reproduction:
        if line.startswith(("args = ", "kwargs = ", "result = impl.")):
            keep.append(line)
        elif " = torch.tensor(" in line.split("#")[0] and not line.startswith(("impl", "reference")):
            keep.append(line)
    return keep


def parse_failure(text: str) -> ParsedFailure:
    """Split a failed conformance test's text (pytest's long representation) into message, input
    and reproduction. Nothing is cut: the message keeps every problem line, the reproduction all of
    its code."""
    lines = _error_lines(text)
    message: list[str] = []
    for line in lines:
        if line.startswith(_MESSAGE_ENDS):
            if message:
                break
            continue
        if line:
            message.append(line)
    if not message:
        message = lines[:1] or [line.strip() for line in text.splitlines() if line.strip()][-1:]
    if message:
        for prefix in _EXCEPTION_PREFIXES:
            message[0] = message[0].removeprefix(prefix)
    blocks = _reproductions(lines)
    reproduction = blocks[-1] if blocks else []
    inputs = _input_lines(reproduction)
    if not inputs:  # no reproduction: the example Hypothesis reports
        start = next((i for i, line in enumerate(lines) if line.startswith("Failing test case")), None)
        if start is not None:
            block = []
            for line in lines[start + 1 :]:
                if line == ")":
                    break
                block.append(line)
            inputs = block
    return ParsedFailure("\n".join(message), "\n".join(inputs), "\n".join(reproduction))


def failure_lines(error: BaseException) -> list[str]:
    """The text of a failure: ``Type: message`` and the exception's notes (Hypothesis' example, the
    reproductions). An exception group (several failing examples, a flaky failure) is replaced by
    its first leaf exception, with the group's notes after the leaf's: the report shows one whole
    failure, never only the group's border line ("Hypothesis found 2 distinct failures")."""
    if not isinstance(error, BaseException):
        raise ValueError(f"error: expected an exception, got {type(error).__name__}")
    notes = [str(note) for note in getattr(error, "__notes__", [])]
    inner = getattr(error, "exceptions", None)  # an ExceptionGroup (the backport's on Python 3.10)
    while isinstance(inner, tuple) and inner and isinstance(inner[0], BaseException):
        error = inner[0]
        notes = [str(note) for note in getattr(error, "__notes__", [])] + notes
        inner = getattr(error, "exceptions", None)
    return [f"{type(error).__name__}: {error}", *notes]


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
        return reason.removeprefix("Skipped: ")
    return str(longrepr)


SUITE_DIR = Path(__file__).resolve().parent
"""The suite's directory (``conformance/`` in a checkout, ``ppo_ref_conformance/`` installed)."""


def suite_test_id(path: Path, nodeid: str) -> str | None:
    """A suite test's id in the report: ``conformance/FILE::NAME``, the same whether the suite ran
    from a checkout (where it is pytest's node id) or installed (where pytest's node id depends on
    the directory pytest ran in); None for a test outside the suite."""
    if not isinstance(path, Path):
        raise ValueError(f"path: expected a pathlib.Path, got {type(path).__name__}")
    if not isinstance(nodeid, str) or not nodeid:
        raise ValueError(f"nodeid: expected a non-empty string, got {nodeid!r}")
    try:
        relative = path.resolve().relative_to(SUITE_DIR)
    except ValueError:
        return None
    name = nodeid.split("::", 1)[1] if "::" in nodeid else nodeid
    return f"conformance/{relative.as_posix()}::{name}"


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

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.inference is not None and self.inference.reruns:
            terminalreporter.write_line(
                f"ppo-ref conformance inference: {_count(self.inference.reruns, 're-run')} of failing value "
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


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _indent(text: str, prefix: str = "    ") -> list[str]:
    return [prefix + line for line in text.splitlines()]


def undeclared_conventions(records: Sequence[TestRecord]) -> list[str]:
    """What the terminal prints for the tests a convention explains: per declaration, the clauses
    it explains, the lines to paste into the adapter's ``conventions`` and the reasons."""
    by_declaration: dict[tuple[str, ...], tuple[list[str], tuple[str, ...]]] = {}
    for record in records:
        if record.outcome == "matched":
            clauses, _ = by_declaration.setdefault(record.declarations, ([], record.reasons))
            clauses += [c for c in record.clauses if c not in clauses]
    lines: list[str] = []
    for declarations, (clauses, reasons) in by_declaration.items():
        lines.append(f"{MATCH.upper()} in {', '.join(clauses)}: declare in the adapter's conventions")
        lines += ["    " + line for line in declarations]
        lines += ["  legitimate because " + reason for reason in reasons]
    return lines


KIND_SEVERITY = ("value", "edge", "robustness", "contract")
"""Kinds of clause, the most severe first: the order of the compact blocks (issue 20). A value FAIL
is a wrong number on inputs as declared, an edge FAIL a wrong number on an edge input the adapter
does not declare its pipeline produces (holes, rows without action tokens, ``-inf`` logits), a
robustness FAIL garbage in masked-out slots reaching a result; a contract FAIL (the adapter's own
attributes) comes last, under the numbers."""

_NUMBER = re.compile(r"nan|inf|-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_MASK = re.compile(r"mask = torch\.tensor\((\[.*?\]\])")


def _has_holes(inputs: str) -> bool:
    """Whether a hand case's input (its code) has a mask with a hole: a 0 before a row's last 1."""
    for match in _MASK.finditer(inputs):
        try:
            rows = ast.literal_eval(match.group(1).replace("True", "1").replace("False", "0"))
        except (ValueError, SyntaxError):
            continue
        for row in rows if isinstance(rows, list) else []:
            flags = [bool(v) for v in row] if isinstance(row, list) else []
            if True in flags and not all(flags[: len(flags) - flags[::-1].index(True)]):
                return True
    return False


def isolation(record: TestRecord) -> tuple[int, int, int, int]:
    """How well a failing test isolates its cause, smaller first: a hand case before a property,
    then a case without NaN or inf in its input, then one without holes in its mask, then the
    fewest numbers (GAE-3's plain padded case before GAE-2's holes, for a GAE that bootstraps
    through padding)."""
    hand = "test_hand_case[" in record.nodeid
    text = record.inputs
    junk = "nan" in text or "inf" in text
    return (0 if hand else 1, int(junk), int(_has_holes(text)), len(_NUMBER.findall(text)))


@dataclass
class _Block:
    head: str
    kind: str
    ops: set[str]
    shown: TestRecord
    related: list[str] = field(default_factory=list)


_QUOTED = re.compile(r"(?<![A-Za-z])'[^']*'(?![A-Za-z])")
"""A quoted name (``'entropy'``), not an apostrophe (``adapter's``)."""


def _skip_lines(records: Sequence[TestRecord], skipped: Mapping[str, int] | None) -> list[str]:
    """The skipped tests, one line per reason (pytest prints one per reason and source line); reasons
    that differ only in a quoted name (``op 'entropy' is not in the adapter's ops``) share a line
    that lists the names."""
    counts = dict(skipped) if skipped is not None else {}
    if skipped is None:
        for record in records:
            if record.outcome == "skipped":
                counts[record.message] = counts.get(record.message, 0) + 1
    if not counts:
        return []
    merged: dict[str, tuple[int, list[str], list[str]]] = {}  # template -> (count, reasons, names)
    for reason, n in counts.items():
        # only a reason with one quoted name is merged with others (several: kept as it is)
        template = _QUOTED.sub("'...'", reason) if len(_QUOTED.findall(reason)) == 1 else reason
        total, reasons, names = merged.get(template, (0, [], []))
        names += [name for name in _QUOTED.findall(reason) if name not in names]
        merged[template] = (total + n, [*reasons, reason], names)
    lines = [f"skipped: {_count(sum(counts.values()), 'test')}, by reason"]
    for template, (n, reasons, names) in sorted(merged.items(), key=lambda item: (-item[1][0], item[0])):
        shown = reasons[0] if len(reasons) == 1 else f"{template} ({', '.join(names)})"
        lines.append(f"  {n:4d}  {shown}")
    return lines


def compact_summary(
    records: Sequence[TestRecord],
    titles: dict[str, str],
    skipped: Mapping[str, int] | None = None,
    edge_inputs: Iterable[str] = (),
) -> list[str]:
    """The compact failure output (issue 20): one block per failing clause, the most severe kind
    first (:data:`KIND_SEVERITY`: value, edge, robustness, contract; ``edge_inputs``: those the
    adapter declares, whose clauses are value clauses), so the block that shows a wrong number on the
    library's own inputs leads.

    Within a kind, the failing clauses of one op are ordered by how well their failing test isolates
    the cause (:func:`isolation`): the first is the op's headline block (the case, its input,
    expected against got, the reproduction), the others short blocks (the case and its first
    line). Two clauses of one kind share a block only when their first failing input is the same.
    Then the undeclared conventions the inference matched, and the skipped tests, one line per
    reason (``skipped``: reason -> count; default: the records' skips).
    """
    failing: dict[str, list[TestRecord]] = {}
    for record in records:
        if record.outcome == "failed":
            for clause in record.clauses:
                failing.setdefault(clause, []).append(record)
    order = {clause: index for index, clause in enumerate(titles)}
    clauses = sorted(failing, key=lambda c: (order.get(c, len(order)), c))
    edge_inputs = frozenset(edge_inputs)
    blocks: list[_Block] = []
    for clause in clauses:
        tests = failing[clause]
        shown = min(tests, key=isolation)
        kind, ops = clause_kind(clause, edge_inputs), {op for record in tests for op in record.ops}
        home = next(
            (
                b
                for b in blocks
                if b.kind == kind and b.ops & ops and shown.inputs and b.shown.inputs == shown.inputs
            ),
            None,
        )
        if home is None:
            blocks.append(_Block(clause, kind, set(ops), shown))
        else:
            home.ops.update(ops)
            home.related.append(clause)
    # per kind, per op group (the spec order of its first clause), the best isolating block first
    groups: list[list[_Block]] = []
    for block in blocks:
        group = next((g for g in groups if g[0].kind == block.kind and g[0].ops & block.ops), None)
        if group is None:
            groups.append([block])
        else:
            group.append(block)
    groups.sort(
        key=lambda g: KIND_SEVERITY.index(g[0].kind) if g[0].kind in KIND_SEVERITY else len(KIND_SEVERITY)
    )
    lines: list[str] = []
    total = len({r.nodeid for r in records if r.outcome == "failed"})
    for group in groups:
        group.sort(key=lambda b: (isolation(b.shown), order.get(b.head, len(order))))
        for index, block in enumerate(group):
            lines += _block_lines(block, failing, titles, headline=index == 0)
    matched = undeclared_conventions(records)
    if matched:
        lines += [*matched, ""]
    if lines:
        kinds = [clause_kind(clause, edge_inputs) for clause in clauses]
        by_kind = ", ".join(f"{kind} {kinds.count(kind)}" for kind in KIND_SEVERITY if kind in kinds)
        lines.append(
            f"{_count(total, 'failing test')} in {_count(len(clauses), 'clause')}"
            + (f" ({by_kind})" if by_kind else "")
            + ", "
            f"{_count(len(blocks), 'block')} above; --conformance-output=full shows every traceback, "
            "--conformance-report=PATH writes them all"
        )
    skips = _skip_lines(records, skipped)
    return [*lines, *([""] if lines and skips else []), *skips]


def _block_lines(
    block: _Block, failing: Mapping[str, list[TestRecord]], titles: Mapping[str, str], headline: bool
) -> list[str]:
    shown, tests = block.shown, failing[block.head]
    case = "hand case" if "test_hand_case[" in shown.nodeid else "property"
    heads = ", ".join([block.head, *block.related])
    title = titles.get(block.head, "(not in SPEC.md)")
    lines = [
        f"FAIL ({block.kind}) {heads}: {title}"
        + (f"  [op {', '.join(sorted(block.ops))}]" if block.ops else "")
    ]
    lines.append(f"  {case}: {shown.nodeid}")
    message = shown.message or "(no message)"
    if not headline:
        lines.append(f"  expected vs got: {message.splitlines()[0]}")
        suggestions = list(dict.fromkeys(s for r in tests for s in r.suggestions))
        if suggestions:
            lines.append(f"  passes with: {suggestions[0]}")
        if len(tests) > 1:
            lines.append(f"  also failing in {block.head}: {_count(len(tests) - 1, 'more test')}")
        lines.append("")
        return lines
    if shown.inputs:
        lines.append("  input:")
        lines += _indent(shown.inputs)
    lines.append("  expected vs got:")
    lines += _indent(message)
    suggestions = list(dict.fromkeys(s for r in tests for s in r.suggestions))
    if suggestions:
        lines.append("  passes with (a tolerance or the inputs, not a convention match):")
        lines += _indent("\n".join(suggestions))
    if shown.reproduction:
        lines.append("  reproduce (python, in the repository root):")
        lines += _indent(shown.reproduction)
    others = [r.nodeid for r in tests if r is not shown]
    if others:
        more = f" (+{len(others) - 3} more)" if len(others) > 3 else ""
        lines.append(f"  also failing in {block.head}: {', '.join(others[:3])}{more}")
    lines.append("")
    return lines


def _clause_entry(
    clause: str, title: str, records: list[TestRecord], declared: list[str], kind: str
) -> dict[str, Any]:
    counts = {name: sum(r.outcome == name for r in records) for name in ("passed", "failed", "skipped")}
    matched = [r for r in records if r.outcome == "matched"]
    counts["passed"] += len(matched)  # a test a convention explains passes against its variant
    failed = [r for r in records if r.outcome == "failed"]
    skip_reasons = list(dict.fromkeys(r.message for r in records if r.outcome == "skipped"))
    not_provided = [reason for reason in skip_reasons if reason.startswith("not provided")]
    if failed:
        verdict = "fail"
    elif matched:
        verdict = MATCH
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
        "kind": kind,
        "verdict": verdict,
        "tests": counts,
        "declared_conventions": declared,
        "failing_tests": [r.nodeid for r in failed],
        "first_failure": failed[0].message if failed else "",
        "first_failure_test": failed[0].nodeid if failed else "",
        "first_failure_reproduction": failed[0].reproduction if failed else "",
        "skip_reasons": skip_reasons,
        "undeclared_conventions": list(dict.fromkeys(d for r in matched for d in r.declarations)),
        "convention_reasons": list(dict.fromkeys(d for r in matched for d in r.reasons)),
        "matched_tests": [r.nodeid for r in matched],
        "failure_under_declared": matched[0].message if matched and not failed else "",
        "suggestions": list(dict.fromkeys(s for r in failed for s in r.suggestions)),
    }


def build_report(
    context: Context, records: list[TestRecord], args: Sequence[str], inference: Inference | None = None
) -> dict[str, Any]:
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
            clause,
            titles.get(clause, "(not in SPEC.md)"),
            by_clause[clause],
            touched.get(clause, []),
            clause_kind(clause, context.conventions.edge_inputs),
        )
        for clause in by_clause
    ]
    problems = contract_problems(adapter) + convention_problems(getattr(adapter, "conventions", None))
    summary = {verdict: sum(c["verdict"] == verdict for c in clauses) for verdict in VERDICTS}
    summary_by_kind = {
        kind: {
            verdict: sum(c["verdict"] == verdict and c["kind"] == kind for c in clauses)
            for verdict in VERDICTS
        }
        for kind in KINDS
    }
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
        "spec_version": SPEC_VERSION,
        "ppo_ref_version": ppo_ref.__version__,
        "python": sys.version.split()[0],
        "command": "pytest " + " ".join(args),
        "summary": summary,
        "summary_by_kind": summary_by_kind,
        "passed": summary["fail"] == 0,
        "inference": {
            "enabled": inference is not None,
            "reruns": inference.reruns if inference is not None else 0,
            "seconds": round(inference.seconds, 1) if inference is not None else 0.0,
        },
        "clauses": clauses,
    }


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _notes(entry: dict[str, Any]) -> str:
    if entry["verdict"] == "fail":  # the first line whole (the whole message is under Failures)
        first_line = entry["first_failure"].splitlines()[0] if entry["first_failure"] else ""
        return f"{len(entry['failing_tests'])} failing; first: {first_line}"
    if entry["verdict"] == MATCH:
        return "declare " + " ".join(f"`{d}`" for d in entry.get("undeclared_conventions", []))
    if entry["declared_conventions"]:
        return "checked against the variant for " + ", ".join(f"`{d}`" for d in entry["declared_conventions"])
    if entry["verdict"] in ("not provided", "not applicable", "not run"):
        return "; ".join(entry["skip_reasons"])[:240]
    partial = [r for r in entry["skip_reasons"] if r.startswith("not provided")]
    text = "partly not provided: " + "; ".join(r.removeprefix("not provided: ") for r in partial)
    return text[:240] if partial else ""


def _kind_lines(report: dict[str, Any]) -> list[str]:
    """One line per kind of clause: value clauses (the numbers on the declared inputs) apart from
    edge ones (edge inputs the adapter does not declare) and robustness ones (garbage in masked-out
    slots)."""
    by_kind = report.get("summary_by_kind") or {}
    lines = []
    for kind in ("value", "edge", "robustness"):
        counts = by_kind.get(kind, {})
        text = ", ".join(f"{n} {verdict}" for verdict, n in counts.items() if n)
        if text:
            lines.append(f"- {kind} clauses: {text}")
    return [*lines, ""] if lines else []


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
        *_kind_lines(report),
        "| | |",
        "|---|---|",
        f"| Implementation | `{impl['name']}` {impl['version']} (`--impl={impl['impl']}`) |",
        f"| Provenance | {_cell(impl['provenance'])} |",
        f"| Ops provided | {', '.join(f'`{op}`' for op in impl['ops']) or 'none'} |",
        f"| Declared conventions | {_cell(declared)} |",
        f"| Date | {report['date']} |",
        f"| Spec | {report['spec_version']} (`spec/SPEC.md`; changes in `spec/CHANGELOG.md`) |",
        f"| ppo-ref | {report['ppo_ref_version']} (Python {report['python']}) |",
        f"| Command | `{_cell(report['command'])}` |",
        "",
        "| Clause | Kind | Title | Verdict | Tests (pass/fail/skip) | Notes |",
        "|---|---|---|---|---|---|",
    ]
    for entry in report["clauses"]:
        verdict = "**FAIL**" if entry["verdict"] == "fail" else entry["verdict"]
        tests = entry["tests"]
        lines.append(
            f"| {entry['id']} | {entry.get('kind', '')} | {_cell(entry['title'])} | {verdict} | "
            f"{tests['passed']}/{tests['failed']}/{tests['skipped']} | {_cell(_notes(entry))} |"
        )
    matched = [entry for entry in report["clauses"] if entry["verdict"] == MATCH]
    if matched:
        lines += ["", "## Undeclared conventions", ""]
        lines.append(
            "These clauses failed against the reference and pass against the variant of a convention the "
            "adapter does not declare; paste the declaration into the adapter's `conventions` if the library "
            "means it:"
        )
        lines.append("")
        for entry in matched:
            lines.append(f"### {entry['id']}: {entry['title']}")
            lines += ["", "```python", *entry.get("undeclared_conventions", []), "```", ""]
            lines += [f"- {_cell(reason)}" for reason in entry.get("convention_reasons", [])]
            if entry.get("failure_under_declared"):
                first = entry["failure_under_declared"].splitlines()[0]
                lines.append(f"- failure without it: {_cell(first)}")
            lines.append("")
    failures = [entry for entry in report["clauses"] if entry["verdict"] == "fail"]
    if impl["contract_problems"] or failures:
        lines += ["", "## Failures", ""]
    if impl["contract_problems"]:
        lines += ["### Adapter contract problems", ""]
        lines += [f"- {_cell(problem)}" for problem in impl["contract_problems"]]
        lines.append("")
    for entry in failures:
        lines += [
            f"### {entry['id']} ({entry.get('kind', 'value')}): {entry['title']}",
            "",
            f"First failure (`{entry.get('first_failure_test', '')}`):",
            "",
            "```",
            entry["first_failure"],
            "```",
            "",
        ]
        if entry.get("first_failure_reproduction"):
            lines += ["Reproduction:", "", "```python", entry["first_failure_reproduction"], "```", ""]
        if entry.get("suggestions"):
            lines += [
                "It passes with one of these declarations (not a convention match: a tolerance or "
                "the inputs):",
                "",
                "```python",
                *entry["suggestions"],
                "```",
                "",
            ]
        lines += [f"- `{nodeid}`" for nodeid in entry["failing_tests"]]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
