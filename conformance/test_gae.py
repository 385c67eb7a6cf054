"""GAE-1..4: advantages and returns against the reference: full rows, holes, padding, bootstrap,
rows of unequal length, gamma and lambda drawn independently; holes inserted and rows permuted."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch import Tensor

import ppo_ref

from . import strategies as cs
from .support import (
    Context,
    as_tensor,
    assert_close,
    batch_kwargs,
    call_both,
    call_impl,
    examples,
    whitening_scale,
)

pytestmark = pytest.mark.ops("gae")


def _outputs(result: Any) -> tuple[Tensor, Tensor]:
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise AssertionError(f"gae: expected (advantages, returns), got {type(result).__name__}")
    return as_tensor(result[0], "advantages"), as_tensor(result[1], "returns")


def _kwargs(batch: cs.GAEBatch, mask: Tensor | None = None) -> dict[str, Any]:
    names = ("rewards", "values", "mask", "gamma", "lam")
    kwargs = batch_kwargs(batch, names, ("last_values",))
    return kwargs if mask is None else {**kwargs, "mask": mask}


def _assume_whitenable(ctx: Context, mask: Tensor) -> None:
    """Under a declared ``gae_whitening`` the advantages are whitened, which needs 2 action tokens."""
    if ctx.conventions.gae_whitening != "none":
        assume(int((mask != 0).sum()) >= 2)


def _any_gae_batch(ctx: Context) -> st.SearchStrategy[cs.GAEBatch]:
    """Terminal or truncated rows; only terminal ones if the adapter declares gae_bootstrap='none'."""
    return cs.gae_batches(bootstrap=None if ctx.conventions.gae_bootstrap != "none" else False)


def _check_advantages(ctx: Context, batch: cs.GAEBatch, what: str, mask: Tensor | None = None) -> None:
    kwargs = _kwargs(batch, mask)
    _assume_whitenable(ctx, kwargs["mask"])
    actual, expected = call_both(ctx, "gae", **kwargs)
    # Whitening amplifies rounding by max|A| / std(A) of the advantages *before* whitening.
    whitened = ctx.conventions.gae_whitening != "none"
    scale = whitening_scale(ppo_ref.gae(**kwargs)[0], kwargs["mask"]) if whitened else 1.0
    assert_close(_outputs(actual)[0], expected[0], batch.rewards.dtype, f"advantages ({what})", scale=scale)


@pytest.mark.clause("GAE-1")
@examples()
@given(batch=cs.gae_batches(bootstrap=False, junk=False))
def test_recursion_on_full_rows(ctx: Context, batch: cs.GAEBatch) -> None:
    _check_advantages(ctx, batch, "every position an action token, terminal", torch.ones_like(batch.mask))


@pytest.mark.clause("GAE-2")
@examples()
@given(batch=cs.gae_batches(bootstrap=False))
def test_holes_and_padding_are_skipped(ctx: Context, batch: cs.GAEBatch) -> None:
    _check_advantages(ctx, batch, "masks with holes and padding, terminal")


@pytest.mark.clause("GAE-2")
@pytest.mark.needs("mask_holes:gae")
@examples()
@given(batch=cs.gae_batches(bootstrap=False, junk=False), data=st.data())
def test_inserting_holes_changes_no_advantage(ctx: Context, batch: cs.GAEBatch, data: st.DataObject) -> None:
    """Observation tokens inserted inside the rows (mask 0, rewards and values as the declared
    ``masked_fill`` allows: junk under ``any``) carry the next value and the running advantage
    across: the advantages of the action tokens do not change."""
    _assume_whitenable(ctx, batch.mask)
    positions = data.draw(cs.hole_positions(batch.mask.shape[1]), label="hole positions")
    junk = [
        data.draw(cs.masked_fills((batch.mask.shape[0], len(positions)), batch.rewards.dtype))
        for _ in range(2)
    ]
    holed = {
        **_kwargs(batch),
        "rewards": cs.insert_holes(batch.rewards, positions, junk[0]),
        "values": cs.insert_holes(batch.values, positions, junk[1]),
        "mask": cs.insert_holes(batch.mask, positions, 0),
    }
    before = _outputs(call_impl(ctx, "gae", **_kwargs(batch)))[0]
    after = _outputs(call_impl(ctx, "gae", **holed))[0]
    kept = cs.insert_holes(torch.ones_like(batch.mask, dtype=torch.bool), positions, False)
    assert_close(
        after[:, kept[0]], before, batch.rewards.dtype, f"advantages after inserting holes at {positions}"
    )


@pytest.mark.clause("GAE-3")
@pytest.mark.needs("gae_bootstrap")
@examples()
@given(batch=cs.gae_batches(bootstrap=True))
def test_truncated_rows_bootstrap_from_last_values(ctx: Context, batch: cs.GAEBatch) -> None:
    _check_advantages(ctx, batch, "truncated rows bootstrapped from last_values")


@pytest.mark.clause("GAE-3")
@pytest.mark.needs("gae_bootstrap")
@examples()
@given(batch=cs.gae_batches(bootstrap=False))
def test_zero_bootstrap_values_equal_terminal_rows(ctx: Context, batch: cs.GAEBatch) -> None:
    _assume_whitenable(ctx, batch.mask)
    terminal = _outputs(call_impl(ctx, "gae", **_kwargs(batch)))
    zeros = torch.zeros(batch.mask.shape[0], dtype=batch.rewards.dtype)
    bootstrapped = _outputs(call_impl(ctx, "gae", **_kwargs(batch), last_values=zeros))
    for name, got, want in zip(("advantages", "returns"), bootstrapped, terminal, strict=True):
        assert_close(got, want, batch.rewards.dtype, f"{name} with last_values = 0 vs terminal")


@pytest.mark.clause("GAE-4")
@examples()
@given(data=st.data())
def test_returns_are_raw_advantages_plus_values(ctx: Context, data: st.DataObject) -> None:
    batch = data.draw(_any_gae_batch(ctx), label="batch")
    _assume_whitenable(ctx, batch.mask)
    actual, expected = call_both(ctx, "gae", **_kwargs(batch))
    advantages, returns = _outputs(actual)
    assert_close(returns, expected[1], batch.rewards.dtype, "returns")
    off = batch.mask == 0
    assert bool((advantages[off] == 0).all()), f"advantages off the mask must be 0, got {advantages[off]}"


@pytest.mark.clause("GAE-1")
@examples()
@given(data=st.data())
def test_rows_are_independent_and_permute(ctx: Context, data: st.DataObject) -> None:
    """Permuting the rows permutes the result; a row computed alone equals its row in the batch."""
    if ctx.conventions.gae_whitening != "none":
        pytest.skip("not applicable: the declared gae_whitening couples the rows (batch statistics)")
    batch = data.draw(_any_gae_batch(ctx), label="batch")
    rows = batch.mask.shape[0]
    order = torch.tensor(data.draw(st.permutations(range(rows)), label="row order"))
    whole = _outputs(call_impl(ctx, "gae", **_kwargs(batch)))
    permuted = {k: v[order] if isinstance(v, Tensor) else v for k, v in _kwargs(batch).items()}
    shuffled = _outputs(call_impl(ctx, "gae", **permuted))
    single = data.draw(st.integers(0, rows - 1), label="single row")
    alone = {k: v[single : single + 1] if isinstance(v, Tensor) else v for k, v in _kwargs(batch).items()}
    one = _outputs(call_impl(ctx, "gae", **alone))
    for name, full, perm, row in zip(("advantages", "returns"), whole, shuffled, one, strict=True):
        assert_close(perm, full[order], batch.rewards.dtype, f"{name} of rows permuted by {order.tolist()}")
        assert_close(
            row, full[single : single + 1], batch.rewards.dtype, f"{name} of row {single} computed alone"
        )
