"""tools/conformance_matrix.py: findings parsed into matrix cells, the Markdown it renders, and its
--check mode, on hand-made reports."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location(
        "conformance_matrix", REPO / "tools" / "conformance_matrix.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _clause(clause: str, verdict: str, **extra: Any) -> dict[str, Any]:
    entry = {
        "id": clause,
        "title": f"title of {clause}",
        "verdict": verdict,
        "declared_conventions": [],
        "first_failure": "",
        "skip_reasons": [],
    }
    return {**entry, **extra}


def _report(
    name: str, clauses: list[dict[str, Any]], conventions: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "implementation": {
            "impl": name,
            "name": name,
            "version": "1.0",
            "provenance": f"{name} functions | with a pipe",
            "ops": ["gae"],
            "declared_conventions": conventions or {},
            "contract_problems": [],
        },
        "date": "2026-11-29 12:00 UTC",
        "python": "3.11.7",
        "command": f"pytest conformance/ --impl={name}",
        "summary": {"pass": 1, "fail": 1},
        "clauses": clauses,
        "wall_seconds": 12.3,
        "metadata": {
            "versions": {name: "1.0", "torch": "2.13.0+cpu"},
            "convention_sources": {"approx_kl": "lib/file.py Trainer.train: approxkl = ..."},
            "not_provided": {"entropy": "no such function"},
        },
    }


FINDINGS_TEXT = """# Findings

<a id="lib-gae-padding"></a>
### lib-gae-padding: the recursion reads padded values

Matrix cells: lib GAE-2, lib IN-1,
  lib GAE-4

```python
print("repro")  # lib GAE-1 here is code, not a cell
```

<a id="lib-approxkl"></a>
### lib-approxkl
Matrix cells: lib PG-5
"""

REPORTS = {
    "mine": _report("mine", [_clause("GAE-2", "pass"), _clause("PG-5", "pass"), _clause("ENT-1", "pass")]),
    "lib": _report(
        "lib",
        [
            _clause("GAE-2", "fail", first_failure="advantages differ"),
            _clause("PG-5", "declared convention", declared_conventions=["approx_kl='k2'"]),
            _clause("ENT-1", "not provided", skip_reasons=["not provided: op 'entropy' is not in the ops"]),
        ],
        {"approx_kl": "'k2'"},
    ),
}


def test_findings_map_cells_to_anchors() -> None:
    cells = _tool().parse_findings([FINDINGS_TEXT])
    assert cells == {
        ("lib", "GAE-2"): ["lib-gae-padding"],
        ("lib", "IN-1"): ["lib-gae-padding"],
        ("lib", "GAE-4"): ["lib-gae-padding"],
        ("lib", "PG-5"): ["lib-approxkl"],
    }


def test_matrix_links_failures_and_conventions() -> None:
    tool = _tool()
    matrix = tool.build_matrix(REPORTS, tool.parse_findings([FINDINGS_TEXT]))
    assert matrix["unexplained_failures"] == []
    rows = {row["id"]: row["verdicts"] for row in matrix["clauses"]}
    assert rows["GAE-2"]["lib"] == {
        "verdict": "fail",
        "findings": ["lib-gae-padding"],
        "detail": "advantages differ",
    }
    text = tool.render_markdown(matrix)
    assert (
        "| GAE-2 | title of GAE-2 | pass | **FAIL**: [lib-gae-padding](findings.md#lib-gae-padding) |" in text
    )
    assert "declared convention ([approx_kl](#lib-convention-approx-kl))" in text
    assert "<a id=\"lib-convention-approx-kl\"></a>`approx_kl='k2'`: lib/file.py Trainer.train" in text
    assert "[not provided](#lib-not-provided-ent-1)" in text
    assert "<a id=\"lib-not-provided-ent-1\"></a>ENT-1: not provided: op 'entropy' is not in the ops" in text
    assert "- op `entropy`: no such function" in text
    assert "lib functions \\| with a pipe" in text  # table-safe provenance
    assert "| `lib` | lib 1.0, torch 2.13.0+cpu | 2026-11-29 12:00 UTC | 12 s |" in text


def test_failure_without_a_finding_is_flagged() -> None:
    tool = _tool()
    matrix = tool.build_matrix(REPORTS, {})
    assert matrix["unexplained_failures"] == ["lib GAE-2"]
    assert "**FAIL** (no findings entry)" in tool.render_markdown(matrix)


def test_a_partial_run_keeps_the_other_columns() -> None:
    tool = _tool()
    findings = tool.parse_findings([FINDINGS_TEXT])
    full = json.loads(json.dumps(tool.build_matrix(REPORTS, findings)))
    updated = tool.build_matrix({"mine": REPORTS["mine"]}, findings, full)
    assert updated["implementations"] == ["mine", "lib"]
    assert updated["clauses"] == full["clauses"]


def test_check_mode_reports_changed_verdicts() -> None:
    tool = _tool()
    matrix = json.loads(json.dumps(tool.build_matrix(REPORTS, {})))
    assert tool.verdict_differences(matrix, REPORTS) == []
    changed = json.loads(json.dumps(REPORTS["lib"]))
    changed["clauses"][0] = _clause("GAE-2", "pass")
    assert tool.verdict_differences(matrix, {"lib": changed}) == ["lib GAE-2: committed 'fail', now 'pass'"]
    assert tool.verdict_differences(matrix, {"other": changed}) == ["other: not in the committed matrix"]


def test_check_mode_exit_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--check --render-only: reads saved reports, compares, writes nothing, exits 1 on a difference."""
    tool = _tool()
    reports = tmp_path / "reports"
    reports.mkdir()
    for name, report in REPORTS.items():
        (reports / f"{name}.run.json").write_text(json.dumps(report), encoding="utf-8")
    committed = tmp_path / "matrix.json"
    committed.write_text(json.dumps(tool.build_matrix(REPORTS, {})), encoding="utf-8")
    monkeypatch.setattr(tool, "MATRIX_JSON", committed)
    monkeypatch.setattr(tool, "REPO", tmp_path)
    monkeypatch.setattr(tool, "ALL_NAMES", ("mine", "lib"))
    before = committed.read_text(encoding="utf-8")
    args = ["--check", "--render-only", "--reports", str(reports), "mine", "lib"]
    assert tool.main(args) == 0
    changed = json.loads(json.dumps(REPORTS["lib"]))
    changed["clauses"][2] = _clause("ENT-1", "pass")
    (reports / "lib.run.json").write_text(json.dumps(changed), encoding="utf-8")
    assert tool.main(args) == 1
    assert committed.read_text(encoding="utf-8") == before
