"""RPP-1, RPP-2: REINFORCE++ and REINFORCE++-baseline as compositions of the contract's ops.

RPP-1: the returns are ``gae`` with zero values and lam = 1 (the discounted sum of the later token
rewards of the row, holes carried through as in GAE-2), then ``masked_whiten`` over the batch.
RPP-2: the score minus its group's mean (``group_advantages(method="dr_grpo")``) on every action
token of the row, then ``masked_whiten`` over the batch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch import Tensor

from ppo_ref.adapters.conventions import singleton_rows

from . import strategies as cs
from .support import (
    Context,
    as_tensor,
    assert_close,
    call_both,
    call_impl,
    examples,
    whitening_scale,
)

F64 = torch.float64


def _discounted(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma G_next over each row's action tokens (next = the next action token)."""
    keep = (mask != 0).tolist()
    r = rewards.double().tolist()
    out = torch.zeros(rewards.shape, dtype=F64)
    for b, row in enumerate(keep):
        running = 0.0
        for t in reversed(range(len(row))):
            if row[t]:
                running = r[b][t] + gamma * running
                out[b, t] = running
    return out


@pytest.mark.clause("RPP-1")
@pytest.mark.ops("gae", "masked_whiten")
@examples()
@given(batch=cs.gae_batches(empty_rows=True, bootstrap=False, junk=False))  # IN-1 is checked on gae itself
def test_reinforce_pp_returns(ctx: Context, batch: cs.GAEBatch) -> None:
    """gae(rewards, 0, mask, gamma, 1) returns the discounted returns (checked on the
    implementation's own output), and masked_whiten of them matches the reference."""
    keep = batch.mask != 0
    assume(int(keep.sum()) >= 2)
    zeros = torch.zeros_like(batch.rewards)
    kwargs = {"rewards": batch.rewards, "values": zeros, "mask": batch.mask, "gamma": batch.gamma, "lam": 1.0}
    actual, expected = call_both(ctx, "gae", **kwargs)
    if not isinstance(actual, tuple | list) or len(actual) != 2:
        raise AssertionError(f"gae: expected (advantages, returns), got {type(actual).__name__}")
    advantages, returns = (as_tensor(x, "gae") for x in actual)
    dtype = batch.rewards.dtype
    raw = _discounted(batch.rewards, batch.mask, batch.gamma)
    scale = 5.0 * batch.rewards.shape[1]
    assert_close(returns[keep], raw[keep], dtype, "REINFORCE++ returns: gae with V = 0, lam = 1", scale=scale)
    whiten_scale = scale * whitening_scale(raw, batch.mask)
    assert_close(
        advantages[keep], expected[0][keep], dtype, "gae advantages with V = 0, lam = 1", whiten_scale
    )
    whitened, want = call_both(ctx, "masked_whiten", x=raw.to(dtype), mask=batch.mask)
    got = as_tensor(whitened, "masked_whiten")
    assert_close(got[keep], want[keep], dtype, "REINFORCE++ advantages: whitened returns", whiten_scale)


@pytest.mark.clause("RPP-2")
@pytest.mark.ops("group_advantages", "masked_whiten")
@pytest.mark.needs("group_method:dr_grpo")
@examples()
@given(batch=cs.group_batches(methods=("dr_grpo",), singletons=False), data=st.data())
def test_reinforce_pp_baseline(ctx: Context, batch: cs.GroupBatch, data: st.DataObject) -> None:
    """Score minus the group mean on every action token of the row, whitened over the batch."""
    rows = batch.scores.shape[0]
    steps = data.draw(st.integers(1, 6), label="steps")
    mask = data.draw(cs.masks((rows, steps), empty_rows=True, min_tokens=min(2, rows * steps)), label="mask")
    keep = mask != 0
    assume(int(keep.sum()) >= 2)
    centred = as_tensor(
        call_impl(ctx, "group_advantages", scores=batch.scores, group_ids=batch.group_ids, method="dr_grpo"),
        "group_advantages",
    ).detach()
    scores = batch.scores.double()
    means = torch.stack([scores[batch.group_ids == g].mean() for g in batch.group_ids])
    assert not bool(singleton_rows(batch.group_ids).any())
    dtype = batch.scores.dtype
    assert_close(centred, (scores - means).to(dtype), dtype, "score minus group mean", scale=10.0)
    per_token = torch.where(
        keep, centred.unsqueeze(1).expand(rows, steps), torch.zeros((), dtype=centred.dtype)
    )
    whitened, want = call_both(ctx, "masked_whiten", x=per_token, mask=mask)
    got = as_tensor(whitened, "masked_whiten")
    scale = 10.0 * whitening_scale(per_token, mask)
    assert_close(got[keep], want[keep], dtype, "REINFORCE++-baseline advantages", scale)
