"""MASK-1..3: masked mean and whitening against the reference (junk in masked-out slots included)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import ppo_ref

from . import strategies as cs
from .support import (
    Context,
    as_tensor,
    assert_close,
    call_both,
    call_impl,
    examples,
    whitened_variance,
    whitening_scale,
)


@pytest.mark.clause("MASK-1")
@pytest.mark.ops("masked_mean")
@examples()
@given(batch=cs.masked_batches(), dim=st.sampled_from([None, 0, 1, -1]))
def test_masked_mean_matches_the_reference(ctx: Context, batch: cs.MaskedBatch, dim: int | None) -> None:
    kwargs = {} if dim is None else {"dim": dim}
    actual, expected = call_both(ctx, "masked_mean", x=batch.x, mask=batch.mask, **kwargs)
    assert_close(actual, expected, batch.x.dtype, f"masked_mean(dim={dim})")


@pytest.mark.clause("MASK-3")
@pytest.mark.ops("masked_whiten")
@examples()
@given(batch=cs.masked_batches(min_tokens=2), shift_mean=st.booleans())
def test_masked_whiten_matches_the_reference(ctx: Context, batch: cs.MaskedBatch, shift_mean: bool) -> None:
    actual, expected = call_both(ctx, "masked_whiten", x=batch.x, mask=batch.mask, shift_mean=shift_mean)
    scale = whitening_scale(batch.x, batch.mask)
    assert_close(actual, expected, batch.x.dtype, f"masked_whiten(shift_mean={shift_mean})", scale=scale)


@pytest.mark.clause("MASK-2", "MASK-3")
@pytest.mark.ops("masked_whiten")
@examples()
@given(batch=cs.masked_batches(min_tokens=2, dtypes=(torch.float64,)))
def test_whitened_values_have_unit_variance_of_the_declared_kind(ctx: Context, batch: cs.MaskedBatch) -> None:
    """Whitening divides by the unbiased standard deviation (MASK-2): the unbiased variance of the
    result is var / (var + eps), i.e. 1 (with ``whiten_variance='biased'``: the biased one is), for
    the declared ``whiten_eps`` and ``whiten_eps_placement`` (:func:`.support.whitened_variance`:
    RLinf's ``1/(std + 1e-5)`` gives var / (std + 1e-5)^2, 1.6e-6 below 1 at std 12)."""
    unbiased = ctx.conventions.whiten_variance == "unbiased"
    variance = float(ppo_ref.masked_var(batch.x, batch.mask, unbiased=unbiased))
    assume(variance > 1e-3)
    result = as_tensor(call_impl(ctx, "masked_whiten", x=batch.x, mask=batch.mask), "masked_whiten")
    measured = ppo_ref.masked_var(result.to(torch.float64), batch.mask, unbiased=unbiased)
    kind = "unbiased" if unbiased else "biased"
    assert_close(
        measured,
        torch.tensor(
            whitened_variance(variance, ctx.conventions.whiten_eps, ctx.conventions.whiten_eps_placement)
        ),
        torch.float64,
        f"{kind} variance of the result",
    )
