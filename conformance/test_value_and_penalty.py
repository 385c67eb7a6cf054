"""VF-1, VF-2 (clipped and unclipped value loss) and PEN-1 (PPO-Penalty loss): values and gradients
against the reference, and the token-mean value loss of chunks recombined by token counts."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from ppo_ref.adapters.conventions import with_value_slot

from . import strategies as cs
from .support import (
    Context,
    as_tensor,
    assert_close,
    batch_kwargs,
    call_both,
    call_impl,
    examples,
    grad_of,
    note_repro,
    statistic,
)

CLIP_MODES = [
    pytest.param(
        True, id="clipped", marks=[pytest.mark.clause("VF-1"), pytest.mark.needs("value_clip:clipped")]
    ),
    pytest.param(
        False, id="unclipped", marks=[pytest.mark.clause("VF-2"), pytest.mark.needs("value_clip:unclipped")]
    ),
]


def _value_kwargs(batch: cs.ValueBatch, **overrides: Any) -> dict[str, Any]:
    return batch_kwargs(batch, ("values", "old_values", "returns", "mask", "clip_eps"), **overrides)


def _value_kinks(batch: cs.ValueBatch) -> Tensor:
    """Action tokens where the clipped value loss has a kink: |V - V_old| = c, or both branches equal."""
    if batch.clip_eps is None:
        return torch.zeros_like(batch.mask, dtype=torch.bool)
    keep = batch.mask != 0
    zero = torch.zeros((), dtype=torch.float64)
    v, old, ret = (
        torch.where(keep, t.double(), zero) for t in (batch.values, batch.old_values, batch.returns)
    )
    band = 1e-5 if batch.values.dtype != torch.float64 else 1e-9
    clipped = old + (v - old).clamp(-batch.clip_eps, batch.clip_eps)
    at_clip = ((v - old).abs() - batch.clip_eps).abs() <= band * (1 + (v - old).abs())
    tie = ((v - ret) ** 2 - (clipped - ret) ** 2).abs() <= band * (1 + (v - ret) ** 2)
    return keep & (at_clip | tie)


@pytest.mark.ops("value_loss")
@pytest.mark.parametrize("clip", CLIP_MODES)
@examples()
@given(data=st.data())
def test_value_loss_matches_the_reference(ctx: Context, clip: bool, data: st.DataObject) -> None:
    batch = data.draw(cs.value_batches(clip=clip), label="batch")
    actual, expected = call_both(ctx, "value_loss", **_value_kwargs(batch))
    assert_close(actual, expected, batch.values.dtype, f"value_loss(clip_eps={batch.clip_eps})")


@pytest.mark.ops("value_loss")
@pytest.mark.parametrize("clip", CLIP_MODES)
@examples()
@given(data=st.data())
def test_value_loss_gradient_matches_the_reference(ctx: Context, clip: bool, data: st.DataObject) -> None:
    """d loss / d values: (V - R)/n where the unclipped branch wins, (V_clip - R)/n where the clipped
    one wins inside the clip range, 0 where it wins outside; 0 and finite off the mask."""
    batch = data.draw(cs.value_batches(clip=clip), label="batch")
    note_repro(ctx, "value_loss", **_value_kwargs(batch))
    grads = []
    for impl in (ctx.op("value_loss"), ctx.variant.value_loss):
        values = batch.values.detach().clone().requires_grad_(True)
        out = impl(**_value_kwargs(batch, values=values, old_values=batch.old_values.clone()))
        grads.append(grad_of(out, values, "value loss"))
    assert bool(torch.isfinite(grads[0]).all()), f"non-finite value-loss gradient: {grads[0]}"
    compare = ~_value_kinks(batch)
    assert_close(
        grads[0][compare], grads[1][compare], batch.values.dtype, "d value_loss / d values off the kinks"
    )


@pytest.mark.ops("value_loss")
@pytest.mark.parametrize("clip", CLIP_MODES)
@examples()
@given(data=st.data())
def test_value_loss_of_chunks_recombined_by_token_counts_is_the_whole(
    ctx: Context, clip: bool, data: st.DataObject
) -> None:
    if ctx.conventions.value_loss_agg != "token-mean":
        pytest.skip(
            f"not applicable: the declared value_loss_agg={ctx.conventions.value_loss_agg!r} "
            "is not a token mean"
        )
    batch = data.draw(cs.value_batches(clip=clip), label="batch")
    rows = batch.mask.shape[0]
    cut = data.draw(st.integers(0, rows), label="cut")
    whole = float(as_tensor(call_impl(ctx, "value_loss", **_value_kwargs(batch)), "value_loss"))
    total, tokens = 0.0, 0
    for part in (slice(0, cut), slice(cut, rows)):
        chunk = {k: v[part] if isinstance(v, Tensor) else v for k, v in _value_kwargs(batch).items()}
        trained = chunk["mask"] != 0
        if ctx.conventions.value_after_last_action_token == "trained":
            trained = with_value_slot(chunk["mask"])  # the declared value slot is averaged too
        count = int(trained.sum())
        if count:
            total += float(as_tensor(call_impl(ctx, "value_loss", **chunk), "value_loss")) * count
            tokens += count
    assert_close(
        torch.tensor(whole),
        torch.tensor(total / max(tokens, 1)),
        batch.values.dtype,
        f"value loss vs rows [0:{cut}] and [{cut}:{rows}] recombined",
    )


def _penalty_kwargs(batch: cs.PenaltyBatch, **overrides: Any) -> dict[str, Any]:
    return batch_kwargs(batch, ("logp", "old_logp", "advantages", "mask", "beta"), **overrides)


@pytest.mark.clause("PEN-1")
@pytest.mark.ops("ppo_penalty_loss")
@examples()
@given(batch=cs.penalty_batches())
def test_penalty_loss_and_gradient_match_the_reference(ctx: Context, batch: cs.PenaltyBatch) -> None:
    """loss = -mean_m(ratio A - beta k3(old || new)), gradient -(ratio A - beta (ratio - 1))/n; the
    reported kl (optional) is mean_m(k3)."""
    actual, expected = call_both(ctx, "ppo_penalty_loss", **_penalty_kwargs(batch))
    dtype = batch.logp.dtype
    assert_close(statistic(actual, "loss", "ppo_penalty_loss"), expected.loss, dtype, "PPO-Penalty loss")
    if getattr(actual, "kl", None) is not None:
        assert_close(actual.kl, expected.kl, dtype, "PPO-Penalty kl")
    grads = []
    for impl in (ctx.op("ppo_penalty_loss"), ctx.variant.ppo_penalty_loss):
        logp = batch.logp.detach().clone().requires_grad_(True)
        grads.append(
            grad_of(statistic(impl(**_penalty_kwargs(batch, logp=logp)), "loss", "penalty"), logp, "penalty")
        )
    assert bool(torch.isfinite(grads[0]).all()), f"non-finite PPO-Penalty gradient: {grads[0]}"
    assert_close(grads[0], grads[1], dtype, "d PPO-Penalty loss / d logp")
