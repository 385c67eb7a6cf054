"""RWD-1..3: per-token rewards (KL penalty on every action token, the score on the last one)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from . import strategies as cs
from .support import Context, as_tensor, assert_close, batch_kwargs, call_both, call_impl, examples

pytestmark = pytest.mark.ops("token_rewards")


def _estimator(ctx: Context, data: st.DataObject) -> str:
    return data.draw(st.sampled_from(sorted(ctx.conventions.kl_estimators)), label="estimator")


def _kwargs(batch: cs.RewardBatch, **overrides: Any) -> dict[str, Any]:
    return batch_kwargs(batch, ("scores", "logp", "ref_logp", "mask", "kl_coef"), **overrides)


@pytest.mark.clause("RWD-1")
@examples()
@given(batch=cs.reward_batches(), data=st.data())
def test_kl_penalty_on_every_action_token(ctx: Context, batch: cs.RewardBatch, data: st.DataObject) -> None:
    """With zero scores the rewards are exactly -kl_coef * kl on action tokens, 0 elsewhere."""
    estimator = _estimator(ctx, data)
    kl_coef = data.draw(st.floats(0.01, 1.0), label="kl_coef")
    zero = torch.zeros_like(batch.scores)
    actual, expected = call_both(
        ctx, "token_rewards", **_kwargs(batch, scores=zero, kl_coef=kl_coef, estimator=estimator)
    )
    assert_close(actual, expected, batch.logp.dtype, f"token_rewards with zero scores ({estimator})")


@pytest.mark.clause("RWD-2")
@examples()
@given(batch=cs.reward_batches(), data=st.data())
def test_score_on_the_last_action_token(ctx: Context, batch: cs.RewardBatch, data: st.DataObject) -> None:
    """With kl_coef 0 the rewards are the score at the row's last action token and 0 elsewhere."""
    actual, expected = call_both(
        ctx, "token_rewards", **_kwargs(batch, kl_coef=0.0, estimator=_estimator(ctx, data))
    )
    assert_close(actual, expected, batch.logp.dtype, "token_rewards with kl_coef 0 (score placement)")


@pytest.mark.clause("RWD-1", "RWD-2")
@examples()
@given(batch=cs.reward_batches(), data=st.data())
def test_token_rewards_match_the_reference(ctx: Context, batch: cs.RewardBatch, data: st.DataObject) -> None:
    actual, expected = call_both(ctx, "token_rewards", **_kwargs(batch, estimator=_estimator(ctx, data)))
    assert_close(actual, expected, batch.logp.dtype, "token_rewards")


@pytest.mark.clause("RWD-3")
@examples()
@given(batch=cs.reward_batches(), data=st.data())
def test_rows_without_action_tokens_are_zero(
    ctx: Context, batch: cs.RewardBatch, data: st.DataObject
) -> None:
    empty = data.draw(st.lists(st.booleans(), min_size=batch.mask.shape[0], max_size=batch.mask.shape[0]))
    mask = batch.mask.clone()
    mask[torch.tensor(empty, dtype=torch.bool)] = 0
    result = as_tensor(
        call_impl(ctx, "token_rewards", **_kwargs(batch, mask=mask, estimator=_estimator(ctx, data))),
        "token_rewards",
    )
    rows = (mask != 0).sum(dim=1) == 0
    assert tuple(result.shape) == tuple(mask.shape), f"token_rewards: shape {tuple(result.shape)}"
    assert bool((result[rows] == 0).all()), (
        f"rows {rows.nonzero().flatten().tolist()} have no action token: {result[rows]}"
    )
