"""PG-1..6: the clipped policy loss, its slopes, its aggregation modes and its statistics."""

from __future__ import annotations

import itertools
import math
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
    computed_dtype,
    examples,
    grad_of,
    note_repro,
    statistic,
)

pytestmark = pytest.mark.ops("policy_loss")

AGGREGATIONS = cs.COUNT_AGGREGATIONS


def _by_aggregation() -> pytest.MarkDecorator:
    """One parameter per loss_agg mode: token-mean checks PG-1 and PG-2, the others PG-2."""
    return pytest.mark.parametrize(
        "loss_agg",
        [
            pytest.param(
                agg,
                marks=[
                    pytest.mark.clause(*(("PG-1", "PG-2") if agg == "token-mean" else ("PG-2",))),
                    pytest.mark.needs(f"loss_agg:{agg}"),
                ],
            )
            for agg in AGGREGATIONS
        ],
    )


def _kwargs(batch: cs.PolicyBatch, **overrides: Any) -> dict[str, Any]:
    return batch_kwargs(
        batch, ("logp", "old_logp", "advantages", "mask", "clip_eps", "loss_agg"), **overrides
    )


def _supported(ctx: Context, data: st.DataObject) -> str:
    return data.draw(st.sampled_from([a for a in AGGREGATIONS if a in ctx.conventions.loss_aggregations]))


def _band(dtype: torch.dtype) -> float:
    """Half-width of the band around a kink or a threshold inside which float rounding may decide
    either way (relative to the ratio)."""
    return 1e-5 if computed_dtype(dtype) != torch.float64 else 1e-9


def _ratio(batch: cs.PolicyBatch, clamp: float | None) -> Tensor:
    keep = batch.mask != 0
    log_ratio = torch.where(
        keep, batch.logp.double() - batch.old_logp.double(), torch.zeros((), dtype=torch.float64)
    )
    return (log_ratio if clamp is None else log_ratio.clamp(-clamp, clamp)).exp()


def _near_thresholds(ctx: Context, batch: cs.PolicyBatch) -> Tensor:
    """Action tokens whose ratio lies within rounding of 1 +- eps (or of a declared dual clip c or
    log-ratio clamp): there the branch, the slope and the clip counts may go either way."""
    c = ctx.conventions
    ratio = _ratio(batch, c.log_ratio_clamp)
    band = _band(batch.logp.dtype) * 10
    edges = [1.0 + batch.clip_eps, 1.0 - batch.clip_eps]
    if c.dual_clip is not None:
        edges.append(c.dual_clip)
    if c.log_ratio_clamp is not None:
        edges += [math.exp(c.log_ratio_clamp), math.exp(-c.log_ratio_clamp)]
    near = torch.zeros_like(ratio, dtype=torch.bool)
    for edge in edges:
        near |= (ratio - edge).abs() <= band * edge
    if computed_dtype(batch.logp.dtype) == torch.float32:  # compute_dtype: A below float32's range is 0
        near |= batch.advantages.abs() < torch.finfo(torch.float32).tiny
    return near & (batch.mask != 0)


def _token_weights(mask: Tensor, loss_agg: str) -> Tensor:
    """d aggregate(o) / d o_t for each token (PG-2)."""
    keep = (mask != 0).double()
    row_tokens = keep.sum(dim=1, keepdim=True)
    rows = max(int((row_tokens > 0).sum()), 1)
    if loss_agg == "token-mean":
        return keep / max(float(keep.sum()), 1.0)
    if loss_agg == "seq-mean-token-mean":
        return keep / row_tokens.clamp(min=1) / rows
    return keep / rows


def _expected_slopes(ctx: Context, batch: cs.PolicyBatch) -> Tensor:
    """d o_t / d logp_t: ratio * A on the unclipped branch, 0 on the flat ones (PG-1), and 0 where a
    declared dual clip or log-ratio clamp binds."""
    c, eps = ctx.conventions, batch.clip_eps
    keep = batch.mask != 0
    adv = torch.where(keep, batch.advantages.double(), torch.zeros((), dtype=torch.float64))
    ratio = _ratio(batch, c.log_ratio_clamp)
    flat = ((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))
    if c.dual_clip is not None:
        flat |= (adv < 0) & (ratio > c.dual_clip)
    if c.log_ratio_clamp is not None:
        raw = torch.where(
            keep, batch.logp.double() - batch.old_logp.double(), torch.zeros((), dtype=torch.float64)
        )
        flat |= raw.abs() > c.log_ratio_clamp
    return torch.where(flat | ~keep, torch.zeros((), dtype=torch.float64), ratio * adv)


@_by_aggregation()
@examples()
@given(data=st.data())
def test_loss_matches_the_reference(ctx: Context, loss_agg: str, data: st.DataObject) -> None:
    batch = data.draw(cs.policy_batches(loss_aggs=(loss_agg,)), label="batch")
    actual, expected = call_both(ctx, "policy_loss", **_kwargs(batch))
    assert_close(
        statistic(actual, "loss", "policy_loss"), expected.loss, batch.logp.dtype, f"loss ({loss_agg})"
    )


@_by_aggregation()
@examples()
@given(data=st.data())
def test_loss_gradient_is_ratio_times_advantage_off_the_flat_branches(
    ctx: Context, loss_agg: str, data: st.DataObject
) -> None:
    """d loss / d logp_t = -w_t * ratio_t * A_t off the flat branches and 0 on them (w_t the
    aggregation weight of the token); 0 and finite off the mask. Tokens at a kink are not compared."""
    batch = data.draw(cs.policy_batches(loss_aggs=(loss_agg,)), label="batch")
    note_repro(ctx, "policy_loss", **_kwargs(batch))
    logp = batch.logp.detach().clone().requires_grad_(True)
    result = ctx.op("policy_loss")(**_kwargs(batch, logp=logp))
    grad = grad_of(statistic(result, "loss", "policy_loss"), logp, "policy loss").double()
    expected = -_token_weights(batch.mask, loss_agg) * _expected_slopes(ctx, batch)
    compare = ~_near_thresholds(ctx, batch)
    assert bool(torch.isfinite(grad).all()), f"non-finite gradient: {grad}"
    assert_close(
        grad[compare], expected[compare], batch.logp.dtype, f"d loss / d logp ({loss_agg}) off the kinks"
    )


def _fraction_close(actual: object, expected: Tensor, ambiguous: int, tokens: int, what: str) -> None:
    """A share of tokens, allowing the tokens within rounding of a threshold to count either way."""
    got = float(as_tensor(actual, what))
    slack = ambiguous / max(tokens, 1) + 1e-6
    assert abs(got - float(expected)) <= slack, (
        f"{what}: got {got}, expected {float(expected)} ({ambiguous} of {tokens} action tokens lie within "
        "rounding of a threshold and may count either way)"
    )


@pytest.mark.clause("PG-3")
@pytest.mark.needs("statistic:clipfrac")
@examples()
@given(data=st.data())
def test_clipfrac_matches_the_reference(ctx: Context, data: st.DataObject) -> None:
    batch = data.draw(cs.policy_batches(loss_aggs=(_supported(ctx, data),)), label="batch")
    actual, expected = call_both(ctx, "policy_loss", **_kwargs(batch))
    denominator = (
        batch.mask.numel()
        if "clipfrac" in ctx.conventions.unmasked_statistics
        else int((batch.mask != 0).sum())
    )
    ambiguous = int(_near_thresholds(ctx, batch).sum())
    _fraction_close(
        statistic(actual, "clipfrac", "policy_loss"),
        expected.clipfrac,
        ambiguous,
        denominator,
        f"clipfrac ({ctx.conventions.clipfrac})",
    )


@pytest.mark.clause("PG-4")
@examples()
@given(data=st.data())
def test_ratio_outside_frac_matches_the_reference(ctx: Context, data: st.DataObject) -> None:
    batch = data.draw(cs.policy_batches(loss_aggs=(_supported(ctx, data),)), label="batch")
    actual, expected = call_both(ctx, "policy_loss", **_kwargs(batch))
    if getattr(actual, "ratio_outside_frac", None) is None:
        pytest.skip(
            "not provided: the policy_loss result has no ratio_outside_frac (optional in the contract)"
        )
    ambiguous = int(_near_thresholds(ctx, batch).sum())
    _fraction_close(
        actual.ratio_outside_frac,
        expected.ratio_outside_frac,
        ambiguous,
        int((batch.mask != 0).sum()),
        "ratio_outside_frac",
    )


@pytest.mark.clause("PG-5")
@pytest.mark.needs("statistic:approx_kl")
@examples()
@given(data=st.data())
def test_approx_kl_matches_the_reference(ctx: Context, data: st.DataObject) -> None:
    batch = data.draw(cs.policy_batches(loss_aggs=(_supported(ctx, data),)), label="batch")
    actual, expected = call_both(ctx, "policy_loss", **_kwargs(batch))
    assert_close(
        statistic(actual, "approx_kl", "policy_loss"),
        expected.approx_kl,
        batch.logp.dtype,
        f"approx_kl ({ctx.conventions.approx_kl})",
    )


@pytest.mark.clause("PG-5")
@examples()
@given(data=st.data())
def test_ratio_statistics_match_the_reference(ctx: Context, data: st.DataObject) -> None:
    batch = data.draw(cs.policy_batches(loss_aggs=(_supported(ctx, data),)), label="batch")
    actual, expected = call_both(ctx, "policy_loss", **_kwargs(batch))
    present = [name for name in ("ratio_mean", "ratio_max") if getattr(actual, name, None) is not None]
    if not present:
        pytest.skip(
            "not provided: the policy_loss result has no ratio_mean or ratio_max (optional in the contract)"
        )
    for name in present:
        assert_close(getattr(actual, name), getattr(expected, name), batch.logp.dtype, name)


@pytest.mark.clause("PG-7")
@examples()
@given(batch=cs.policy_batches(loss_aggs=("token-mean",), empty_rows=True), data=st.data())
def test_step_zero_identity(ctx: Context, batch: cs.PolicyBatch, data: st.DataObject) -> None:
    """logp == old_logp on every action token: clipfrac 0, approx_kl 0, and the token-mean loss is
    -mean_m(A) with gradient -A/n (the other modes are compared with the reference instead)."""
    loss_agg = "token-mean" if "token-mean" in ctx.conventions.loss_aggregations else _supported(ctx, data)
    same = _kwargs(
        batch, old_logp=torch.where(batch.mask != 0, batch.logp, batch.old_logp), loss_agg=loss_agg
    )
    note_repro(ctx, "policy_loss", **same)
    logp = batch.logp.detach().clone().requires_grad_(True)
    result = ctx.op("policy_loss")(**{**same, "logp": logp})
    loss = statistic(result, "loss", "policy_loss")
    dtype = batch.logp.dtype
    if loss_agg == "token-mean":
        mean_advantage = ppo_ref.masked_mean(batch.advantages.double(), batch.mask)
        assert_close(loss, -mean_advantage, dtype, "step-0 loss = -masked mean of A")
        tokens = max(int((batch.mask != 0).sum()), 1)
        expected_grad = torch.where(
            batch.mask != 0, -batch.advantages.double() / tokens, torch.zeros((), dtype=torch.float64)
        )
        assert_close(grad_of(loss, logp, "policy loss"), expected_grad, dtype, "step-0 gradient = -A/n")
    else:
        assert_close(loss, ctx.variant.policy_loss(**same).loss, dtype, f"step-0 loss ({loss_agg})")
    for name in ("clipfrac", "approx_kl", "ratio_outside_frac"):
        value = getattr(result, name, None)
        if value is not None:
            assert abs(float(as_tensor(value, name))) <= 1e-6, f"step 0: {name} must be 0, got {value}"


@pytest.mark.clause("PG-6")
@examples()
@given(
    rows=st.integers(1, 4),
    steps=st.integers(0, 4),
    dtype=cs.float_dtypes(),
    data=st.data(),
)
def test_batch_without_action_tokens_gives_zero(
    ctx: Context, rows: int, steps: int, dtype: torch.dtype, data: st.DataObject
) -> None:
    """No action token (T = 0 included): loss 0 with a zero, finite gradient; statistics 0, not NaN.
    Every slot is masked out and holds what the declared ``masked_fill`` allows (junk under ``any``)."""
    junk = [data.draw(cs.masked_fills((rows, steps), dtype)) for _ in range(3)]
    mask = torch.zeros(rows, steps, dtype=torch.bool)
    kwargs = {
        "logp": junk[0],
        "old_logp": junk[1],
        "advantages": junk[2],
        "mask": mask,
        "clip_eps": 0.2,
        "loss_agg": _supported(ctx, data),
    }
    note_repro(ctx, "policy_loss", **kwargs)
    logp = junk[0].clone().requires_grad_(True)
    result = ctx.op("policy_loss")(**{**kwargs, "logp": logp})
    loss = as_tensor(statistic(result, "loss", "policy_loss"), "loss")
    assert float(loss.detach()) == 0.0, f"loss of a batch without action tokens: {loss}"
    if loss.requires_grad:
        grad = grad_of(loss, logp, "policy loss")
        assert bool((grad == 0).all()), f"gradient of a batch without action tokens: {grad}"
    for name in ("clipfrac", "approx_kl", "ratio_outside_frac", "ratio_mean", "ratio_max"):
        value = getattr(result, name, None)
        if value is not None:
            assert float(as_tensor(value, name)) == 0.0, f"{name} of a batch without action tokens: {value}"


@pytest.mark.clause("PG-2")
@pytest.mark.needs("loss_agg:token-mean")
@examples()
@given(batch=cs.policy_batches(loss_aggs=("token-mean",)), data=st.data())
def test_token_mean_of_chunks_recombined_by_token_counts_is_the_whole(
    ctx: Context, batch: cs.PolicyBatch, data: st.DataObject
) -> None:
    """Split the rows into chunks; sum(loss_i * n_i) / sum(n_i) over chunks equals the whole loss.

    Under a declared ``call_context`` (the library's engine always passes the whole batch's token
    count) each chunk is called with ``token_count`` = the whole batch's count, as the engine does,
    and the chunks' losses add up to the whole (AGG-2's identity)."""
    if ctx.conventions.call_context != "none":
        _chunks_with_the_engines_count(ctx, batch, data)
        return
    rows = batch.mask.shape[0]
    cuts = sorted(
        set(data.draw(st.lists(st.integers(1, max(rows - 1, 1)), max_size=3), label="cuts")) - {rows}
    )
    bounds = [0, *cuts, rows]
    whole = as_tensor(
        statistic(call_impl(ctx, "policy_loss", **_kwargs(batch)), "loss", "policy_loss"), "loss"
    )
    total, tokens = torch.zeros((), dtype=torch.float64), 0
    for start, stop in itertools.pairwise(bounds):
        chunk = {k: v[start:stop] if isinstance(v, Tensor) else v for k, v in _kwargs(batch).items()}
        count = int((chunk["mask"] != 0).sum())
        loss = as_tensor(statistic(call_impl(ctx, "policy_loss", **chunk), "loss", "policy_loss"), "loss")
        total, tokens = total + float(loss) * count, tokens + count
    recombined = total / max(tokens, 1)
    assert_close(whole, recombined, batch.logp.dtype, f"token-mean loss vs chunks {bounds} recombined")


def _chunks_with_the_engines_count(ctx: Context, batch: cs.PolicyBatch, data: st.DataObject) -> None:
    if "counts" not in ctx.conventions.policy_loss_options:
        pytest.skip(
            "not provided: the declared call_context passes the whole batch's token count, but the "
            "adapter declares no 'counts' in policy_loss_options"
        )
    rows = batch.mask.shape[0]
    cuts = sorted(
        set(data.draw(st.lists(st.integers(1, max(rows - 1, 1)), max_size=3), label="cuts")) - {rows}
    )
    bounds = [0, *cuts, rows]
    kwargs = _kwargs(batch)
    whole = as_tensor(statistic(call_impl(ctx, "policy_loss", **kwargs), "loss", "policy_loss"), "loss")
    tokens = int((batch.mask != 0).sum())
    total = torch.zeros((), dtype=torch.float64)
    for start, stop in itertools.pairwise(bounds):
        chunk = {k: v[start:stop] if isinstance(v, Tensor) else v for k, v in kwargs.items()}
        result = call_impl(ctx, "policy_loss", **chunk, token_count=tokens)
        total = total + float(as_tensor(statistic(result, "loss", "policy_loss"), "loss"))
    assert_close(
        whole, total, batch.logp.dtype, f"token-mean loss vs chunks {bounds} with token_count={tokens}"
    )


@pytest.mark.clause("PG-2")
@examples()
@given(data=st.data())
def test_permuting_rows_changes_no_loss_or_statistic(ctx: Context, data: st.DataObject) -> None:
    batch = data.draw(cs.policy_batches(loss_aggs=(_supported(ctx, data),)), label="batch")
    order = torch.tensor(data.draw(st.permutations(range(batch.mask.shape[0])), label="row order"))
    assume(order.numel() > 1)
    before = call_impl(ctx, "policy_loss", **_kwargs(batch))
    after = call_impl(
        ctx, "policy_loss", **{k: v[order] if isinstance(v, Tensor) else v for k, v in _kwargs(batch).items()}
    )
    for name in ("loss", "clipfrac", "approx_kl"):
        if getattr(before, name, None) is not None:
            want = as_tensor(getattr(before, name), name).detach()
            assert_close(
                getattr(after, name), want, batch.logp.dtype, f"{name} with rows in order {order.tolist()}"
            )
