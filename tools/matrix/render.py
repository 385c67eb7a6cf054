"""The conformance matrix as Markdown: ``docs/conformance-matrix.md`` from the matrix's data.

The table (clauses as rows, implementations as columns), the FAIL cells by kind and reach, the
declared conventions with their sources, what each adapter does not provide and each column's
provenance; every FAIL cell links its findings, every declared-convention cell its source.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from conformance.support import EDGE_CLAUSES
from tools.matrix.build import MATCH


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def render_cell(
    impl: str, clause: str, cell: Mapping[str, Any] | None, sources: Mapping[str, str] | None = None
) -> str:
    """One cell of the Markdown table; ``sources`` maps a finding id to the file it is in."""
    if cell is None:
        return "—"
    verdict = cell["verdict"]
    if verdict == "fail":
        ids = cell.get("findings", [])
        reach = cell.get("reach", "unknown")
        reaches = cell.get("finding_reach", {})
        links = [
            f"[{i}]({(sources or {}).get(i, 'findings.md')}#{i})"
            + (f" ({reaches[i]})" if len(set(reaches.values())) > 1 and i in reaches else "")
            for i in ids
        ]
        unexplained = len(cell.get("unexplained", []))
        if unexplained:
            links.append(f"{unexplained} failing test{'s' if unexplained > 1 else ''} no finding explains")
        kind = cell.get("kind")
        declared = (
            " [value: the adapter declares this edge input]"
            if kind == "value" and clause in EDGE_CLAUSES
            else ""
        )
        return f"**FAIL** ({reach}){declared}: " + ", ".join(links)
    if verdict == "declared convention":
        keys = cell.get("conventions", [])
        links_text = ", ".join(f"[{k}](#{_slug(f'{impl}-convention-{k}')})" for k in keys)
        return f"declared convention ({links_text})" if links_text else "declared convention"
    if verdict == MATCH:
        declared = ", ".join(f"`{d.rstrip(',')}`" for d in cell.get("declarations", []))
        return f"*matches undeclared convention* ({declared})" if declared else f"*{MATCH}*"
    if verdict == "not provided":
        return f"[not provided](#{_slug(f'{impl}-not-provided-{clause}')})"
    return str(verdict)


def _counts_text(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{reach} {n}" for reach, n in counts.items()) or "none"


def summary_text(matrix: Mapping[str, Any], name: str) -> str:
    value = _counts_text(matrix.get("reach_counts", {}).get(name, {}))
    edge = matrix.get("edge_reach_counts", {}).get(name, {})
    robust = matrix.get("robustness_reach_counts", {}).get(name, {})
    text = f"value clauses: {value}"
    text += f"; edge clauses: {_counts_text(edge)}" if edge else ""
    return text + (f"; robustness clauses: {_counts_text(robust)}" if robust else "")


def render_markdown(matrix: Mapping[str, Any]) -> str:
    names: list[str] = matrix["implementations"]
    columns = matrix["columns"]
    sources = {fid: f.get("source", "findings.md") for fid, f in matrix.get("findings", {}).items()}
    lines = [
        "# Conformance matrix",
        "",
        f"Generated {matrix['generated']} by `{matrix['command']}` (`tools/conformance_matrix.py`): "
        "`pytest conformance/ --impl=NAME` for each implementation, each library in its own environment "
        "(`docs/thirdparty-envs.md`). Rows are the clauses of `spec/SPEC.md`. **FAIL** (reach) links to "
        "the findings whose `Explains:` ids failed in this run (`findings.md`, `findings-family.md`); the "
        "reach in brackets is the most severe of theirs: *trainer-path* (the library's own training "
        "path computes the wrong number with default settings), *non-default* (only under a named "
        "non-default setting), *metrics-only* (logged statistics), *latent* (inputs the library's own "
        "pipeline never produces), *robustness* (only NaN/inf/garbage in masked-out slots or extreme "
        "magnitudes), *convention* / *adapter* (withdrawn: a legitimate design or an artefact of the "
        "adapter, pending the contract key or adapter fix; entries fixed in the column's release, reach "
        "*fixed*, link no cell), *unexplained* (a failing test no finding "
        "explains). *declared convention* means the clause passed against the reference variant for a "
        "convention the adapter declares (linked to its source below); *matches undeclared convention*: "
        "the clause failed against what the adapter declares and passes, every test of it, against the "
        "variant of a convention it does not declare (the declaration is given; the suite's inference, "
        "`conformance/inference.py`); *not provided*: the adapter "
        "cannot reach that op or capability in the library (reasons below); *not applicable*: no op of "
        "the adapter contract computes the clause.",
        "",
        "| Implementation | Versions | Test tools | Report | Suite wall time | Result "
        "| FAIL cells by kind (value, edge, robustness) and reach |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names:
        col = columns[name]
        versions = ", ".join(f"{d} {v}" for d, v in col.get("versions", {}).items()) or col["version"]
        tools = ", ".join(f"{d} {v}" for d, v in col.get("test_versions", {}).items()) or "?"
        summary = ", ".join(f"{n} {v}" for v, n in col["summary"].items() if n)
        wall = f"{col['wall_seconds']:.0f} s" if col.get("wall_seconds") is not None else "?"
        inference = col.get("inference") or {}
        if inference.get("reruns"):
            wall += f" (inference {inference['seconds']:.0f} s, {inference['reruns']} re-runs)"
        counts = summary_text(matrix, name)
        lines.append(
            f"| `{name}` | {_md(versions)} | {_md(tools)} | {col['report_date']} | {wall} | {_md(summary)} "
            f"| {_md(counts)} |"
        )
    lines += ["", "| Clause | Title | " + " | ".join(f"`{n}`" for n in names) + " |"]
    lines.append("|---|---|" + "---|" * len(names))
    for row in matrix["clauses"]:
        cells = [render_cell(n, row["id"], row["verdicts"].get(n), sources) for n in names]
        kind = row.get("kind", "value")
        label = f"{row['id']} ({kind})" if kind in ("edge", "robustness") else row["id"]
        lines.append(f"| {label} | {_md(row['title'])} | " + " | ".join(_md(c) for c in cells) + " |")
    lines += [
        "",
        "## Failures by reach",
        "",
        "FAIL cells per implementation, by the most severe reach of the findings linked to each: value "
        "clauses (inputs that obey the adapter's declared input conventions) apart from the edge clauses "
        "(EDGE-*, GAE-2, RWD-3, PG-6: holes, rows without action tokens and -inf logits, unless the "
        "adapter declares its pipeline produces them; a cell marked [value] is one it declares) and the "
        "robustness clauses (ROB-*: NaN, inf and junk in masked-out slots whatever is declared).",
        "",
    ]
    for name in names:
        lines.append(f"- `{name}`: {summary_text(matrix, name)}")
    if matrix.get("unexplained_failures"):
        lines += ["", "Failing tests no finding explains:", ""]
        lines += [f"- {_md(u)}" for u in matrix["unexplained_failures"]]
    unlinked = [fid for fid, f in matrix.get("findings", {}).items() if not f.get("linked")]
    if unlinked:
        lines += [
            "",
            "Findings none of whose `Explains:` ids failed in this run: "
            + ", ".join(
                f"[{fid}]({sources.get(fid, 'findings.md')}#{fid}) ({matrix['findings'][fid]['reach']})"
                for fid in unlinked
            ),
        ]
    lines += ["", "## Declared conventions and their sources", ""]
    for name in names:
        col = columns[name]
        if not col["declared_conventions"]:
            continue
        lines += [f"### {name}", ""]
        for key, value in col["declared_conventions"].items():
            source = col["convention_sources"].get(key, "(the adapter gives no source for this key)")
            anchor = _slug(f"{name}-convention-{key}")
            lines.append(f'- <a id="{anchor}"></a>`{key}={value}`: {_md(source)}')
        lines.append("")
    lines += ["## Not provided", ""]
    for name in names:
        reasons = columns[name]["not_provided"]
        clauses = [
            (row["id"], row["verdicts"][name].get("detail", ""))
            for row in matrix["clauses"]
            if row["verdicts"].get(name, {}).get("verdict") == "not provided"
        ]
        if not reasons and not clauses:
            continue
        lines += [f'### {name} <a id="{_slug(f"{name}-not-provided")}"></a>', ""]
        lines += [f"- op `{op}`: {_md(why)}" for op, why in reasons.items()]
        for clause, detail in clauses:
            anchor = _slug(f"{name}-not-provided-{clause}")
            lines.append(f'- <a id="{anchor}"></a>{clause}: {_md(detail)}')
        lines.append("")
    lines += ["## Provenance", ""]
    for name in names:
        col = columns[name]
        lines += [f"### {name}", "", _md(col["provenance"]), "", f"Command: `{_md(col['command'])}`", ""]
    return "\n".join(lines).rstrip() + "\n"
