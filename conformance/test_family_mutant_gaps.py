"""Checks of the PPO-family clauses added because a mutant of the zoo (``tests/mutants/``) passed the
rest of the suite.

The family's strategies draw log-probs in [-12, 0], the range where a probability is still a normal
float32, so a correction computed from probabilities instead of log-probs went unnoticed:

- IS-3 for very unlikely sampled tokens (mutant ``IS3-probability-ratio-underflows``: the weight as
  ``exp(logp) / exp(rollout_logp)``, which in float32 is 0 / 0 = NaN below log-prob -104). Sampling
  at a high temperature or with a long tail does sample tokens of log-prob -110 and below; their
  weight must still be exactly 1 where the two log-probs agree, and the reference's elsewhere.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from . import strategies as cs
from .support import Context, assert_close, call_both, examples
from .test_family_correction import declared_bounds

UNLIKELY_SHIFT = (110.0, 150.0)
"""The log-probs are moved down by this much: exp(-110) is 0 in float32 (its smallest subnormal is
exp(-103.3)), while the log-ratios stay those of the drawn batch."""


@pytest.mark.clause("IS-3")
@pytest.mark.ops("rollout_correction")
@examples()
@given(batch=cs.correction_batches(dtypes=(torch.float32,), junk=False), data=st.data())
def test_rollout_weights_of_very_unlikely_tokens(
    ctx: Context, batch: cs.CorrectionBatch, data: st.DataObject
) -> None:
    """float32 log-probs between -112 and -162: the weights match the reference (exactly 1 where
    ``logp == rollout_logp``), with the declared levels and modes."""
    level = data.draw(st.sampled_from(sorted(ctx.conventions.correction_levels)), label="level")
    mode = data.draw(st.sampled_from(sorted(ctx.conventions.correction_modes)), label="mode")
    batch = declared_bounds(ctx, dataclasses.replace(batch, level=level, mode=mode))
    shift = data.draw(st.floats(*UNLIKELY_SHIFT), label="shift")
    # equal log-probs stay equal (the same float subtraction), so their weight must stay exactly 1
    logp, rollout_logp = batch.logp - shift, batch.rollout_logp - shift
    actual, expected = call_both(
        ctx,
        "rollout_correction",
        logp=logp,
        rollout_logp=rollout_logp,
        mask=batch.mask,
        level=level,
        mode=mode,
        high=batch.high,
        low=batch.low,
    )
    assert_close(actual, expected, torch.float32, f"weights ({level}, {mode}), log-probs below -110")
