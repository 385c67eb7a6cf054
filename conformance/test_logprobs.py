"""LOGP-1..3 and ENT-1: per-token log-probs and entropies against the reference on random logits."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from . import strategies as cs
from .support import Context, as_tensor, assert_close, call_both, examples

NOT_ONE = st.floats(0.3, 3.0).filter(lambda t: abs(t - 1.0) > 0.05)
"""Temperatures other than 1 (LOGP-2)."""


@pytest.mark.clause("LOGP-1")
@pytest.mark.ops("token_logprobs")
@examples()
@given(batch=cs.logits_batches(dtypes=cs.FLOAT_DTYPES))
def test_token_logprobs_score_the_next_token(ctx: Context, batch: cs.LogitsBatch) -> None:
    actual, expected = call_both(ctx, "token_logprobs", logits=batch.logits, input_ids=batch.input_ids)
    assert_close(actual, expected, batch.logits.dtype, "token_logprobs at temperature 1")


@pytest.mark.clause("LOGP-2")
@pytest.mark.ops("token_logprobs")
@examples()
@given(batch=cs.logits_batches(dtypes=cs.FLOAT_DTYPES), temperature=NOT_ONE)
def test_token_logprobs_divide_the_logits_by_the_temperature(
    ctx: Context, batch: cs.LogitsBatch, temperature: float
) -> None:
    actual, expected = call_both(
        ctx, "token_logprobs", logits=batch.logits, input_ids=batch.input_ids, temperature=temperature
    )
    assert_close(actual, expected, batch.logits.dtype, f"token_logprobs at temperature {temperature}")


@pytest.mark.clause("LOGP-3")
@pytest.mark.ops("token_logprobs")
@examples()
@given(batch=cs.logits_batches(dtypes=cs.HALF_DTYPES))
def test_token_logprobs_of_half_precision_logits_use_float32_math(
    ctx: Context, batch: cs.LogitsBatch
) -> None:
    actual, expected = call_both(
        ctx, "token_logprobs", logits=batch.logits, input_ids=batch.input_ids, temperature=batch.temperature
    )
    result = as_tensor(actual, "token_logprobs")
    assert result.dtype in (torch.float32, torch.float64), f"{batch.logits.dtype} logits gave {result.dtype}"
    assert_close(result, expected, torch.float32, f"token_logprobs of {batch.logits.dtype} logits")


@pytest.mark.clause("ENT-1")
@pytest.mark.ops("entropy")
@examples()
@given(batch=cs.logits_batches())
def test_entropy_matches_the_reference(ctx: Context, batch: cs.LogitsBatch) -> None:
    actual, expected = call_both(ctx, "entropy", logits=batch.logits)
    result = as_tensor(actual, "entropy")
    assert result.dtype in (torch.float32, torch.float64), f"{batch.logits.dtype} logits gave {result.dtype}"
    dtype = torch.float64 if batch.logits.dtype == torch.float64 else torch.float32
    assert_close(result, expected, dtype, f"entropy of {batch.logits.dtype} logits")
