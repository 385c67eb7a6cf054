"""Issue 20: edge inputs apart from the inputs a pipeline produces, without a suite run.

The strategies draw an edge input only where the declared inputs allow it; the suite draws, for a
test, the edge inputs its adapter declares and the one its edge clause is about
(:func:`conformance.support.drawn_inputs`); a hand case of a value clause whose input has an
undeclared edge input is reported under that input's EDGE clause; a clause's kind follows the
declaration. The suite runs themselves are in ``tests/test_conformance_cli.py`` (edge FAILs of an
adapter that divides by zero on empty rows, value FAILs once it declares them).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st

from conformance import strategies as cs
from conformance.cases import load_cases
from conformance.support import EDGE_CLAUSES, clause_kind, drawn_inputs, edge_clause
from ppo_ref.adapters import ConventionSet, parse_conventions
from ppo_ref.adapters.conventions import EDGE_INPUTS

CASES = {case.id: case for case in load_cases()}


def _has_hole(mask: torch.Tensor) -> bool:
    keep = mask != 0
    return bool((keep.flip(1).cummax(dim=1).values.flip(1) & ~keep).any())


@settings(max_examples=40, derandomize=True, database=None)
@given(data=st.data())
def test_pipeline_inputs_have_no_edge_input(data: st.DataObject) -> None:
    """With no edge input allowed, even a strategy asked for empty rows draws a token in every row,
    masks without holes and finite logits; the masked-out slots hold finite values."""
    with cs.declared_inputs("finite", holes=False, empty_rows=False, inf_logits=False):
        batch = data.draw(cs.policy_batches(empty_rows=True))
        logits = data.draw(cs.logits_batches(banned_tokens=True))
    assert bool(((batch.mask != 0).sum(1) > 0).all()), batch.mask
    assert not _has_hole(batch.mask), batch.mask
    assert bool(torch.isfinite(batch.logp).all() and torch.isfinite(batch.advantages).all())
    assert bool(torch.isfinite(logits.logits).all())


def test_edge_inputs_are_drawn_where_allowed() -> None:
    """Outside a declared_inputs block (ppo-ref's own tests) every edge input is drawn."""
    quick = settings(max_examples=500, database=None, derandomize=True)
    find(
        cs.policy_batches(empty_rows=True), lambda b: bool(((b.mask != 0).sum(1) == 0).any()), settings=quick
    )
    find(cs.policy_batches(), lambda b: _has_hole(b.mask), settings=quick)
    find(cs.logits_batches(), lambda b: bool((b.logits == -math.inf).any()), settings=quick)


def test_declared_inputs_rejects_a_non_bool_flag() -> None:
    with pytest.raises(ValueError, match=r"^empty_rows: expected a bool"):
        with cs.declared_inputs(empty_rows=1):  # type: ignore[arg-type]
            pass


def test_a_test_draws_the_declared_edge_inputs_and_its_clauses_own() -> None:
    default = ConventionSet()
    assert drawn_inputs(default, ["policy_loss"], ["PG-1"]) == {
        "masked_fill": "finite",
        "holes": False,
        "empty_rows": False,
        "inf_logits": False,
    }
    assert drawn_inputs(default, ["policy_loss"], ["PG-6"])["empty_rows"] is True
    assert drawn_inputs(default, ["entropy"], ["EDGE-3"])["inf_logits"] is True
    holes = parse_conventions({"edge_inputs": ["holes"]})
    assert drawn_inputs(holes, ["masked_mean"], ["MASK-1"])["holes"] is True
    no_holes_for_gae = parse_conventions({"edge_inputs": "all", "prefix_masks": ["gae"]})
    assert drawn_inputs(no_holes_for_gae, ["gae"], ["GAE-2"])["holes"] is False
    assert drawn_inputs(parse_conventions({"masked_fill": "any"}), [], [])["masked_fill"] == "any"


def test_kinds_follow_the_declared_edge_inputs() -> None:
    assert {EDGE_CLAUSES[c] for c in EDGE_CLAUSES} == set(EDGE_INPUTS)
    for clause, edge in EDGE_CLAUSES.items():
        assert clause_kind(clause) == "edge"
        assert clause_kind(clause, {edge}) == "value"
        assert clause_kind(clause, set(EDGE_INPUTS) - {edge}) == "edge"
    assert [clause_kind(c) for c in ("CONTRACT", "ROB-3", "GAE-3")] == ["contract", "robustness", "value"]


def test_edge_inputs_parse() -> None:
    assert parse_conventions({"edge_inputs": "all"}).edge_inputs == frozenset(EDGE_INPUTS)
    assert parse_conventions({"edge_inputs": "none"}).edge_inputs == frozenset()
    with pytest.raises(ValueError, match="edge_inputs"):
        parse_conventions({"edge_inputs": ["gaps"]})


@pytest.mark.parametrize(
    ("case", "clause"),
    [
        ("MASK-1/hole", "EDGE-1"),
        ("MASK-1/empty-mask", "EDGE-2"),
        ("VF-1/no-action-token", "EDGE-2"),
        ("ENT-1/banned-tokens", "EDGE-3"),
        ("GAE-2/c8-skip-holes", None),  # GAE-2 is the edge clause of holes itself
        ("PG-6/no-action-token", None),
        ("PG-1/clip-table-one-row", None),  # no edge input
    ],
)
def test_a_value_case_on_an_undeclared_edge_input_moves_to_its_edge_clause(
    case: str, clause: str | None
) -> None:
    assert edge_clause(CASES[case], frozenset()) == clause
    assert edge_clause(CASES[case], frozenset(EDGE_INPUTS)) is None  # declared: its own clause
