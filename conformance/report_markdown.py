"""The conformance report as Markdown (``PATH.md`` of ``--conformance-report PATH``): the
implementation, a summary, one row per clause, then the undeclared conventions and the failures
(:func:`render_markdown`, from the dict :func:`.verdicts.build_report` returns).
"""

from __future__ import annotations

from typing import Any

from .inference import MATCH

__all__ = ["render_markdown"]


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
