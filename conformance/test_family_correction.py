"""IS-1..3: importance weights for a rollout engine's log-probs (TIS, IcePop/MIS, sequence level)
against the reference, and on the implementation's output: weights 1 where the log-probs agree,
0 off the mask, no gradient, a rejected sequence loses every token, the product ratio's length
dependence (verl PR #2953, TRL #4493, #6789)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch import Tensor

from . import strategies as cs
from .support import (
    Context,
    as_tensor,
    assert_close,
    batch_kwargs,
    call_both,
    call_impl,
    examples,
    note_repro,
)

pytestmark = pytest.mark.ops("rollout_correction")

F64 = torch.float64


def _kwargs(batch: cs.CorrectionBatch, **overrides: Any) -> dict[str, Any]:
    kwargs = batch_kwargs(batch, ("logp", "rollout_logp", "mask", "level", "mode", "high"))
    if batch.low is not None and batch.low <= batch.high:
        kwargs["low"] = batch.low
    return {**kwargs, **overrides}


def _draw(
    ctx: Context, data: st.DataObject, level: str | None = None, mode: str | None = None, **options: Any
) -> cs.CorrectionBatch:
    c = ctx.conventions
    levels = (level,) if level else tuple(x for x in cs.CORRECTION_LEVELS if x in c.correction_levels)
    modes = (mode,) if mode else tuple(x for x in cs.CORRECTION_MODES if x in c.correction_modes)
    batch = data.draw(cs.correction_batches(levels=levels, modes=modes, **options), label="batch")
    return declared_bounds(ctx, batch)


def declared_bounds(ctx: Context, batch: cs.CorrectionBatch) -> cs.CorrectionBatch:
    """The batch within the declared ``correction_bounds``: no ``low`` in truncate mode without
    ``truncate-low``, and mask mode without ``mask-open-low`` only with a ``low`` (else rejected)."""
    bounds = ctx.conventions.correction_bounds
    if batch.mode == "truncate" and "truncate-low" not in bounds:
        return dataclasses.replace(batch, low=None)
    if batch.mode == "mask" and "mask-open-low" not in bounds:
        assume(batch.low is not None and batch.low <= batch.high)
    return batch


def _log_weights(batch: cs.CorrectionBatch, level: str) -> Tensor:
    """log w per action token at ``level``, in float64 (0 off the mask)."""
    keep = batch.mask != 0
    log_w = torch.where(keep, batch.logp.double() - batch.rollout_logp.double(), torch.zeros((), dtype=F64))
    if level != "token":
        total = log_w.sum(dim=1, keepdim=True)
        if level == "sequence-geometric":
            total = total / keep.sum(dim=1, keepdim=True).clamp(min=1)
        log_w = torch.where(keep, total.expand_as(log_w), torch.zeros((), dtype=F64))
    return log_w


def _near_a_bound(batch: cs.CorrectionBatch, kwargs: dict[str, Any]) -> Tensor:
    """Action tokens whose weight is within rounding of high or low: mask mode may go either way."""
    w = _log_weights(batch, batch.level).exp()
    band = (1e-4 if batch.logp.dtype != F64 else 1e-9) * max(1, batch.mask.shape[1])
    near = (w - kwargs["high"]).abs() <= band * kwargs["high"]
    if "low" in kwargs:
        near |= (w - kwargs["low"]).abs() <= band * kwargs["low"]
    result: Tensor = near & (batch.mask != 0)
    return result


def _by(name: str, values: tuple[str, ...], clause: Any) -> pytest.MarkDecorator:
    return pytest.mark.parametrize(
        name,
        [
            pytest.param(
                v, marks=[pytest.mark.clause(clause(v)), pytest.mark.needs(f"correction_{name}:{v}")]
            )
            for v in values
        ],
    )


@_by("level", cs.CORRECTION_LEVELS, lambda v: "IS-1" if v == "token" else "IS-2")
@_by("mode", cs.CORRECTION_MODES, lambda _v: "IS-1")
@examples()
@given(data=st.data())
def test_weights_match_the_reference(ctx: Context, level: str, mode: str, data: st.DataObject) -> None:
    batch = _draw(ctx, data, level, mode)
    kwargs = _kwargs(batch)
    actual, expected = call_both(ctx, "rollout_correction", **kwargs)
    got = as_tensor(actual, "rollout_correction")
    compare = (
        ~_near_a_bound(batch, kwargs) if mode == "mask" else torch.ones_like(batch.mask, dtype=torch.bool)
    )
    if level != "token" and mode == "mask":  # a row with a token near a bound may go either way
        compare = compare.all(dim=1, keepdim=True).expand_as(compare)
    what = f"rollout_correction(level={level}, mode={mode}, high={batch.high}, low={kwargs.get('low')})"
    assert_close(
        got[compare], expected[compare], batch.logp.dtype, what, scale=kwargs["high"] * batch.mask.shape[1]
    )


@pytest.mark.clause("IS-3")
@examples()
@given(data=st.data())
def test_weights_are_one_where_the_log_probs_agree_and_zero_off_the_mask(
    ctx: Context, data: st.DataObject
) -> None:
    batch = _draw(ctx, data)
    same = torch.where(batch.mask != 0, batch.rollout_logp, batch.logp)
    kwargs = _kwargs(batch, logp=same)
    out = as_tensor(call_impl(ctx, "rollout_correction", **kwargs), "rollout_correction").detach()
    keep = batch.mask != 0
    assert bool((out[keep] == 1).all()), f"weights where logp == rollout_logp: {out[keep].tolist()}"
    assert bool((out[~keep] == 0).all()), f"weights off the mask: {out[~keep].tolist()}"
    out = as_tensor(call_impl(ctx, "rollout_correction", **_kwargs(batch)), "rollout_correction").detach()
    assert bool((out[~keep] == 0).all()), f"weights off the mask: {out[~keep].tolist()}"


@pytest.mark.clause("IS-3")
@examples()
@given(data=st.data())
def test_weights_carry_no_gradient(ctx: Context, data: st.DataObject) -> None:
    """Neither logp nor rollout_logp may receive a gradient through the weights."""
    batch = _draw(ctx, data)
    kwargs = _kwargs(batch)
    note_repro(ctx, "rollout_correction", **kwargs)
    logp = batch.logp.detach().clone().requires_grad_(True)
    rollout = batch.rollout_logp.detach().clone().requires_grad_(True)
    out = as_tensor(
        ctx.op("rollout_correction")(**{**kwargs, "logp": logp, "rollout_logp": rollout}), "weights"
    )
    if out.requires_grad:
        grads = torch.autograd.grad(out.sum(), (logp, rollout), allow_unused=True)
        for name, grad in zip(("logp", "rollout_logp"), grads, strict=True):
            assert grad is None or bool((grad == 0).all()), f"the weights pass a gradient to {name}: {grad}"


@pytest.mark.clause("IS-2")
@pytest.mark.needs("correction_mode:mask")
@pytest.mark.parametrize(
    "level",
    [
        pytest.param(v, marks=pytest.mark.needs(f"correction_level:{v}"))
        for v in ("sequence", "sequence-geometric")
    ],
)
@examples()
@given(data=st.data())
def test_a_rejected_sequence_loses_every_token(ctx: Context, level: str, data: st.DataObject) -> None:
    """At a sequence level one weight per row: every action token of a row gets the same value, and
    mask mode gives 0 to every token of a row whose weight is outside [low, high]."""
    batch = _draw(ctx, data, level, "mask")
    out = as_tensor(call_impl(ctx, "rollout_correction", **_kwargs(batch)), "rollout_correction").detach()
    keep = batch.mask != 0
    for b in range(out.shape[0]):
        row = out[b][keep[b]]
        if row.numel():
            assert bool((row == row[0]).all()), f"row {b}: one weight per sequence, got {row.tolist()}"


@pytest.mark.clause("IS-2")
@pytest.mark.needs("correction_level:sequence", "correction_mode:truncate")
@examples()
@given(data=st.data(), copies=st.integers(2, 4))
def test_the_product_ratio_grows_with_the_length(ctx: Context, data: st.DataObject, copies: int) -> None:
    """Repeating each row k times raises its product weight to the k-th power (length dependence);
    checked without truncation (high above every weight)."""
    batch = _draw(ctx, data, "sequence", "truncate", empty_rows=False, dtypes=(F64,))
    log_w = _log_weights(batch, "sequence")
    assume(float(log_w.abs().max()) * copies < 600)

    def tiled(x: Tensor) -> Tensor:
        return x.repeat(1, copies)

    kwargs = _kwargs(batch, high=1e300)
    kwargs.pop("low", None)
    base = as_tensor(call_impl(ctx, "rollout_correction", **kwargs), "weights").detach()
    long_kwargs = {
        **kwargs,
        "logp": tiled(batch.logp),
        "rollout_logp": tiled(batch.rollout_logp),
        "mask": tiled(batch.mask),
    }
    long = as_tensor(call_impl(ctx, "rollout_correction", **long_kwargs), "weights").detach()
    keep = batch.mask != 0
    first = keep.long().argmax(dim=1)
    rows = torch.arange(keep.shape[0])
    assert_close(long[rows, first].log(), copies * base[rows, first].log(), F64,
                 f"log weight of rows repeated {copies} times", scale=math.fabs(copies) * 10)  # fmt: skip
