"""Checks added because a mutant of the zoo (``tests/mutants/``) passed the rest of the suite.

The other properties draw log-ratios within +-3 and scores within +-5, the range where trainers'
numerical guards never fire, so an undeclared guard went unnoticed:

- PG-1 / PG-5 at extreme log-ratios (mutant ``B6-log-ratio-clamped-undeclared``, bug B6 of
  ``docs/bug-catalogue.md``: verl clamps ``logp - old_logp`` to +-20 before ``exp``). Log-ratios
  up to +-30 occur for tokens the old policy found very unlikely (log-prob -30 and below). A
  declared ``log_ratio_clamp`` is honoured: the reference variant applies it.
- RWD-2 with large scores (mutant ``G6-score-clipped-undeclared``, bug G6: OpenRLHF's
  ``compute_reward`` clips scores to +-10 by default). The score must be placed unchanged.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from . import strategies as cs
from .support import Context, assert_close, call_both, examples, statistic

EXTREME_LOG_RATIO = 30.0
"""|logp - old_logp| up to this (exp(30) ~ 1e13, far from float32 overflow)."""
RARE_SHIFT = 30.0
"""The old log-probs are moved this far down, so that logp = old_logp + log-ratio stays <= 0."""
LARGE_SCORE = 1000.0


@pytest.mark.clause("PG-1", "PG-5")
@pytest.mark.ops("policy_loss")
@examples()
@given(data=st.data())
def test_policy_loss_at_extreme_log_ratios(ctx: Context, data: st.DataObject) -> None:
    """Loss and statistics with log-ratios up to +-30 on tokens of log-prob down to -42 match the
    reference (with the declared conventions, e.g. a declared log_ratio_clamp, applied)."""
    modes = sorted(set(ctx.conventions.loss_aggregations) & set(cs.COUNT_AGGREGATIONS))  # norm mode: AGG-1
    agg = data.draw(st.sampled_from(modes), label="loss_agg")
    batch = data.draw(cs.policy_batches(loss_aggs=(agg,), junk=False), label="batch")
    shape, dtype = tuple(batch.mask.shape), batch.logp.dtype
    log_ratio = data.draw(
        cs.float_tensors(shape, dtype, -EXTREME_LOG_RATIO, EXTREME_LOG_RATIO), label="log_ratio"
    )
    old_logp = (batch.old_logp.double() - RARE_SHIFT).to(dtype)
    kwargs = {
        "logp": (old_logp.double() + log_ratio.double()).to(dtype),
        "old_logp": old_logp,
        "advantages": batch.advantages,
        "mask": batch.mask,
        "clip_eps": batch.clip_eps,
        "loss_agg": batch.loss_agg,
    }
    actual, expected = call_both(ctx, "policy_loss", **kwargs)
    assert_close(
        statistic(actual, "loss", "policy_loss"), expected.loss, dtype, f"loss ({agg}), |log-ratio| <= 30"
    )
    if expected.approx_kl is not None:
        assert_close(
            statistic(actual, "approx_kl", "policy_loss"),
            expected.approx_kl,
            dtype,
            "approx_kl, |log-ratio| <= 30",
        )
    for name in ("ratio_mean", "ratio_max"):
        if getattr(actual, name, None) is not None:
            assert_close(getattr(actual, name), getattr(expected, name), dtype, f"{name}, |log-ratio| <= 30")


@pytest.mark.clause("RWD-2")
@pytest.mark.ops("token_rewards")
@examples()
@given(batch=cs.reward_batches(), data=st.data())
def test_large_scores_are_placed_unchanged(ctx: Context, batch: cs.RewardBatch, data: st.DataObject) -> None:
    """Scores up to +-1000 land unchanged on the last action token (no clipping of the score)."""
    scores = data.draw(
        cs.float_tensors(tuple(batch.scores.shape), batch.scores.dtype, -LARGE_SCORE, LARGE_SCORE),
        label="scores",
    )
    actual, expected = call_both(
        ctx,
        "token_rewards",
        scores=scores,
        logp=batch.logp,
        ref_logp=batch.ref_logp,
        mask=batch.mask,
        kl_coef=0.0,
        estimator=data.draw(st.sampled_from(sorted(ctx.conventions.kl_estimators)), label="estimator"),
    )
    assert_close(
        actual, expected, torch.promote_types(batch.logp.dtype, scores.dtype), "rewards, |score| <= 1000"
    )
