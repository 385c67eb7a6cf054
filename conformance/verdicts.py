"""The report's verdicts: each clause of ``spec/SPEC.md`` (headings ``### CLAUSE-ID: Title``)
judged from the records of its tests, and the report as a JSON-ready dict (:func:`build_report`).

Verdicts, per clause:

- ``fail``: at least one test of the clause failed;
- ``declared convention``: its tests passed against the reference variant of a convention the
  adapter declares (listed in the row), or, for a trainer-step clause, under a convention its step
  runner declares that the test applied (``micro_batch_local``, ``truncation_convention``, a
  ``"full"`` ``sampling_convention``; the test's ``step_convention`` property);
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
Test ids are the suite's own (``conformance/test_gae.py::...``, :func:`.records.suite_test_id`), so a
run of the installed suite and a run from a checkout write the same report.
"""

from __future__ import annotations

import datetime as _dt
import sys
from collections.abc import Sequence
from typing import Any

import ppo_ref
from ppo_ref.adapters import contract_problems, convention_problems
from ppo_ref.adapters.conventions import describe

from .cases import SPEC_VERSION, spec_clauses
from .inference import MATCH, Inference
from .kinds import CONTRACT, KINDS, clause_kind
from .records import TestRecord
from .support import Context

__all__ = ["VERDICTS", "build_report"]

VERDICTS = ("pass", "declared convention", MATCH, "fail", "not provided", "not applicable", "not run")


def _clause_entry(
    clause: str, title: str, records: list[TestRecord], declared: list[str], kind: str
) -> dict[str, Any]:
    counts = {name: sum(r.outcome == name for r in records) for name in ("passed", "failed", "skipped")}
    applied = [
        f"{key}={value}" for r in records if r.outcome == "passed" for key, value, _ in r.step_conventions
    ]
    declared = list(dict.fromkeys([*declared, *applied]))
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


def _step_conventions(records: list[TestRecord]) -> dict[str, dict[str, str]]:
    """The step runner's conventions the passing step tests applied: key -> value and source."""
    found: dict[str, dict[str, str]] = {}
    for record in records:
        if record.outcome == "passed":
            for key, value, source in record.step_conventions:
                found.setdefault(key, {"value": value, "source": source})
    return found


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
            "step_conventions": _step_conventions(records),
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
