"""The conformance matrix as data: run reports and findings into ``docs/conformance-matrix.json``.

Clauses are rows, implementations columns; every FAIL cell carries the findings that explain its
failing tests, their reaches, the tests none explains and its reach (:mod:`.findings`), and each
implementation gets a count of its FAIL cells by reach per kind of clause. :func:`check_differences`
is ``--check``: each cell's verdict, reach, linked findings and unexplained tests against the
committed matrix. A row's kind is the suite's own (``conformance.support.clause_kind``).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

from conformance.support import clause_kind
from tools.matrix.findings import SEVERITY, Finding, cell_reach, link_failures
from tools.matrix.run import ALL_NAMES, REPO

MATCH = "matches undeclared convention"
"""The verdict of a clause whose failures a convention the adapter does not declare explains
(``conformance/inference.py``)."""

_SITE_PACKAGES = re.compile(r"(?<![\w.])(?:[A-Za-z]:)?/(?:[^\s/'\"()\[\]]+/)*?site-packages/")
_ABSOLUTE = re.compile(r"(?<![\w.:/])/(?:work|home|tmp|root|usr|opt|var|Users|private)/[^\s'\"()\]]*")


def scrub(value: Any) -> Any:
    """``value`` (JSON data) with machine paths taken out: the checkout becomes relative, a
    site-packages prefix becomes ``site-packages/``, any other absolute path ``<path>``."""
    if isinstance(value, str):
        text = value.replace(str(REPO) + "/", "").replace(str(REPO), ".")
        text = _SITE_PACKAGES.sub("site-packages/", text)
        return _ABSOLUTE.sub("<path>", text)
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items()}
    return value


def _column(report: Mapping[str, Any]) -> dict[str, Any]:
    impl = report["implementation"]
    metadata = report.get("metadata", {})
    return {
        "name": impl["name"],
        "version": impl["version"],
        "versions": metadata.get("versions", {}),
        "test_versions": metadata.get("test_versions", {}),
        "report_date": report["date"],
        "python": report["python"],
        "wall_seconds": report.get("wall_seconds"),
        "env_build_seconds": report.get("env_build_seconds"),
        "exit_code": report.get("exit_code"),
        "inference": report.get("inference", {}),
        "summary": report["summary"],
        "provenance": impl["provenance"],
        "ops": impl["ops"],
        # the op conventions the adapter declares, then those its step runner declares (issue 22)
        "declared_conventions": {
            **impl["declared_conventions"],
            **{k: d["value"] for k, d in impl.get("step_conventions", {}).items()},
        },
        "convention_sources": {
            **metadata.get("convention_sources", {}),
            **{k: d["source"] for k, d in impl.get("step_conventions", {}).items()},
        },
        "not_provided": metadata.get("not_provided", {}),
        "contract_problems": impl["contract_problems"],
        "command": report["command"],
    }


def _link(cell: dict[str, Any], impl: str, clause: str, findings: Mapping[str, Finding]) -> None:
    """Fill a FAIL cell's findings, their reaches, its unexplained tests and its reach, in place."""
    ids, unexplained = link_failures(impl, clause, cell.get("failing_tests", []), findings)
    cell["findings"] = ids
    cell["finding_reach"] = {i: findings[i].reach for i in ids}
    cell["unexplained"] = unexplained
    cell["reach"] = cell_reach(ids, unexplained, findings)


def _cell(entry: Mapping[str, Any], impl: str, findings: Mapping[str, Finding]) -> dict[str, Any]:
    verdict = entry["verdict"]
    cell: dict[str, Any] = {"verdict": verdict, "kind": entry.get("kind") or clause_kind(entry["id"])}
    if verdict == "fail":
        cell["failing_tests"] = list(entry.get("failing_tests", []))
        _link(cell, impl, entry["id"], findings)
        cell["detail"] = entry.get("first_failure", "")
    elif verdict == "declared convention":
        cell["conventions"] = [d.split("=", 1)[0] for d in entry.get("declared_conventions", [])]
    elif verdict == MATCH:  # issue 20: the suite inferred a convention the adapter does not declare
        cell["declarations"] = list(entry.get("undeclared_conventions", []))
    elif verdict in ("not provided", "not applicable", "not run"):
        cell["detail"] = "; ".join(entry.get("skip_reasons", []))
    return cell


def reach_counts(matrix: Mapping[str, Any], impl: str, kind: str = "value") -> dict[str, int]:
    """FAIL cells of ``impl`` of ``kind`` (the cell's: ``value`` takes the contract row too), by
    reach, in SEVERITY order (only the reaches that occur)."""
    counts = {reach: 0 for reach in SEVERITY}
    for row in matrix["clauses"]:
        cell = row["verdicts"].get(impl)
        cell_kind = (cell or {}).get("kind") or row.get("kind") or "value"
        if (cell_kind if cell_kind in ("edge", "robustness") else "value") != kind:
            continue
        if cell and cell["verdict"] == "fail":
            reach = cell.get("reach", "unknown")
            counts[reach if reach in counts else "unknown"] += 1
    return {reach: n for reach, n in counts.items() if n}


def build_matrix(
    reports: Mapping[str, Mapping[str, Any]],
    findings: Mapping[str, Finding],
    previous: Mapping[str, Any] | None = None,
    command: str = "python tools/conformance_matrix.py",
    examples: int | None = None,
) -> dict[str, Any]:
    """The matrix as a JSON-ready dict; columns not in ``reports`` are kept from ``previous`` and
    re-linked to the current findings (by the failing tests they stored)."""
    columns: dict[str, Any] = dict((previous or {}).get("columns", {}))
    rows: dict[str, dict[str, Any]] = {}
    for row in (previous or {}).get("clauses", []):
        rows[row["id"]] = {k: v for k, v in row.items() if k != "verdicts"}
        rows[row["id"]]["verdicts"] = {impl: dict(cell) for impl, cell in row["verdicts"].items()}
    for impl, report in reports.items():
        columns[impl] = _column(report)
        for row in rows.values():  # a clause the new run no longer has leaves this column
            row["verdicts"].pop(impl, None)
        for entry in report["clauses"]:
            row = rows.setdefault(entry["id"], {"id": entry["id"], "title": entry["title"], "verdicts": {}})
            row["title"] = entry["title"]
            row["kind"] = clause_kind(entry["id"])
            row["verdicts"][impl] = _cell(entry, impl, findings)
    for row in rows.values():  # re-link kept columns to the current findings
        for impl, cell in row["verdicts"].items():
            if cell["verdict"] == "fail" and impl not in reports:
                _link(cell, impl, row["id"], findings)
    rows = {k: v for k, v in rows.items() if v["verdicts"]}
    order = [n for n in ALL_NAMES if n in columns] + sorted(set(columns) - set(ALL_NAMES))
    first = next(iter(reports.values()), None)
    clause_order = [e["id"] for e in first["clauses"]] if first else list(rows)
    clause_order += [c for c in rows if c not in clause_order]
    unexplained = [
        f"{impl} {row['id']}: {test}"
        for row in (rows[c] for c in clause_order)
        for impl, cell in row["verdicts"].items()
        if cell["verdict"] == "fail"
        for test in cell.get("unexplained", [])
    ]
    linked = {
        i for row in rows.values() for cell in row["verdicts"].values() for i in cell.get("findings", [])
    }
    matrix = {
        "generated": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "examples": examples,
        "implementations": order,
        "columns": {name: columns[name] for name in order},
        "clauses": [rows[c] for c in clause_order],
        "reach_counts": {},
        "edge_reach_counts": {},
        "robustness_reach_counts": {},
        "unexplained_failures": unexplained,
        "findings": {
            f.id: {
                "implementations": list(f.implementations),
                "reach": f.reach,
                "source": f.source,
                "version": f.version,
                "reproduction": f.reproduction,
                "explains": list(f.explains),
                "linked": f.id in linked,
            }
            for f in findings.values()
        },
    }
    matrix["reach_counts"] = {name: reach_counts(matrix, name) for name in order}
    matrix["edge_reach_counts"] = {name: reach_counts(matrix, name, "edge") for name in order}
    matrix["robustness_reach_counts"] = {name: reach_counts(matrix, name, "robustness") for name in order}
    return dict(scrub(matrix))


CHECKED = ("verdict", "kind", "reach", "findings", "unexplained")
"""What --check compares in every cell of the implementations it runs."""


def check_differences(
    committed: Mapping[str, Any],
    reports: Mapping[str, Mapping[str, Any]],
    findings: Mapping[str, Finding] | None = None,
) -> list[str]:
    """Cells of ``reports`` whose verdict, reach, linked findings or unexplained tests differ from the
    ``committed`` matrix (empty: none). Without ``findings`` only verdicts are compared."""
    rows = {row["id"]: row["verdicts"] for row in committed.get("clauses", [])}
    fresh = build_matrix(reports, findings or {}) if findings is not None else None
    fresh_rows = {row["id"]: row["verdicts"] for row in (fresh or {}).get("clauses", [])}
    keys = CHECKED if findings is not None else ("verdict",)
    differences = []
    for impl, report in reports.items():
        if impl not in committed.get("columns", {}):
            differences.append(f"{impl}: not in the committed matrix")
            continue
        seen = set()
        for entry in report["clauses"]:
            seen.add(entry["id"])
            before = rows.get(entry["id"], {}).get(impl, {})
            after = fresh_rows[entry["id"]][impl] if fresh is not None else {"verdict": entry["verdict"]}
            for key in keys:
                if key != "verdict" and (before.get("verdict") != "fail" or after.get("verdict") != "fail"):
                    continue
                if before.get(key) != after.get(key):
                    detail = ""
                    if key == "verdict" and entry["verdict"] == "fail":
                        detail = f" ({entry.get('first_failure', '')[:200]})"
                    was, now = before.get(key), after.get(key)
                    differences.append(f"{impl} {entry['id']}: {key} committed {was!r}, now {now!r}{detail}")
        for clause, verdicts in rows.items():
            if impl in verdicts and clause not in seen:
                differences.append(f"{impl} {clause}: in the committed matrix, not in this run")
    return differences


def verdict_differences(matrix: Mapping[str, Any], reports: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Per-clause verdicts of ``reports`` that differ from the committed ``matrix`` (empty: none)."""
    return check_differences(matrix, reports)
