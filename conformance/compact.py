"""The compact failure output (``--conformance-output=compact``, issue 20): one block per failing
clause, the most severe kind first, then the undeclared conventions the inference matched and the
skipped tests, one line per reason (:func:`compact_summary`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .inference import MATCH
from .kinds import clause_kind
from .records import TestRecord

__all__ = ["KIND_SEVERITY", "compact_summary", "counted", "isolation", "undeclared_conventions"]


def counted(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless ``n`` is 1.

    >>> counted(1, "test"), counted(3, "clause")
    ('1 test', '3 clauses')
    """
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
    lines = [f"skipped: {counted(sum(counts.values()), 'test')}, by reason"]
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
            f"{counted(total, 'failing test')} in {counted(len(clauses), 'clause')}"
            + (f" ({by_kind})" if by_kind else "")
            + ", "
            f"{counted(len(blocks), 'block')} above; --conformance-output=full shows every traceback, "
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
            lines.append(f"  also failing in {block.head}: {counted(len(tests) - 1, 'more test')}")
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
