"""CLIP-1..3, GSPO-1..3, CISPO-1..2: the clip options of policy_loss (DAPO's clip-higher, the dual
clip), GSPO's sequence ratio and CISPO's clipped weight, against the reference variant, with their
slopes and statistics checked on the implementation's own output."""

from __future__ import annotations

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
    sign_lost,
    statistic,
    tolerance,
)

F64 = torch.float64


def _band(dtype: torch.dtype) -> float:
    """Relative half-width around a threshold inside which rounding may decide either way."""
    return 1e-4 if computed_dtype(dtype) != F64 else 1e-9


def _ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    keep = mask != 0
    return torch.where(keep, logp.double() - old_logp.double(), torch.zeros((), dtype=F64)).exp()


def _fraction_close(actual: object, expected: Tensor, ambiguous: int, count: int, what: str) -> None:
    got = float(as_tensor(actual, what))
    slack = ambiguous / max(count, 1) + 1e-6
    assert abs(got - float(expected)) <= slack, (
        f"{what}: got {got}, expected {float(expected)} "
        f"({ambiguous} of {count} lie within rounding of a threshold)"
    )


def _token_weights(mask: Tensor, loss_agg: str, norm_constant: float | None = None) -> Tensor:
    """d aggregate(o) / d o_t for each token."""
    keep = (mask != 0).double()
    row_tokens = keep.sum(dim=1, keepdim=True)
    rows = max(int((row_tokens > 0).sum()), 1)
    if loss_agg == "token-mean":
        return keep / max(float(keep.sum()), 1.0)
    if loss_agg == "seq-mean-token-mean":
        return keep / row_tokens.clamp(min=1) / rows
    if loss_agg == "seq-mean-token-sum":
        return keep / rows
    assert norm_constant is not None
    return keep / (max(mask.shape[0], 1) * norm_constant)


# --- CLIP-1..3 ----------------------------------------------------------------------------------


def _option_marks(batch_options: str, clause: str | None) -> list[pytest.MarkDecorator]:
    needs = {"high": ("clip_eps_high",), "dual": ("dual_clip",), "both": ("clip_eps_high", "dual_clip")}
    clauses = {"high": ("CLIP-1",), "dual": ("CLIP-2",), "both": ("CLIP-1", "CLIP-2")}
    return [
        pytest.mark.clause(*((clause,) if clause else clauses[batch_options])),
        pytest.mark.needs(*(f"policy_option:{n}" for n in needs[batch_options])),
    ]


def _by_options(clause: str | None = None) -> pytest.MarkDecorator:
    """One parameter per option set; tagged CLIP-1 / CLIP-2 by the option, or ``clause``."""
    return pytest.mark.parametrize(
        "options", [pytest.param(o, marks=_option_marks(o, clause)) for o in ("high", "dual", "both")]
    )


def _draw_clip(ctx: Context, data: st.DataObject, options: str) -> cs.ClipBatch:
    aggs = [a for a in cs.COUNT_AGGREGATIONS if a in ctx.conventions.loss_aggregations]
    return data.draw(
        cs.clip_batches(loss_aggs=aggs, high=options in ("high", "both"), dual=options in ("dual", "both")),
        label="batch",
    )


def _clip_kwargs(batch: cs.ClipBatch, **overrides: Any) -> dict[str, Any]:
    names = ("logp", "old_logp", "advantages", "mask", "clip_eps", "loss_agg")
    return batch_kwargs(batch, names, ("clip_eps_high", "dual_clip"), **overrides)


def _clip_edges(ctx: Context, batch: cs.ClipBatch) -> list[float]:
    high = batch.clip_eps if batch.clip_eps_high is None else batch.clip_eps_high
    edges = [1 - batch.clip_eps, 1 + high]
    dual = batch.dual_clip if batch.dual_clip is not None else ctx.conventions.dual_clip
    if dual is not None:
        edges.append(dual)
    clamp = ctx.conventions.log_ratio_clamp
    if clamp is not None:
        edges += [math.exp(clamp), math.exp(-clamp)]
    return edges


def _near(ratio: Tensor, mask: Tensor, edges: list[float], dtype: torch.dtype) -> Tensor:
    near = torch.zeros_like(ratio, dtype=torch.bool)
    for edge in edges:
        near |= (ratio - edge).abs() <= _band(dtype) * 10 * edge
    return near & (mask != 0)


@_by_options()
@pytest.mark.ops("policy_loss")
@examples()
@given(data=st.data())
def test_clip_options_match_the_reference(ctx: Context, options: str, data: st.DataObject) -> None:
    batch = _draw_clip(ctx, data, options)
    actual, expected = call_both(ctx, "policy_loss", **_clip_kwargs(batch))
    assert_close(statistic(actual, "loss", "policy_loss"), expected.loss, batch.logp.dtype,
                 f"loss (clip_eps_high={batch.clip_eps_high}, dual_clip={batch.dual_clip}, {batch.loss_agg})",
                 scale=20.0 * 5.0)  # fmt: skip


@_by_options()
@pytest.mark.ops("policy_loss")
@examples()
@given(data=st.data())
def test_clip_slopes_are_ratio_times_advantage_off_the_flat_branches(
    ctx: Context, options: str, data: st.DataObject
) -> None:
    """d loss / d logp_t = -w_t ratio_t A_t, and 0 on the flat branches: A > 0 beyond 1 + eps_high,
    A < 0 below 1 - eps, A < 0 beyond the dual bound c (there the objective is c A, flat in logp)."""
    batch = _draw_clip(ctx, data, options)
    note_repro(ctx, "policy_loss", **_clip_kwargs(batch))
    logp = batch.logp.detach().clone().requires_grad_(True)
    result = ctx.op("policy_loss")(**_clip_kwargs(batch, logp=logp))
    grad = grad_of(statistic(result, "loss", "policy_loss"), logp, "policy loss").double()
    keep = batch.mask != 0
    clamp = ctx.conventions.log_ratio_clamp
    raw = torch.where(keep, batch.logp.double() - batch.old_logp.double(), torch.zeros((), dtype=F64))
    ratio = (raw if clamp is None else raw.clamp(-clamp, clamp)).exp()
    adv = torch.where(keep, batch.advantages.double(), torch.zeros((), dtype=F64))
    high = batch.clip_eps if batch.clip_eps_high is None else batch.clip_eps_high
    flat = ((adv > 0) & (ratio > 1 + high)) | ((adv < 0) & (ratio < 1 - batch.clip_eps))
    dual = batch.dual_clip if batch.dual_clip is not None else ctx.conventions.dual_clip
    if dual is not None:
        flat |= (adv < 0) & (ratio > dual)
    if clamp is not None:
        flat |= raw.abs() > clamp
    slope = torch.where(flat | ~keep, torch.zeros((), dtype=F64), ratio * adv)
    expected = -_token_weights(batch.mask, batch.loss_agg) * slope
    compare = keep & ~_near(ratio, batch.mask, _clip_edges(ctx, batch), batch.logp.dtype)
    assert bool(torch.isfinite(grad).all()), f"non-finite gradient: {grad}"
    assert_close(
        grad[compare], expected[compare], batch.logp.dtype, "d loss / d logp off the kinks", scale=100.0
    )


@pytest.mark.clause("CLIP-2")
@pytest.mark.ops("policy_loss")
@pytest.mark.needs("policy_option:dual_clip")
@examples()
@given(data=st.data())
def test_dual_clip_never_applies_to_non_negative_advantages(ctx: Context, data: st.DataObject) -> None:
    """With every advantage >= 0 the dual clip changes neither the loss nor its gradient, and its
    statistic is 0 (tianshou #433 applied it to positive advantages)."""
    batch = _draw_clip(ctx, data, "dual")
    positive = batch.advantages.abs()
    results, grads = [], []
    for dual in (batch.dual_clip, None):
        kwargs = _clip_kwargs(batch, advantages=positive)
        if dual is None:
            kwargs.pop("dual_clip")
        note_repro(ctx, "policy_loss", **kwargs)
        logp = batch.logp.detach().clone().requires_grad_(True)
        result = ctx.op("policy_loss")(**{**kwargs, "logp": logp})
        results.append(result)
        grads.append(grad_of(statistic(result, "loss", "policy_loss"), logp, "policy loss"))
    dtype = batch.logp.dtype
    loss = statistic(results[0], "loss", "policy_loss")
    assert_close(loss, as_tensor(statistic(results[1], "loss", "policy_loss"), "loss").detach(), dtype,
                 "loss with vs without the dual clip, A >= 0", scale=100.0)  # fmt: skip
    keep = batch.mask != 0
    assert_close(
        grads[0][keep], grads[1][keep], dtype, "gradient with vs without the dual clip, A >= 0", 100.0
    )
    share = getattr(results[0], "dual_clip_frac", None)
    if share is not None:
        assert float(as_tensor(share, "dual_clip_frac")) == 0.0, f"dual_clip_frac with A >= 0: {share}"


@_by_options("CLIP-3")
@pytest.mark.ops("policy_loss")
@examples()
@given(data=st.data())
def test_clip_statistics_match_the_reference(ctx: Context, options: str, data: st.DataObject) -> None:
    """CLIP-3: clipfrac (flat branch of the single clip, asymmetric bounds), ratio_outside_frac
    (outside [1 - eps, 1 + eps_high]) and dual_clip_frac where reported."""
    batch = _draw_clip(ctx, data, options)
    actual, expected = call_both(ctx, "policy_loss", **_clip_kwargs(batch))
    tokens = int((batch.mask != 0).sum())
    ratio = _ratio(batch.logp, batch.old_logp, batch.mask)
    near = _near(ratio, batch.mask, _clip_edges(ctx, batch), batch.logp.dtype)
    # an advantage that rounds to 0 in the computed precision (compute_dtype) has no flat branch
    ambiguous = int((near | sign_lost(batch.advantages, batch.mask, batch.logp.dtype)).sum())
    checked = 0
    for name in ("clipfrac", "ratio_outside_frac", "dual_clip_frac"):
        value, want = getattr(actual, name, None), getattr(expected, name, None)
        if value is None or want is None:
            continue
        if name == "clipfrac" and "clipfrac" in ctx.conventions.unmasked_statistics:
            continue
        _fraction_close(value, want, ambiguous, tokens, name)
        checked += 1
    if checked == 0:
        pytest.skip("not provided: the policy_loss result reports none of the clip statistics")


# --- GSPO-1..3 ----------------------------------------------------------------------------------


def _gspo_kwargs(batch: cs.GSPOBatch, **overrides: Any) -> dict[str, Any]:
    names = ("logp", "old_logp", "advantages", "mask", "clip_eps")
    return batch_kwargs(batch, names, ("clip_eps_high",), **overrides)


def _sequence_ratios(batch: cs.GSPOBatch) -> tuple[Tensor, Tensor, Tensor]:
    """(s, n, nonempty): the sequence ratios exp(mean log-ratio) in float64, tokens per row."""
    keep = batch.mask != 0
    log_ratio = torch.where(keep, batch.logp.double() - batch.old_logp.double(), torch.zeros((), dtype=F64))
    n = keep.sum(dim=1)
    return (log_ratio.sum(dim=1) / n.clamp(min=1)).exp(), n, n > 0


def _gspo_near(batch: cs.GSPOBatch, s: Tensor) -> Tensor:
    high = batch.clip_eps if batch.clip_eps_high is None else batch.clip_eps_high
    band = _band(batch.logp.dtype) * 10 * max(1, batch.logp.shape[1])
    return ((s - (1 - batch.clip_eps)).abs() <= band) | ((s - (1 + high)).abs() <= band)


@pytest.mark.clause("GSPO-1")
@pytest.mark.ops("gspo_loss")
@examples()
@given(batch=cs.gspo_batches())
def test_gspo_loss_matches_the_reference(ctx: Context, batch: cs.GSPOBatch) -> None:
    actual, expected = call_both(ctx, "gspo_loss", **_gspo_kwargs(batch))
    assert_close(
        statistic(actual, "loss", "gspo_loss"), expected.loss, batch.logp.dtype, "gspo loss", scale=20.0
    )


@pytest.mark.clause("GSPO-1")
@pytest.mark.ops("gspo_loss")
@examples()
@given(batch=cs.gspo_batches(empty_rows=False), copies=st.integers(2, 3))
def test_gspo_ratio_is_a_geometric_mean_so_repeating_a_row_changes_nothing(
    ctx: Context, batch: cs.GSPOBatch, copies: int
) -> None:
    """Repeating every row's tokens k times keeps each s_i (a sum of log-ratios would grow k-fold)."""
    base = statistic(call_impl(ctx, "gspo_loss", **_gspo_kwargs(batch)), "loss", "gspo_loss")
    tiled = {k: batch_value.repeat(1, copies) for k, batch_value in
             (("logp", batch.logp), ("old_logp", batch.old_logp), ("mask", batch.mask))}  # fmt: skip
    repeated = statistic(call_impl(ctx, "gspo_loss", **_gspo_kwargs(batch, **tiled)), "loss", "gspo_loss")
    s, _, _ = _sequence_ratios(batch)
    assume(not bool(_gspo_near(batch, s).any()))
    want = as_tensor(base, "loss").detach().double()
    assert_close(
        repeated, want, torch.float32, f"gspo loss with every row repeated {copies} times", scale=20.0
    )


@pytest.mark.clause("GSPO-2")
@pytest.mark.ops("gspo_loss")
@examples()
@given(batch=cs.gspo_batches())
def test_gspo_gradient_is_the_seq_mean_of_the_gspo_token_form(ctx: Context, batch: cs.GSPOBatch) -> None:
    """d loss / d logp_t = -s_i A_i / (n_i R) on the unclipped branch, 0 on the flat one: the
    GSPO-token form aggregated with seq-mean-token-mean (not token-mean, TRL #3823)."""
    note_repro(ctx, "gspo_loss", **_gspo_kwargs(batch))
    logp = batch.logp.detach().clone().requires_grad_(True)
    result = ctx.op("gspo_loss")(**_gspo_kwargs(batch, logp=logp))
    grad = grad_of(statistic(result, "loss", "gspo_loss"), logp, "gspo loss").double()
    s, n, nonempty = _sequence_ratios(batch)
    adv = batch.advantages.double()
    high = batch.clip_eps if batch.clip_eps_high is None else batch.clip_eps_high
    flat = ((adv > 0) & (s > 1 + high)) | ((adv < 0) & (s < 1 - batch.clip_eps))
    rows = max(int(nonempty.sum()), 1)
    per_row = torch.where(flat, torch.zeros((), dtype=F64), -s * adv / (n.clamp(min=1) * rows))
    keep = batch.mask != 0
    expected = torch.where(keep, per_row.unsqueeze(1).expand_as(grad), torch.zeros((), dtype=F64))
    compare = keep & ~_gspo_near(batch, s).unsqueeze(1)
    assert bool(torch.isfinite(grad).all()), f"non-finite gradient: {grad}"
    assert_close(grad[compare], expected[compare], batch.logp.dtype, "d gspo loss / d logp", scale=20.0)
    assert bool((grad[~keep] == 0).all()), "gradient off the mask"


@pytest.mark.clause("GSPO-3")
@pytest.mark.ops("gspo_loss")
@examples()
@given(batch=cs.gspo_batches())
def test_gspo_statistics_are_over_sequences(ctx: Context, batch: cs.GSPOBatch) -> None:
    """clipfrac: share of sequences (rows with an action token) on the flat branch; ratio_mean and
    ratio_max (where reported) of the sequence ratios."""
    actual, expected = call_both(ctx, "gspo_loss", **_gspo_kwargs(batch))
    s, _, nonempty = _sequence_ratios(batch)
    ambiguous = int((_gspo_near(batch, s) & nonempty).sum())
    value = statistic(actual, "clipfrac", "gspo_loss")
    if value is None:
        pytest.skip("not provided: the gspo_loss result reports no clipfrac")
    _fraction_close(value, expected.clipfrac, ambiguous, int(nonempty.sum()), "gspo clipfrac")
    for name in ("ratio_mean", "ratio_max"):
        got = getattr(actual, name, None)
        if got is not None:
            assert_close(got, getattr(expected, name), batch.logp.dtype, f"gspo {name}", scale=3.0)


# --- CISPO-1, CISPO-2 ---------------------------------------------------------------------------


def _cispo_kwargs(ctx: Context, batch: cs.CISPOBatch, **overrides: Any) -> dict[str, Any]:
    high = batch.clip_high
    if ctx.conventions.cispo_bounds == "absolute-cap":
        high = max(high, 1.0)  # an absolute cap below 1 is not a CISPO setting anyone uses
    names = ("logp", "old_logp", "advantages", "mask", "clip_low", "clip_high", "loss_agg")
    return batch_kwargs(batch, names, ("norm_constant",), **{"clip_high": high, **overrides})


def _cispo_bounds(ctx: Context, clip_low: float, clip_high: float) -> tuple[float, float]:
    """The weight's [low, high] under the declared parametrisation (CISPO-2)."""
    if ctx.conventions.cispo_bounds == "absolute-cap":
        return 0.0, clip_high
    return max(1.0 - clip_low, 0.0), 1.0 + clip_high


def _draw_cispo(ctx: Context, data: st.DataObject, loss_agg: str | None = None) -> cs.CISPOBatch:
    aggs = [a for a in cs.LOSS_AGGREGATIONS if a in ctx.conventions.loss_aggregations]
    if "counts" not in ctx.conventions.policy_loss_options:
        aggs = [a for a in aggs if a != "seq-mean-token-sum-norm"] or aggs
    return data.draw(cs.cispo_batches(loss_aggs=(loss_agg,) if loss_agg else aggs), label="batch")


@pytest.mark.clause("CISPO-1")
@pytest.mark.ops("cispo_loss")
@examples()
@given(data=st.data())
def test_cispo_loss_matches_the_reference(ctx: Context, data: st.DataObject) -> None:
    batch = _draw_cispo(ctx, data)
    kwargs = _cispo_kwargs(ctx, batch)
    actual, expected = call_both(ctx, "cispo_loss", **kwargs)
    scale = (1 + kwargs["clip_high"]) * 5 * 15 * batch.mask.shape[1]
    assert_close(statistic(actual, "loss", "cispo_loss"), expected.loss, batch.logp.dtype,
                 f"cispo loss ({batch.loss_agg}, {ctx.conventions.cispo_bounds})", scale=scale)  # fmt: skip


@pytest.mark.clause("CISPO-1", "CISPO-2")
@pytest.mark.ops("cispo_loss")
@examples()
@given(data=st.data())
def test_cispo_gradient_is_minus_weight_times_advantage_on_every_token(
    ctx: Context, data: st.DataObject
) -> None:
    """d loss / d logp_t = -w_t A_t (times the token's aggregation weight) on every action token,
    with w = clip(ratio) in the declared bounds held constant: clipped tokens keep their gradient."""
    batch = _draw_cispo(ctx, data)
    kwargs = _cispo_kwargs(ctx, batch)
    note_repro(ctx, "cispo_loss", **kwargs)
    logp = batch.logp.detach().clone().requires_grad_(True)
    result = ctx.op("cispo_loss")(**{**kwargs, "logp": logp})
    grad = grad_of(statistic(result, "loss", "cispo_loss"), logp, "cispo loss").double()
    low, high = _cispo_bounds(ctx, kwargs["clip_low"], kwargs["clip_high"])
    ratio = _ratio(batch.logp, batch.old_logp, batch.mask)
    keep = batch.mask != 0
    weight = ratio.clamp(min=low, max=high)
    adv = torch.where(keep, batch.advantages.double(), torch.zeros((), dtype=F64))
    expected = -weight * adv * _token_weights(batch.mask, batch.loss_agg, batch.norm_constant)
    near = _near(ratio, batch.mask, [b for b in (low, high) if b > 0], batch.logp.dtype)
    compare = keep & ~near
    assert bool(torch.isfinite(grad).all()), f"non-finite gradient: {grad}"
    assert_close(
        grad[compare], expected[compare], batch.logp.dtype, "d cispo loss / d logp", scale=(high + 1) * 5
    )
    assert bool((grad[~keep] == 0).all()), "gradient off the mask"


@pytest.mark.clause("CISPO-2")
@pytest.mark.ops("cispo_loss")
@examples()
@given(data=st.data(), ratio=st.sampled_from((0.05, 0.5, 0.9, 1.0, 1.1, 1.5, 3.0, 7.0)))
def test_cispo_weight_lies_in_the_declared_bounds(ctx: Context, data: st.DataObject, ratio: float) -> None:
    """One token, A = 1, token-mean: -gradient is the weight. Offsets (0.2, 0.28) give [0.8, 1.28]
    (skyrl-train 0.3.1's defaults 0 and 5 meant [1, 6]); a declared absolute cap min(ratio, cap)."""
    bounds = {"offsets": (0.2, 0.28), "absolute-cap": (0.2, 2.0)}[ctx.conventions.cispo_bounds]
    kwargs = {"old_logp": torch.tensor([[-1.0]], dtype=F64), "advantages": torch.ones(1, 1, dtype=F64),
              "mask": torch.ones(1, 1), "clip_low": bounds[0], "clip_high": bounds[1]}  # fmt: skip
    logp = torch.tensor([[-1.0 + math.log(ratio)]], dtype=F64, requires_grad=True)
    note_repro(ctx, "cispo_loss", logp=logp.detach(), **kwargs)
    result = ctx.op("cispo_loss")(logp=logp, **kwargs)
    weight = -float(grad_of(statistic(result, "loss", "cispo_loss"), logp, "cispo loss"))
    low, high = _cispo_bounds(ctx, *bounds)
    expected = min(max(ratio, low), high)
    assert weight == pytest.approx(expected, rel=max(1e-9, tolerance(F64)[0])), (
        f"ratio {ratio}: weight {weight}, bounds [{low}, {high}]"
    )
    want = -expected * math.log(math.exp(-1.0 + math.log(ratio)))
    assert float(as_tensor(statistic(result, "loss", "cispo_loss"), "loss").detach()) == pytest.approx(
        want, rel=max(1e-9, tolerance(F64)[0])
    )


@pytest.mark.clause("CISPO-1")
@pytest.mark.ops("cispo_loss")
@examples()
@given(data=st.data())
def test_cispo_clipfrac_matches_the_reference(ctx: Context, data: st.DataObject) -> None:
    batch = _draw_cispo(ctx, data)
    kwargs = _cispo_kwargs(ctx, batch)
    actual, expected = call_both(ctx, "cispo_loss", **kwargs)
    value = statistic(actual, "clipfrac", "cispo_loss")
    if value is None:
        pytest.skip("not provided: the cispo_loss result reports no clipfrac")
    low, high = _cispo_bounds(ctx, kwargs["clip_low"], kwargs["clip_high"])
    ratio = _ratio(batch.logp, batch.old_logp, batch.mask)
    ambiguous = int(_near(ratio, batch.mask, [b for b in (low, high) if b > 0], batch.logp.dtype).sum())
    _fraction_close(value, expected.clipfrac, ambiguous, int((batch.mask != 0).sum()), "cispo clipfrac")


def test_reference_helpers_agree() -> None:
    """The helper's aggregation weights are those of ppo_ref.aggregate_loss (guards this module)."""
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 1]])
    x = torch.arange(9, dtype=F64).reshape(3, 3).requires_grad_(True)
    for agg in cs.LOSS_AGGREGATIONS:
        norm: dict[str, Any] = {"norm_constant": 4.0} if agg == "seq-mean-token-sum-norm" else {}
        (grad,) = torch.autograd.grad(ppo_ref.aggregate_loss(x, mask, agg, **norm), x)
        torch.testing.assert_close(grad, _token_weights(mask, agg, norm.get("norm_constant")))
