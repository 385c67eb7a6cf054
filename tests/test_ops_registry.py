"""The op registry (issue 25, Deliver 1): each op once, and what derives from it."""

from __future__ import annotations

import pytest

import ppo_ref
from conformance.cases import spec_clauses
from ppo_ref.adapters import OP_NAMES, ReferenceAdapter, base
from ppo_ref.adapters.conventions import OP_CLAUSES
from ppo_ref.ops import OPS, Op


def test_every_row_is_the_ppo_ref_function_of_its_name_with_clauses_of_the_spec() -> None:
    clauses = spec_clauses()
    for name, op in OPS.items():
        assert op.name == name and op.function is getattr(ppo_ref, name)
        assert set(op.clauses) <= set(clauses), f"{name}: clauses not in spec/SPEC.md"
        assert op.returns is not None


def test_the_contract_the_conventions_and_mine_derive_from_the_registry() -> None:
    assert OP_NAMES == tuple(OPS) and len(set(OP_NAMES)) == len(OP_NAMES) == 16
    assert dict(OP_CLAUSES) == {name: op.clauses for name, op in OPS.items()}
    mine = ReferenceAdapter()
    assert mine.ops == frozenset(OPS)
    assert all(getattr(mine, name) is op.function for name, op in OPS.items())
    with pytest.raises(AttributeError, match="no attribute 'masked_var'"):
        mine.masked_var  # noqa: B018  (a ppo_ref function, not an op of the contract)


def test_every_op_has_its_signature_protocol_in_the_contract() -> None:
    for name in OPS:
        protocol = "".join(part.capitalize() for part in name.split("_")) + "Op"
        assert hasattr(base, protocol), f"ppo_ref.adapters.base has no {protocol} for the op {name!r}"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "no id", "function": ppo_ref.gae, "clauses": ("GAE-1",)}, r"^name: expected an identifier"),
        ({"name": "gae", "function": ppo_ref.entropy, "clauses": ("GAE-1",)}, r"^function: expected"),
        ({"name": "gae", "function": ppo_ref.gae, "clauses": ()}, r"^clauses: expected spec clause ids"),
    ],
)
def test_a_bad_row_is_refused_naming_the_field(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Op(**kwargs)  # type: ignore[arg-type]
