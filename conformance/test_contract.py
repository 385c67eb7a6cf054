"""The adapter itself: its attributes (the contract of ``ppo_ref.adapters.Adapter``) and its declared
conventions (known keys, allowed values). Report row ``CONTRACT``."""

from __future__ import annotations

import pytest

from ppo_ref.adapters import Adapter, contract_problems, convention_problems

from .support import Context

pytestmark = pytest.mark.clause("CONTRACT")


def test_adapter_has_the_contract_attributes(ctx: Context) -> None:
    assert isinstance(ctx.adapter, Adapter)
    problems = contract_problems(ctx.adapter)
    assert not problems, "adapter contract: " + "; ".join(problems)


def test_declared_conventions_are_known_keys_with_allowed_values(ctx: Context) -> None:
    problems = convention_problems(getattr(ctx.adapter, "conventions", None))
    assert not problems, "declared conventions: " + "; ".join(problems)


def test_adapter_provides_at_least_one_op(ctx: Context) -> None:
    assert ctx.adapter.ops, "the adapter lists no ops: nothing of the implementation can be checked"
