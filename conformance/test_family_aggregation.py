"""AGG-1..3: loss aggregation. ``aggregate_loss`` against the reference in every mode, the
Dr. GRPO mode's constant (never the padded width), the whole-batch count keywords of every loss op,
and micro-batch partition invariance checked on the implementation itself: the calls on any split
of a batch, each given the whole batch's counts, sum to one call on the whole batch, in value and
in gradient (verl #7321, #593; TRL #2995, PR #6024; SkyRL PR #925/#1296; ms-swift #10117)."""

from __future__ import annotations

from collections.abc import Callable
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
    grad_of,
    note_repro,
    statistic,
)


def _agg_clause(agg: str) -> str:
    return "AGG-1" if agg == "seq-mean-token-sum-norm" else "PG-2"


def _by_aggregation(*extra: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize(
        "loss_agg",
        [
            pytest.param(
                agg,
                marks=[pytest.mark.clause(_agg_clause(agg), *extra), pytest.mark.needs(f"loss_agg:{agg}")],
            )
            for agg in cs.LOSS_AGGREGATIONS
        ],
    )


def _agg_kwargs(batch: cs.AggregationBatch, **overrides: Any) -> dict[str, Any]:
    return batch_kwargs(batch, ("per_token", "mask", "loss_agg"), ("norm_constant",), **overrides)


def _scale(x: Tensor, mask: Tensor) -> float:
    values = x.detach().double()[mask != 0]
    values = values[torch.isfinite(values)]
    return max(1.0, float(values.abs().max()) if values.numel() else 1.0) * max(1, mask.shape[1])


@_by_aggregation()
@pytest.mark.ops("aggregate_loss")
@examples()
@given(data=st.data())
def test_aggregate_loss_matches_the_reference(ctx: Context, loss_agg: str, data: st.DataObject) -> None:
    batch = data.draw(cs.aggregation_batches(loss_aggs=(loss_agg,)), label="batch")
    actual, expected = call_both(ctx, "aggregate_loss", **_agg_kwargs(batch))
    assert_close(
        actual,
        expected,
        batch.per_token.dtype,
        f"aggregate_loss({loss_agg})",
        _scale(batch.per_token, batch.mask),
    )


@_by_aggregation("AGG-3")
@pytest.mark.ops("aggregate_loss")
@pytest.mark.needs("policy_option:counts")
@examples()
@given(data=st.data(), extra=st.integers(0, 7))
def test_aggregate_loss_with_whole_batch_counts_matches_the_reference(
    ctx: Context, loss_agg: str, data: st.DataObject, extra: int
) -> None:
    """token_count / row_count larger than this call's own (it is one micro-batch of more)."""
    batch = data.draw(cs.aggregation_batches(loss_aggs=(loss_agg,)), label="batch")
    counts = {k: max(v, 1) + extra for k, v in cs.whole_batch_counts(batch.mask, loss_agg).items()}
    actual, expected = call_both(ctx, "aggregate_loss", **_agg_kwargs(batch, **counts))
    what = f"aggregate_loss({loss_agg}, {counts})"
    assert_close(actual, expected, batch.per_token.dtype, what, _scale(batch.per_token, batch.mask))


@pytest.mark.clause("AGG-1")
@pytest.mark.ops("aggregate_loss")
@pytest.mark.needs("loss_agg:seq-mean-token-sum-norm")
@examples()
@given(
    batch=cs.aggregation_batches(loss_aggs=("seq-mean-token-sum-norm",)),
    columns=st.integers(1, 6),
    constant=st.floats(0.5, 100.0),
)
def test_norm_mode_divides_by_the_given_constant_never_the_padded_width(
    ctx: Context, batch: cs.AggregationBatch, columns: int, constant: float
) -> None:
    """Padding columns change nothing (verl #3741: C defaulted to this micro-batch's width), and the
    result scales as 1 / C."""
    base = as_tensor(call_impl(ctx, "aggregate_loss", **_agg_kwargs(batch)), "aggregate_loss").detach()
    wider = _agg_kwargs(
        batch,
        per_token=cs.append_padding(batch.per_token, columns),
        mask=cs.append_padding(batch.mask, columns),
    )
    padded = as_tensor(call_impl(ctx, "aggregate_loss", **wider), "aggregate_loss")
    scale = _scale(batch.per_token, batch.mask)
    assert_close(padded, base, batch.per_token.dtype, f"with {columns} padding columns", scale)
    assert batch.norm_constant is not None
    other = as_tensor(
        call_impl(ctx, "aggregate_loss", **_agg_kwargs(batch, norm_constant=constant)), "aggregate_loss"
    )
    assert_close(other * constant, base * batch.norm_constant, batch.per_token.dtype, "C * loss is constant",
                 scale * max(constant, batch.norm_constant))  # fmt: skip


# --- AGG-2: partition invariance on every aggregating op ------------------------------------------


def _value_clip(ctx: Context) -> bool | None:
    """The value losses the adapter computes (declared value_clip_modes): True clipped only, False
    unclipped only, None both (drawn)."""
    modes = ctx.conventions.value_clip_modes
    return None if len(modes) == 2 else "clipped" in modes


def _split_kwargs(
    op: str, data: st.DataObject, loss_agg: str, value_clip: bool | None = None
) -> tuple[dict[str, Any], str]:
    """Whole-batch keyword arguments of ``op`` for ``loss_agg``, and the input to differentiate
    (``value_clip``: as in :func:`_value_clip`)."""
    norm = (
        {"norm_constant": data.draw(cs.norm_constants(), label="C")}
        if loss_agg == "seq-mean-token-sum-norm"
        else {}
    )
    if op == "aggregate_loss":
        a = data.draw(cs.aggregation_batches(loss_aggs=(loss_agg,)), label="batch")
        return {**_agg_kwargs(a)}, "per_token"
    if op == "policy_loss":
        p = data.draw(cs.policy_batches(loss_aggs=("token-mean",)), label="batch")
        return {"logp": p.logp, "old_logp": p.old_logp, "advantages": p.advantages, "mask": p.mask,
                "clip_eps": p.clip_eps, "loss_agg": loss_agg, **norm}, "logp"  # fmt: skip
    if op == "value_loss":
        v = data.draw(cs.value_batches(clip=value_clip), label="batch")
        return {"values": v.values, "old_values": v.old_values, "returns": v.returns, "mask": v.mask,
                "clip_eps": v.clip_eps, "loss_agg": loss_agg, **norm}, "values"  # fmt: skip
    if op == "cispo_loss":
        c = data.draw(cs.cispo_batches(loss_aggs=(loss_agg,)), label="batch")
        bounds = {
            "clip_low": c.clip_low,
            "clip_high": max(c.clip_high, 1.0),
        }  # >= 1: a valid absolute cap too
        return {"logp": c.logp, "old_logp": c.old_logp, "advantages": c.advantages, "mask": c.mask,
                **bounds, "loss_agg": loss_agg, **norm}, "logp"  # fmt: skip
    k = data.draw(cs.kl_loss_batches(loss_aggs=(loss_agg,)), label="batch")
    return {"logp": k.logp, "ref_logp": k.ref_logp, "mask": k.mask, "estimator": k.estimator,
            "loss_agg": loss_agg, **norm}, "logp"  # fmt: skip


def _rows(value: Any, part: list[int]) -> Any:
    return (
        value[torch.tensor(part, dtype=torch.long)]
        if isinstance(value, Tensor) and value.dim() >= 1
        else value
    )


def _check_partition(
    ctx: Context, op: str, kwargs: dict[str, Any], wrt: str, counts: dict[str, int], parts: list[list[int]]
) -> None:
    """sum over parts of op(part, **counts) == op(whole), value and d / d wrt."""
    function: Callable[..., Any] = ctx.op(op)
    note_repro(ctx, op, **kwargs)
    mask = kwargs["mask"]
    leaf = kwargs[wrt].detach().clone().requires_grad_(True)
    whole = as_tensor(_loss(function(**{**kwargs, wrt: leaf}), op), op)
    whole_grad = grad_of(whole, leaf, f"{op} on the whole batch")
    split = leaf.detach().clone().requires_grad_(True)
    total: Tensor = torch.zeros((), dtype=torch.float64)
    for part in parts:
        sliced = {k: _rows(v, part) for k, v in kwargs.items()}
        sliced[wrt] = split[torch.tensor(part, dtype=torch.long)]
        total = total + as_tensor(_loss(function(**sliced, **counts), op), op)
    split_grad = (
        grad_of(total, split, f"{op} summed over micro-batches")
        if total.requires_grad
        else torch.zeros_like(split)
    )
    dtype = leaf.dtype
    scale = _scale(kwargs[wrt], mask) * 10
    what = f"{op}({kwargs.get('loss_agg', '')}) summed over micro-batches {parts} with {counts}"
    assert_close(total, whole.detach().double(), dtype, what, scale)
    keep = mask != 0
    assert_close(split_grad[keep], whole_grad[keep], dtype, f"gradient of {what}", scale)


def _loss(result: Any, op: str) -> Any:
    return result if op in ("aggregate_loss", "value_loss", "kl_loss") else statistic(result, "loss", op)


PARTITION_OPS = ("aggregate_loss", "policy_loss", "value_loss", "cispo_loss", "kl_loss")


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(op, marks=[pytest.mark.ops(op), pytest.mark.needs("policy_option:counts")])
        for op in PARTITION_OPS
    ],
)
@pytest.mark.parametrize(
    "loss_agg",
    [
        pytest.param(agg, marks=[pytest.mark.clause("AGG-2", "AGG-3"), pytest.mark.needs(f"loss_agg:{agg}")])
        for agg in cs.LOSS_AGGREGATIONS
    ],
)
@examples()
@given(data=st.data())
def test_micro_batches_with_whole_batch_counts_sum_to_the_whole_batch(
    ctx: Context, op: str, loss_agg: str, data: st.DataObject
) -> None:
    kwargs, wrt = _split_kwargs(op, data, loss_agg, _value_clip(ctx))
    assume(bool((kwargs["mask"] != 0).any()))
    parts = data.draw(cs.micro_batches(kwargs["mask"].shape[0]), label="micro-batches")
    _check_partition(ctx, op, kwargs, wrt, cs.whole_batch_counts(kwargs["mask"], loss_agg), parts)


@pytest.mark.clause("AGG-2", "AGG-3")
@pytest.mark.ops("gspo_loss")
@examples()
@given(batch=cs.gspo_batches(), data=st.data())
def test_gspo_micro_batches_with_the_whole_row_count_sum_to_the_whole_batch(
    ctx: Context, batch: cs.GSPOBatch, data: st.DataObject
) -> None:
    keep = batch.mask != 0
    assume(bool(keep.any()))
    kwargs = {"logp": batch.logp, "old_logp": batch.old_logp, "advantages": batch.advantages,
              "mask": batch.mask, "clip_eps": batch.clip_eps,
              "clip_eps_high": batch.clip_eps_high}  # fmt: skip
    parts = data.draw(cs.micro_batches(batch.mask.shape[0]), label="micro-batches")
    _check_partition(ctx, "gspo_loss", kwargs, "logp", {"row_count": int(keep.any(dim=1).sum())}, parts)


# --- AGG-3: the keywords on the existing loss ops -------------------------------------------------


@_by_aggregation("AGG-3")
@pytest.mark.ops("policy_loss")
@pytest.mark.needs("policy_option:counts")
@examples()
@given(data=st.data(), extra=st.integers(0, 5))
def test_policy_loss_with_counts_matches_the_reference(
    ctx: Context, loss_agg: str, data: st.DataObject, extra: int
) -> None:
    kwargs, _ = _split_kwargs("policy_loss", data, loss_agg)
    counts = {k: max(v, 1) + extra for k, v in cs.whole_batch_counts(kwargs["mask"], loss_agg).items()}
    actual, expected = call_both(ctx, "policy_loss", **kwargs, **counts)
    dtype = kwargs["logp"].dtype
    what = f"policy_loss({loss_agg}, {counts})"
    loss = statistic(actual, "loss", "policy_loss")
    assert_close(loss, expected.loss, dtype, what, scale=100.0 * kwargs["mask"].shape[1])


@_by_aggregation("AGG-3")
@pytest.mark.ops("value_loss")
@pytest.mark.needs("policy_option:counts")
@examples()
@given(data=st.data(), extra=st.integers(0, 5))
def test_value_loss_with_loss_agg_and_counts_matches_the_reference(
    ctx: Context, loss_agg: str, data: st.DataObject, extra: int
) -> None:
    kwargs, _ = _split_kwargs("value_loss", data, loss_agg, _value_clip(ctx))
    counts = {}
    if data.draw(st.booleans(), label="with counts"):
        counts = {k: max(v, 1) + extra for k, v in cs.whole_batch_counts(kwargs["mask"], loss_agg).items()}
    actual, expected = call_both(ctx, "value_loss", **kwargs, **counts)
    assert_close(actual, expected, kwargs["values"].dtype, f"value_loss({loss_agg}, {counts})",
                 scale=100.0 * kwargs["mask"].shape[1])  # fmt: skip
