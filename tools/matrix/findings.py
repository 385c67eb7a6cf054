"""The conformance matrix's findings: the entries of the findings files, and which failure each explains.

Findings live in ``docs/findings.md`` and ``docs/findings-family.md``. An entry starts with an anchor
``<a id="FINDING-ID"></a>`` and has header lines ``Implementations: trl``, ``Reach: metrics-only``
(one of REACHES) and ``Explains: test ids, test functions, hand-case ids or clause ids``. A FAIL cell
is linked only to the findings of its implementation whose ``Explains:`` ids match a test that failed
in that run (the report's ``failing_tests``); a failing test no finding explains is listed and makes
the cell's reach ``unexplained``. The cell shows the most severe reach of its findings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

DOCS = Path(__file__).resolve().parent.parent.parent / "docs"
FINDINGS = DOCS / "findings.md"
FINDINGS_FILES = (FINDINGS, DOCS / "findings-family.md")
ANCHOR = re.compile(r'<a id="([A-Za-z0-9_.-]+)"></a>')

REACHES = (
    "trainer-path",
    "non-default",
    "metrics-only",
    "latent",
    "robustness",
    "convention",
    "adapter",
    "fixed",
)
"""A finding's reach, most severe first (docs/findings.md says what each means). ``fixed``: the
column's release no longer computes the wrong number (the entry records the release that did and the
fix); a fixed entry explains no FAIL cell, whatever its ``Explains:`` ids."""
FIXED = "fixed"
UNEXPLAINED = "unexplained"
"""The reach of a FAIL cell with a failing test that no finding explains: ranked above every reach."""
SEVERITY = (UNEXPLAINED, *REACHES, "unknown")

REPRO_SCRIPT = re.compile(r"findings/repro/[\w.-]+\.py")
"""A ``Reproduction:`` line's script: the training-path reproduction of the finding."""
CLAUSE_ID = re.compile(r"^(?:CONTRACT|[A-Z]+(?:-[A-Z]+)*-\d+[a-z]?)$")
HEADER = re.compile(
    r"^\s*(?:[-*]\s+)?(Implementations|Reach|Explains|Version|Reproduction|Upstream)\s*:\s*(.*)$", re.I
)


class Finding(NamedTuple):
    """One entry of a findings file: ``<a id="ID"></a>`` and its header lines.

    ``explains`` holds the evidence: test ids (``conformance/test_gae.py::test_x[p]``, or the part
    after ``::``), test functions (``test_x``: every parametrization), hand-case ids
    (``GAE-2/c8-skip-holes``, the bracket part of ``test_hand_case[...]``), ``*`` as a wildcard, or a
    clause id (``GAE-2``: every failing test of that clause, the coarsest evidence)."""

    id: str
    implementations: tuple[str, ...]
    reach: str
    explains: tuple[str, ...]
    source: str = "findings.md"
    version: str = ""
    reproduction: str = ""


def _split_items(text: str) -> list[str]:
    return [item.strip().strip("`").strip() for item in text.split(",") if item.strip().strip("`").strip()]


def _finding(fid: str, fields: Mapping[str, str], source: str) -> Finding:
    impls = tuple(_split_items(fields.get("implementations", ""))) or (fid.split("-", 1)[0],)
    reach = fields.get("reach", "").strip().strip("`").split()
    script = REPRO_SCRIPT.search(fields.get("reproduction", ""))
    return Finding(
        id=fid,
        implementations=impls,
        reach=reach[0] if reach and reach[0] in REACHES else "unknown",
        explains=tuple(_split_items(fields.get("explains", ""))),
        source=source,
        version=fields.get("version", "").strip(),
        reproduction=script.group(0) if script else "",
    )


def parse_findings(texts: Iterable[str | tuple[str, str]]) -> dict[str, Finding]:
    """Finding id -> Finding, from ``(file name, text)`` pairs (a bare text is ``findings.md``).

    An entry starts at ``<a id="ID"></a>`` and ends at the next anchor; its header lines are
    ``Implementations: trl`` (adapter names; default: the id's prefix), ``Reach: one of REACHES``,
    ``Explains: id, id, ...`` (continued on the following indented lines), and optionally
    ``Version:``, ``Reproduction:``, ``Upstream:``. An unknown reach is kept as ``unknown``."""
    found: dict[str, Finding] = {}
    for item in texts:
        source, text = ("findings.md", item) if isinstance(item, str) else item
        current: str | None = None
        fields: dict[str, str] = {}
        collecting: str | None = None

        for line in text.splitlines():
            anchor = ANCHOR.search(line)
            if anchor:
                if current is not None:
                    found[current] = _finding(current, fields, source)
                current, fields, collecting = anchor.group(1), {}, None
                continue
            if current is None:
                continue
            header = HEADER.match(line)
            if header and header.group(1).lower() not in fields:
                key = header.group(1).lower()
                fields[key] = header.group(2)
                collecting = key if key == "explains" else None
            elif collecting and line[:1].isspace() and line.strip():
                fields[collecting] += "," + line
            else:
                collecting = None
        if current is not None:
            found[current] = _finding(current, fields, source)
    return found


def _pattern(item: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in item.split("*")))


def _test_forms(test: str) -> list[str]:
    """The names a finding may use for a failing test id."""
    tail = test.split("::", 1)[-1]
    forms = [test, tail, tail.split("[", 1)[0]]
    if "[" in tail and tail.endswith("]"):
        forms.append(tail[tail.index("[") + 1 : -1])
    return forms


def explains(finding: Finding, impl: str, clause: str, test: str | None) -> bool:
    """Whether ``finding`` explains the failure of ``test`` (None: the clause failed without a test
    id) in the FAIL cell (``impl``, ``clause``)."""
    if impl not in finding.implementations or finding.reach == FIXED:
        return False
    for item in finding.explains:
        if CLAUSE_ID.match(item):
            if item == clause:
                return True
            continue
        if test is not None and any(_pattern(item).fullmatch(form) for form in _test_forms(test)):
            return True
    return False


def link_failures(
    impl: str, clause: str, failing_tests: Iterable[str], findings: Mapping[str, Finding]
) -> tuple[list[str], list[str]]:
    """(ids of the findings that explain at least one failing test, failing tests none explains).

    A FAIL cell without failing test ids (a contract failure) is explained only by a clause id."""
    tests: list[str | None] = list(failing_tests) or [None]
    linked: list[str] = []
    unexplained: list[str] = []
    for test in tests:
        hits = [f.id for f in findings.values() if explains(f, impl, clause, test)]
        if not hits:
            unexplained.append(test if test is not None else f"{clause} (no failing test id)")
        linked += [h for h in hits if h not in linked]
    order = list(findings)
    return sorted(linked, key=order.index), unexplained


def cell_reach(
    finding_ids: Iterable[str], unexplained: Iterable[str], findings: Mapping[str, Finding]
) -> str:
    """The most severe reach among the linked findings; ``unexplained`` when any failing test has no
    finding (SEVERITY gives the order)."""
    reaches = [findings[i].reach if i in findings else "unknown" for i in finding_ids]
    if list(unexplained) or not reaches:
        reaches.append(UNEXPLAINED)
    return min(reaches, key=SEVERITY.index)


def load_findings(paths: Iterable[Path]) -> dict[str, Finding]:
    """The findings of the files that exist, each linked by its own file name."""
    return parse_findings([(p.name, p.read_text(encoding="utf-8")) for p in paths if p.exists()])
