"""The kind of each clause (value, edge, robustness, contract) and the edge inputs: which ones a
test draws (:func:`drawn_inputs`), which ones a hand case holds (:func:`case_edge_inputs`) and the
edge clause a case on an undeclared edge input is checked under (:func:`edge_clause`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from torch import Tensor

from ppo_ref.adapters import ConventionSet

from .cases import Case, decode_inputs

__all__ = [
    "CONTRACT",
    "EDGE_CLAUSES",
    "KINDS",
    "case_edge_inputs",
    "clause_kind",
    "drawn_inputs",
    "edge_clause",
    "has_holes",
    "masked_out_inputs",
]

CONTRACT = "CONTRACT"
EDGE_CLAUSES: Mapping[str, str] = {
    "GAE-2": "holes",
    "EDGE-1": "holes",
    "RWD-3": "empty_rows",
    "PG-6": "empty_rows",
    "EDGE-2": "empty_rows",
    "EDGE-3": "inf_logits",
}
"""The edge clauses (spec section 21) and the edge input each is about (``EDGE_INPUTS``)."""
KINDS = ("contract", "value", "edge", "robustness")
"""Kinds of clause (spec introduction): ``value`` (the numbers, on the inputs the library's pipeline
produces as its adapter declares them), ``edge`` (the same numbers on edge inputs the adapter does not
declare: holes, rows and batches without action tokens, ``-inf`` logits), ``robustness`` (ROB-*:
garbage in masked-out slots, checked whatever the adapter declares), ``contract`` (the adapter's own
attributes)."""


def clause_kind(clause: str, edge_inputs: Iterable[str] = ()) -> str:
    """``contract`` for ``CONTRACT``, ``robustness`` for ``ROB-*``, ``edge`` for an edge clause whose
    edge input is not in ``edge_inputs`` (declared, it is a value clause), else ``value``.

    >>> clause_kind("GAE-2"), clause_kind("GAE-2", {"holes"}), clause_kind("ROB-2"), clause_kind("PG-1")
    ('edge', 'value', 'robustness', 'value')
    """
    if clause == CONTRACT:
        return "contract"
    if clause.startswith("ROB-"):
        return "robustness"
    edge = EDGE_CLAUSES.get(clause)
    return "edge" if edge is not None and edge not in set(edge_inputs) else "value"


def drawn_inputs(conventions: ConventionSet, ops: Iterable[str], clauses: Iterable[str]) -> dict[str, Any]:
    """The keyword arguments of :func:`.strategies.declared_inputs` for a test of ``clauses`` calling
    ``ops``: the declared ``masked_fill``; each edge input drawn where it is declared or where one of
    the test's clauses is about it (an edge clause); holes never for ops declared in ``prefix_masks``.

    >>> from ppo_ref.adapters import ConventionSet
    >>> drawn_inputs(ConventionSet(), ["gae"], ["GAE-2"])
    {'masked_fill': 'finite', 'holes': True, 'empty_rows': False, 'inf_logits': False}
    """
    ops, clauses = list(ops), list(clauses)
    wanted = set(conventions.edge_inputs) | {EDGE_CLAUSES[c] for c in clauses if c in EDGE_CLAUSES}
    prefix = bool(ops) and all(op in conventions.prefix_masks for op in ops)
    return {
        "masked_fill": conventions.masked_fill,
        "holes": "holes" in wanted and not prefix,
        "empty_rows": "empty_rows" in wanted,
        "inf_logits": "inf_logits" in wanted,
    }


def masked_out_inputs(case: Case) -> tuple[Tensor, dict[str, Tensor]] | None:
    """(bool mask, the float inputs of the mask's shape) of a case with a (B, T) mask, else None."""
    if case.raises is not None or not isinstance(case.inputs.get("mask"), list):
        return None
    inputs = decode_inputs(case)
    mask = inputs["mask"]
    if not isinstance(mask, Tensor) or mask.dim() != 2:
        return None
    per_token = {
        name: value
        for name, value in inputs.items()
        if name != "mask"
        and isinstance(value, Tensor)
        and value.is_floating_point()
        and tuple(value.shape) == tuple(mask.shape)
    }
    return mask != 0, per_token


def has_holes(case: Case) -> bool:
    """Whether the case's mask has a hole (a 0 before a row's last 1)."""
    found = masked_out_inputs(case)
    if found is None:
        return False
    keep = found[0]
    return bool((keep.flip(1).cummax(dim=1).values.flip(1) & ~keep).any())


def case_edge_inputs(case: Case) -> tuple[str, ...]:
    """The edge inputs in a case (``EDGE_INPUTS`` order): ``holes`` (a 0 before a row's last 1),
    ``empty_rows`` (a row without an action token, or a batch with no row or no position),
    ``inf_logits`` (a ``-inf`` logit)."""
    if case.raises is not None:
        return ()
    found: list[str] = []
    if has_holes(case):
        found.append("holes")
    inputs = decode_inputs(case)
    mask = inputs.get("mask")
    if isinstance(mask, Tensor) and mask.dim() == 2 and (mask.numel() == 0 or bool((mask.sum(1) == 0).any())):
        found.append("empty_rows")
    logits = inputs.get("logits")
    if isinstance(logits, Tensor) and logits.is_floating_point() and bool((logits == -math.inf).any()):
        found.append("inf_logits")
    return tuple(found)


def edge_clause(case: Case, declared: frozenset[str]) -> str | None:
    """The edge clause a case is checked under when it has an edge input the adapter does not declare
    (EDGE-1 holes, EDGE-2 rows without action tokens, EDGE-3 ``-inf`` logits); None when it has none,
    or when its own clause is already the edge clause of that input (GAE-2, RWD-3, PG-6)."""
    missing = [edge for edge in case_edge_inputs(case) if edge not in declared]
    if not missing or EDGE_CLAUSES.get(case.clause) in missing:
        return None
    return next(c for c, edge in EDGE_CLAUSES.items() if edge == missing[0] and c.startswith("EDGE-"))
