"""Hypothesis properties of the PPO-family functions against their plain-loop oracles, and the
identities their clauses state (GRP-*, AGG-*, CLIP-*, GSPO-*, CISPO-*, KLL-*, IS-*, RPP-*).

Each test names its clauses with ``@pytest.mark.clause``; ``test_properties.py`` checks that every
clause of the spec has one. Tolerances are those of ``oracles.tolerance`` (1e-5 for float32
results, 1e-9 for float64), absolute ones scaled by the magnitude of the inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import oracles
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch import Tensor

import ppo_ref
from conformance import strategies as cs
from conformance.variant import ReferenceVariant
from ppo_ref.adapters import parse_conventions
from ppo_ref.adapters.conventions import singleton_rows


def _scale(*tensors: Tensor, mask: Tensor | None = None) -> float:
    """Largest finite magnitude among the (masked-in) entries: the scale of the rounding errors."""
    largest = 0.0
    for t in tensors:
        picked = t.detach().double() if mask is None else t.detach().double()[mask != 0]
        picked = picked[torch.isfinite(picked)]
        if picked.numel():
            largest = max(largest, float(picked.abs().max()))
    return largest


def _rows(x: Tensor, index: list[int]) -> Tensor:
    return x[torch.tensor(index, dtype=torch.long)]


# --- GRP-1..4 -------------------------------------------------------------------------------------


def _group_call(batch: cs.GroupBatch, scores: Tensor | None = None, **overrides: Any) -> Tensor:
    kwargs: dict[str, Any] = {"std_scope": batch.std_scope, "eps": batch.eps, **overrides}
    return ppo_ref.group_advantages(
        batch.scores if scores is None else scores, batch.group_ids, batch.method, **kwargs
    )


def _group_scale(batch: cs.GroupBatch) -> float:
    """Rounding of a mean of scores of magnitude m, divided by a std that may be tiny: the ratio."""
    scores = batch.scores.double()
    if batch.method != "grpo" or batch.std_scope == "none" or scores.numel() < 2:
        return max(1.0, _scale(scores))
    smallest = math.inf
    for gid in batch.group_ids.unique():
        group = scores[batch.group_ids == gid]
        if group.numel() > 1 and float(group.std()) > 0:
            smallest = min(
                smallest, float(group.std()) if batch.std_scope == "group" else float(scores.std())
            )
    return max(1.0, _scale(scores) / (smallest + batch.eps)) if math.isfinite(smallest) else 1.0


@pytest.mark.clause("GRP-1", "GRP-2", "GRP-3")
@given(cs.group_batches())
def test_group_advantages_match_oracle(batch: cs.GroupBatch) -> None:
    out = _group_call(batch)
    assert out.shape == batch.scores.shape and out.dtype == batch.scores.dtype
    want = oracles.group_advantages(batch.scores, batch.group_ids, batch.method, batch.std_scope, batch.eps)
    oracles.assert_close_to_oracle(out, want, batch.scores.dtype, scale=_group_scale(batch))


@pytest.mark.clause("GRP-3", "GRP-4")
@given(cs.group_batches())
def test_group_sums_vanish_and_constant_or_single_groups_give_exactly_zero(batch: cs.GroupBatch) -> None:
    out = _group_call(batch).double()
    alone = singleton_rows(batch.group_ids)
    for gid in batch.group_ids.unique():
        rows = batch.group_ids == gid
        group = batch.scores[rows]
        if bool(group.eq(group[0]).all()):
            assert bool((out[rows] == 0).all()), f"constant group {int(gid)} gave {out[rows].tolist()}"
        total = float(out[rows].sum())
        assert abs(total) <= 1e-5 * max(1.0, float(out[rows].abs().sum())) * rows.sum(), (gid, total)
    assert bool((out[alone] == 0).all()), f"singletons gave {out[alone].tolist()}"


@pytest.mark.clause("GRP-4")
@given(cs.group_batches(methods=("rloo",)))
def test_rloo_is_n_over_n_minus_one_times_dr_grpo(batch: cs.GroupBatch) -> None:
    rloo = _group_call(batch).double()
    dr = ppo_ref.group_advantages(batch.scores, batch.group_ids, "dr_grpo").double()
    _, inverse, counts = torch.unique(batch.group_ids, return_inverse=True, return_counts=True)
    n = counts[inverse].double()
    factor = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros((), dtype=torch.float64))
    oracles.assert_close_to_oracle(
        rloo, (factor * dr).tolist(), batch.scores.dtype, scale=_scale(batch.scores)
    )


@pytest.mark.clause("GRP-4")
@given(
    cs.group_batches(methods=("grpo",), dtypes=(torch.float64,)), st.floats(0.25, 4.0), st.floats(-3.0, 3.0)
)
def test_grpo_is_invariant_to_positive_affine_maps_up_to_eps(
    batch: cs.GroupBatch, a: float, b: float
) -> None:
    """A(a r + b; eps) = A(r; eps / a): (a (r - mean)) / (a std + eps) = (r - mean) / (std + eps / a)."""
    moved = _group_call(batch, scores=batch.scores * a + b)
    if batch.std_scope == "none":
        expected = a * _group_call(batch)
    else:
        expected = _group_call(batch, eps=batch.eps / a)
    oracles.assert_close_to_oracle(moved, expected.tolist(), torch.float32, scale=_group_scale(batch) * 10)


@pytest.mark.clause("GRP-4")
@given(
    cs.group_batches(methods=("dr_grpo", "rloo"), dtypes=(torch.float64,)),
    st.floats(-4.0, 4.0),
    st.floats(-3.0, 3.0),
)
def test_dr_grpo_and_rloo_are_scale_equivariant_and_shift_invariant(
    batch: cs.GroupBatch, a: float, b: float
) -> None:
    moved = _group_call(batch, scores=batch.scores * a + b)
    oracles.assert_close_to_oracle(
        moved, (a * _group_call(batch)).tolist(), torch.float32, scale=_scale(batch.scores) * 4
    )


@pytest.mark.clause("GRP-4")
@given(cs.group_batches(), st.data())
def test_permuting_rows_permutes_group_advantages(batch: cs.GroupBatch, data: st.DataObject) -> None:
    order = torch.tensor(data.draw(st.permutations(range(batch.scores.shape[0])), label="order"))
    out = _group_call(batch)
    moved = ppo_ref.group_advantages(
        batch.scores[order], batch.group_ids[order], batch.method, std_scope=batch.std_scope, eps=batch.eps
    )
    oracles.assert_close_to_oracle(moved, out[order].tolist(), batch.scores.dtype, scale=_group_scale(batch))


@pytest.mark.clause("GRP-3")
@given(cs.group_batches())
def test_singleton_variants_of_libraries(batch: cs.GroupBatch) -> None:
    """The declared ``group_singleton`` variants: raw-score reads a lone row's mean as 0 and its std
    as 1 (verl, skyrl), unguarded gives NaN where the formula divides by n - 1 (grpo's group std,
    rloo; OpenRLHF) and r - r = 0 elsewhere; other rows keep the reference value."""
    alone = singleton_rows(batch.group_ids)
    reference = _group_call(batch)
    kwargs = {"std_scope": batch.std_scope, "eps": batch.eps}
    raw = ReferenceVariant(parse_conventions({"group_singleton": "raw-score"}))
    nan = ReferenceVariant(parse_conventions({"group_singleton": "unguarded"}))
    got_raw = raw.group_advantages(batch.scores, batch.group_ids, batch.method, **kwargs)
    got_nan = nan.group_advantages(batch.scores, batch.group_ids, batch.method, **kwargs)
    assert torch.equal(got_raw[~alone], reference[~alone]) and torch.equal(got_nan[~alone], reference[~alone])
    divides = batch.method == "rloo" or (batch.method, batch.std_scope) == ("grpo", "group")
    assert bool(got_nan[alone].isnan().all()) if divides else torch.equal(got_nan[alone], reference[alone])
    if batch.method == "grpo" and batch.std_scope == "group":
        lone = batch.scores[alone].double() / (1 + batch.eps)
    elif batch.method == "grpo" and batch.std_scope == "batch":
        spread = float(batch.scores.double().std()) if batch.scores.numel() > 1 else 0.0
        lone = batch.scores[alone].double() / (spread + batch.eps) if spread + batch.eps > 0 else None
    else:
        lone = batch.scores[alone].double()
    if lone is not None:
        oracles.assert_close_to_oracle(
            got_raw[alone], lone.tolist(), batch.scores.dtype, scale=_group_scale(batch)
        )


# --- AGG-1..3 -----------------------------------------------------------------------------------


def _counts_at_least(data: st.DataObject, mask: Tensor, loss_agg: str) -> dict[str, int]:
    """Whole-batch counts of a batch this one is a part of: at least this call's own counts."""
    own = cs.whole_batch_counts(mask, loss_agg)
    if not data.draw(st.booleans(), label="with counts"):
        return {}
    return {k: max(v, 1) + data.draw(st.integers(0, 5), label=k) for k, v in own.items()}


@pytest.mark.clause("AGG-1", "AGG-3")
@given(cs.aggregation_batches(), st.data())
def test_aggregate_loss_matches_oracle(batch: cs.AggregationBatch, data: st.DataObject) -> None:
    counts = _counts_at_least(data, batch.mask, batch.loss_agg)
    out = ppo_ref.aggregate_loss(
        batch.per_token, batch.mask, batch.loss_agg, norm_constant=batch.norm_constant, **counts
    )
    want = oracles.aggregate(batch.per_token, batch.mask, batch.loss_agg, batch.norm_constant, **counts)
    scale = _scale(batch.per_token, mask=batch.mask) * batch.mask.shape[1]
    oracles.assert_close_to_oracle(out, want, batch.per_token.dtype, scale=scale)


@pytest.mark.clause("AGG-1")
@given(cs.aggregation_batches(loss_aggs=("seq-mean-token-sum-norm",)), st.integers(1, 5))
def test_norm_mode_never_reads_the_padded_width(batch: cs.AggregationBatch, columns: int) -> None:
    """C is the given constant: appending padding columns (a wider micro-batch) changes nothing."""
    out = ppo_ref.aggregate_loss(
        batch.per_token, batch.mask, batch.loss_agg, norm_constant=batch.norm_constant
    )
    wider = ppo_ref.aggregate_loss(
        cs.append_padding(batch.per_token, columns, math.nan),
        cs.append_padding(batch.mask, columns),
        batch.loss_agg,
        norm_constant=batch.norm_constant,
    )
    scale = _scale(batch.per_token, mask=batch.mask) * batch.mask.shape[1]
    oracles.assert_close_to_oracle(wider, float(out), batch.per_token.dtype, scale=scale)


def _loss_inputs(op: str, data: st.DataObject) -> tuple[dict[str, Any], str, str]:
    """Whole-batch keyword arguments of a loss op, the aggregation it uses and the differentiated input."""
    if op == "gspo_loss":
        g = data.draw(cs.gspo_batches(), label="batch")
        kwargs = {"logp": g.logp, "old_logp": g.old_logp, "advantages": g.advantages, "mask": g.mask,
                  "clip_eps": g.clip_eps, "clip_eps_high": g.clip_eps_high}  # fmt: skip
        return kwargs, "gspo", "logp"
    agg = cs.LOSS_AGGREGATIONS
    if op == "aggregate_loss":
        a = data.draw(cs.aggregation_batches(), label="batch")
        return {"per_token": a.per_token, "mask": a.mask, "loss_agg": a.loss_agg,
                "norm_constant": a.norm_constant}, a.loss_agg, "per_token"  # fmt: skip
    if op == "policy_loss":
        c = data.draw(cs.clip_batches(loss_aggs=agg), label="batch")
        kwargs = {"logp": c.logp, "old_logp": c.old_logp, "advantages": c.advantages, "mask": c.mask,
                  "clip_eps": c.clip_eps, "loss_agg": c.loss_agg, "clip_eps_high": c.clip_eps_high,
                  "dual_clip": c.dual_clip}  # fmt: skip
        if c.loss_agg == "seq-mean-token-sum-norm":
            kwargs["norm_constant"] = data.draw(cs.norm_constants(), label="C")
        return kwargs, c.loss_agg, "logp"
    if op == "value_loss":
        v = data.draw(cs.value_batches(), label="batch")
        loss_agg = data.draw(st.sampled_from(agg), label="loss_agg")
        kwargs = {"values": v.values, "old_values": v.old_values, "returns": v.returns, "mask": v.mask,
                  "clip_eps": v.clip_eps, "loss_agg": loss_agg}  # fmt: skip
        if loss_agg == "seq-mean-token-sum-norm":
            kwargs["norm_constant"] = data.draw(cs.norm_constants(), label="C")
        return kwargs, loss_agg, "values"
    if op == "cispo_loss":
        p = data.draw(cs.cispo_batches(), label="batch")
        return {"logp": p.logp, "old_logp": p.old_logp, "advantages": p.advantages, "mask": p.mask,
                "clip_low": p.clip_low, "clip_high": p.clip_high, "loss_agg": p.loss_agg,
                "norm_constant": p.norm_constant}, p.loss_agg, "logp"  # fmt: skip
    k = data.draw(cs.kl_loss_batches(), label="batch")
    return {"logp": k.logp, "ref_logp": k.ref_logp, "mask": k.mask, "estimator": k.estimator,
            "loss_agg": k.loss_agg, "norm_constant": k.norm_constant}, k.loss_agg, "logp"  # fmt: skip


def _loss_of(out: Any) -> Tensor:
    return out if isinstance(out, Tensor) else out.loss


PARTITION_OPS = ("aggregate_loss", "policy_loss", "value_loss", "cispo_loss", "kl_loss", "gspo_loss")


@pytest.mark.clause("AGG-2", "AGG-3")
@pytest.mark.parametrize("op", PARTITION_OPS)
@given(data=st.data())
def test_micro_batches_with_whole_batch_counts_sum_to_the_whole(op: str, data: st.DataObject) -> None:
    """Summing the calls over any split into micro-batches, each given the whole batch's counts,
    equals one call on the whole batch, in value and in gradient (verl #7321, TRL PR #6024)."""
    kwargs, loss_agg, wrt = _loss_inputs(op, data)
    mask = kwargs["mask"]
    assume(bool((mask != 0).any()))
    function: Callable[..., Any] = getattr(ppo_ref, op)
    counts = (
        {"row_count": int((mask != 0).any(dim=1).sum())}
        if loss_agg == "gspo"
        else cs.whole_batch_counts(mask, loss_agg)
    )
    parts = data.draw(cs.micro_batches(mask.shape[0]), label="micro-batches")
    leaf = kwargs[wrt].detach().clone().requires_grad_(True)
    whole = _loss_of(function(**{**kwargs, wrt: leaf}))
    (whole_grad,) = torch.autograd.grad(whole, leaf)
    total = torch.zeros((), dtype=whole.dtype)
    for part in parts:
        sliced = {
            k: _rows(v, part) if isinstance(v, Tensor) and v.dim() >= 1 else v for k, v in kwargs.items()
        }
        sliced[wrt] = _rows(leaf, part)
        total = total + _loss_of(function(**sliced, **counts))
    (split_grad,) = torch.autograd.grad(total, leaf) if total.requires_grad else (torch.zeros_like(leaf),)
    dtype = leaf.dtype
    scale = max(1.0, float(whole.detach().abs())) * mask.shape[1] * 10
    oracles.assert_close_to_oracle(total, float(whole.detach()), dtype, scale=scale)
    keep = mask != 0
    grad_scale = max(1.0, float(whole_grad.abs().max())) * 10
    oracles.assert_close_to_oracle(split_grad[keep], whole_grad[keep].tolist(), dtype, scale=grad_scale)
    assert bool((split_grad[~keep] == 0).all())


# --- CLIP-1..3 ----------------------------------------------------------------------------------


def _clip_call(batch: cs.ClipBatch, **overrides: Any) -> ppo_ref.PolicyLossResult:
    kwargs: dict[str, Any] = {"clip_eps_high": batch.clip_eps_high, "dual_clip": batch.dual_clip, **overrides}
    return ppo_ref.policy_loss(
        batch.logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_eps, batch.loss_agg, **kwargs
    )


@pytest.mark.clause("CLIP-1", "CLIP-2", "CLIP-3")
@given(cs.clip_batches())
def test_clip_options_match_oracle(batch: cs.ClipBatch) -> None:
    result = _clip_call(batch)
    dtype = batch.logp.dtype
    tie = 10 * oracles.tolerance(dtype)
    want = oracles.clipped_policy_loss(
        batch.logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_eps, batch.clip_eps_high,
        batch.dual_clip, batch.loss_agg, tie_tol=tie,
    )  # fmt: skip
    summed = batch.loss_agg == "seq-mean-token-sum"
    scale = want.max_abs_objective * (batch.logp.shape[1] if summed else 1)
    oracles.assert_close_to_oracle(result.loss, want.loss, dtype, scale=scale)
    slack = 1e-6
    for name, (low, high) in (
        ("clipfrac", want.clipfrac),
        ("dual_clip_frac", want.dual_clip_frac),
        ("ratio_outside_frac", want.outside),
    ):
        value = float(getattr(result, name))
        assert low - slack <= value <= high + slack, f"{name} = {value}, oracle bounds [{low}, {high}]"


@pytest.mark.clause("CLIP-1")
@given(cs.clip_batches(high=False))
def test_clip_eps_high_none_is_the_symmetric_range(batch: cs.ClipBatch) -> None:
    a, b = _clip_call(batch), _clip_call(batch, clip_eps_high=batch.clip_eps)
    for name in ("loss", "clipfrac", "ratio_outside_frac", "dual_clip_frac"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.clause("CLIP-2")
@given(cs.clip_batches(dual=True))
def test_dual_clip_never_touches_non_negative_advantages(batch: cs.ClipBatch) -> None:
    """With every advantage >= 0 the dual clip changes nothing (tianshou #433) and never binds."""
    positive = batch.advantages.abs()
    with_dual = _clip_call(batch, dual_clip=batch.dual_clip)
    plain = ppo_ref.policy_loss(
        batch.logp, batch.old_logp, positive, batch.mask, batch.clip_eps, batch.loss_agg,
        clip_eps_high=batch.clip_eps_high, dual_clip=batch.dual_clip,
    )  # fmt: skip
    without = ppo_ref.policy_loss(
        batch.logp, batch.old_logp, positive, batch.mask, batch.clip_eps, batch.loss_agg,
        clip_eps_high=batch.clip_eps_high,
    )  # fmt: skip
    assert torch.equal(plain.loss, without.loss) and float(plain.dual_clip_frac) == 0.0
    negatives = int(((batch.advantages < 0) & (batch.mask != 0)).sum())
    assert float(with_dual.dual_clip_frac) <= negatives / max(int((batch.mask != 0).sum()), 1) + 1e-6


@pytest.mark.clause("CLIP-2")
@given(cs.clip_batches(dual=True))
def test_dual_clip_only_lowers_the_loss_of_negative_advantages(batch: cs.ClipBatch) -> None:
    """max(o, cA) >= o: per token the dual-clipped objective is never below the single clip's."""
    single = oracles.clipped_policy_loss(
        batch.logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_eps, batch.clip_eps_high,
        None, batch.loss_agg, tie_tol=0.0,
    )  # fmt: skip
    dual = oracles.clipped_policy_loss(
        batch.logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_eps, batch.clip_eps_high,
        batch.dual_clip, batch.loss_agg, tie_tol=0.0,
    )  # fmt: skip
    adv = batch.advantages.tolist()
    for b, (row_single, row_dual) in enumerate(zip(single.objective, dual.objective, strict=True)):
        for t, (o1, o2) in enumerate(zip(row_single, row_dual, strict=True)):
            assert o2 >= o1 and (o2 == o1 or adv[b][t] < 0)
    assert float(_clip_call(batch).loss) <= float(_clip_call(batch, dual_clip=None).loss) + 1e-5 * max(
        1.0, single.max_abs_objective * batch.logp.shape[1]
    )


# --- GSPO-1..3 ----------------------------------------------------------------------------------


@pytest.mark.clause("GSPO-1", "GSPO-3")
@given(cs.gspo_batches())
def test_gspo_loss_matches_oracle(batch: cs.GSPOBatch) -> None:
    result = ppo_ref.gspo_loss(
        batch.logp,
        batch.old_logp,
        batch.advantages,
        batch.mask,
        batch.clip_eps,
        clip_eps_high=batch.clip_eps_high,
    )
    dtype = batch.logp.dtype
    want = oracles.gspo_loss(
        batch.logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_eps, batch.clip_eps_high,
        tie_tol=10 * oracles.tolerance(dtype) * max(1, batch.logp.shape[1]),
    )  # fmt: skip
    scale = max(want.ratio_max, 1.0) * 5.0 * batch.logp.shape[1]
    oracles.assert_close_to_oracle(result.loss, want.loss, dtype, scale=scale)
    oracles.assert_close_to_oracle(result.ratio_mean, want.ratio_mean, dtype, scale=scale)
    oracles.assert_close_to_oracle(result.ratio_max, want.ratio_max, dtype, scale=scale)
    low, high = want.clipfrac
    assert low - 1e-6 <= float(result.clipfrac) <= high + 1e-6


@pytest.mark.clause("GSPO-1")
@given(cs.gspo_batches(empty_rows=False), st.integers(2, 3))
def test_gspo_sequence_ratio_ignores_length(batch: cs.GSPOBatch, copies: int) -> None:
    """Repeating every row's tokens k times leaves each sequence ratio, hence the loss, unchanged."""

    def tiled(x: Tensor) -> Tensor:
        return x.repeat(1, copies)

    a = ppo_ref.gspo_loss(batch.logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_eps,
                          clip_eps_high=batch.clip_eps_high)  # fmt: skip
    b = ppo_ref.gspo_loss(tiled(batch.logp), tiled(batch.old_logp), batch.advantages, tiled(batch.mask),
                          batch.clip_eps, clip_eps_high=batch.clip_eps_high)  # fmt: skip
    tol = 1e-4 if batch.logp.dtype == torch.float32 else 1e-9
    assert abs(float(a.ratio_mean) - float(b.ratio_mean)) <= tol * max(1.0, float(a.ratio_max))
    assert abs(float(a.loss) - float(b.loss)) <= tol * 5 * max(1.0, float(a.ratio_max))


# --- CISPO-1, CISPO-2 ---------------------------------------------------------------------------


@pytest.mark.clause("CISPO-1")
@given(cs.cispo_batches())
def test_cispo_loss_and_gradient_match_oracle(batch: cs.CISPOBatch) -> None:
    logp = batch.logp.detach().clone().requires_grad_(True)
    result = ppo_ref.cispo_loss(
        logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_low, batch.clip_high, batch.loss_agg,
        norm_constant=batch.norm_constant,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(result.loss, logp)
    dtype = batch.logp.dtype
    want, want_grad = oracles.cispo_loss(
        batch.logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_low, batch.clip_high,
        batch.loss_agg, batch.norm_constant,
    )  # fmt: skip
    weight_max = 1.0 + batch.clip_high
    scale = weight_max * 5.0 * abs(cs.LOGP_MIN - cs.LOG_RATIO_MAX) * batch.logp.shape[1]
    oracles.assert_close_to_oracle(result.loss, want, dtype, scale=scale)
    oracles.assert_close_to_oracle(grad, want_grad, dtype, scale=weight_max * 5.0)


@pytest.mark.clause("CISPO-2")
@given(cs.cispo_batches(), st.floats(1.0, 6.0))
def test_cispo_parametrisations(batch: cs.CISPOBatch, cap: float) -> None:
    """TRL's absolute cap min(rho, cap) is the reference with offsets (1, cap - 1); skyrl-train
    0.3.1's defaults (0, 5) raise every weight below 1 to 1, so the gradient is -A w with w >= 1."""
    variant = ReferenceVariant(parse_conventions({"cispo_bounds": "absolute-cap"}))
    logp = batch.logp.detach().clone().requires_grad_(True)
    capped = variant.cispo_loss(logp, batch.old_logp, batch.advantages, batch.mask, 0.3, cap, "token-mean")
    (grad,) = torch.autograd.grad(capped.loss, logp)
    keep = batch.mask != 0
    ratio = torch.where(
        keep, batch.logp.double() - batch.old_logp.double(), torch.zeros((), dtype=torch.float64)
    ).exp()
    tokens = max(int(keep.sum()), 1)
    adv = torch.where(keep, batch.advantages.double(), torch.zeros((), dtype=torch.float64))
    expected = torch.where(keep, -ratio.clamp(max=cap) * adv / tokens, torch.zeros((), dtype=torch.float64))
    oracles.assert_close_to_oracle(grad, expected.tolist(), batch.logp.dtype, scale=cap * 5.0)
    logp = batch.logp.detach().clone().requires_grad_(True)
    skyrl = ppo_ref.cispo_loss(logp, batch.old_logp, batch.advantages, batch.mask, 0.0, 5.0, "token-mean")
    (grad,) = torch.autograd.grad(skyrl.loss, logp)
    weight = torch.where(
        adv != 0, -grad.double() * tokens / adv.where(adv != 0, torch.ones((), dtype=torch.float64)), 1.0
    )
    assert bool((weight[keep] >= 1 - 1e-4).all()) and bool((weight[keep] <= 6 + 1e-4).all())


# --- KLL-1, KLL-3 -------------------------------------------------------------------------------


@pytest.mark.clause("KLL-1", "KLL-3")
@given(cs.kl_loss_batches())
def test_kl_loss_value_and_gradient_match_oracle(batch: cs.KLLossBatch) -> None:
    logp = batch.logp.detach().clone().requires_grad_(True)
    loss = ppo_ref.kl_loss(logp, batch.ref_logp, batch.mask, batch.estimator, batch.loss_agg,
                           norm_constant=batch.norm_constant)  # fmt: skip
    (grad,) = torch.autograd.grad(loss, logp)
    want, want_grad = oracles.kl_loss(batch.logp, batch.ref_logp, batch.mask, batch.estimator, batch.loss_agg,
                                      batch.norm_constant)  # fmt: skip
    dtype = batch.logp.dtype
    scale = math.exp(2 * cs.LOG_RATIO_MAX) * batch.logp.shape[1]
    oracles.assert_close_to_oracle(loss, want, dtype, scale=scale)
    oracles.assert_close_to_oracle(grad, want_grad, dtype, scale=math.exp(cs.LOG_RATIO_MAX))
    assert bool((grad[batch.mask == 0] == 0).all())


# --- IS-1..3 ------------------------------------------------------------------------------------


def _correct(batch: cs.CorrectionBatch, **overrides: Any) -> Tensor:
    kwargs: dict[str, Any] = {"level": batch.level, "mode": batch.mode, "high": batch.high, "low": batch.low}
    kwargs.update(overrides)
    logp = kwargs.pop("logp", batch.logp)
    return ppo_ref.rollout_correction(logp, batch.rollout_logp, batch.mask, **kwargs)


def _near_bound(batch: cs.CorrectionBatch, dtype: torch.dtype) -> bool:
    """Whether some weight lies within rounding of high or low (mask mode may then go either way)."""
    w = torch.tensor(oracles.rollout_correction(batch.logp, batch.rollout_logp, batch.mask, batch.level,
                                                "truncate", math.inf, None), dtype=torch.float64)  # fmt: skip
    band = 1e-4 if dtype == torch.float32 else 1e-9
    bounds = [batch.high] + ([batch.low] if batch.low is not None else [])
    return any(bool(((w - bound).abs() <= band * bound * batch.mask.shape[1]).any()) for bound in bounds)


@pytest.mark.clause("IS-1", "IS-2")
@given(cs.correction_batches())
def test_rollout_correction_matches_oracle(batch: cs.CorrectionBatch) -> None:
    if batch.low is not None:
        assume(batch.low <= batch.high)
    dtype = batch.logp.dtype
    assume(batch.mode == "truncate" or not _near_bound(batch, dtype))
    out = _correct(batch)
    want = oracles.rollout_correction(batch.logp, batch.rollout_logp, batch.mask, batch.level, batch.mode,
                                      batch.high, batch.low)  # fmt: skip
    oracles.assert_close_to_oracle(out, want, dtype, scale=batch.high * batch.mask.shape[1])


@pytest.mark.clause("IS-3")
@given(cs.correction_batches())
def test_weights_are_one_where_the_log_probs_agree_detached_and_zero_off_the_mask(
    batch: cs.CorrectionBatch,
) -> None:
    if batch.low is not None:
        assume(batch.low <= batch.high)
    same = torch.where(batch.mask != 0, batch.rollout_logp, batch.logp)
    ones = _correct(batch, logp=same)
    keep = batch.mask != 0
    assert bool((ones[keep] == 1).all()) and bool((ones[~keep] == 0).all())
    logp = batch.logp.detach().clone().requires_grad_(True)
    out = _correct(batch, logp=logp)
    assert not out.requires_grad and out.grad_fn is None
    assert bool((out[~keep] == 0).all())


@pytest.mark.clause("IS-2")
@given(cs.correction_batches(levels=("sequence", "sequence-geometric"), modes=("mask",)))
def test_a_rejected_sequence_loses_every_token(batch: cs.CorrectionBatch) -> None:
    if batch.low is not None:
        assume(batch.low <= batch.high)
    out = _correct(batch)
    keep = batch.mask != 0
    for b in range(out.shape[0]):
        row = out[b][keep[b]]
        if row.numel():
            assert bool((row == 0).all()) or bool((row > 0).all()), f"row {b} partly rejected: {row.tolist()}"
            assert bool((row == row[0]).all()), f"row {b}: one weight per sequence, got {row.tolist()}"


@pytest.mark.clause("IS-2")
@given(
    cs.correction_batches(levels=("sequence",), empty_rows=False, dtypes=(torch.float64,)), st.integers(2, 4)
)
def test_product_ratio_grows_with_length_and_geometric_does_not(
    batch: cs.CorrectionBatch, copies: int
) -> None:
    """Repeating a row k times raises its product weight to the k-th power; the geometric mean stays."""

    def tiled(x: Tensor) -> Tensor:
        return x.repeat(1, copies)

    kwargs = {"mode": "truncate", "high": 1e300}
    product = ppo_ref.rollout_correction(
        batch.logp, batch.rollout_logp, batch.mask, level="sequence", **kwargs
    )
    long = ppo_ref.rollout_correction(tiled(batch.logp), tiled(batch.rollout_logp), tiled(batch.mask),
                                      level="sequence", **kwargs)  # fmt: skip
    keep = batch.mask != 0
    first = keep.long().argmax(dim=1)
    rows = torch.arange(keep.shape[0])
    w, w_long = product[rows, first].log(), long[rows, first].log()
    torch.testing.assert_close(w_long, copies * w, rtol=1e-9, atol=1e-9)
    geometric = ppo_ref.rollout_correction(batch.logp, batch.rollout_logp, batch.mask,
                                           level="sequence-geometric", **kwargs)  # fmt: skip
    geometric_long = ppo_ref.rollout_correction(
        tiled(batch.logp), tiled(batch.rollout_logp), tiled(batch.mask), level="sequence-geometric", **kwargs
    )
    torch.testing.assert_close(geometric_long[rows, first], geometric[rows, first], rtol=1e-9, atol=1e-9)


# --- RPP-1, RPP-2 -------------------------------------------------------------------------------


@pytest.mark.clause("RPP-1")
@given(cs.gae_batches(empty_rows=False, bootstrap=False, junk=False))
def test_reinforce_pp_returns_are_whitened_discounted_returns(batch: cs.GAEBatch) -> None:
    """gae with zero values and lam = 1 gives the discounted return over action tokens (holes
    carried through); masked_whiten over the batch then matches the oracle's pipeline."""
    keep = batch.mask != 0
    assume(int(keep.sum()) >= 2)
    zeros = torch.zeros_like(batch.rewards)
    raw, returns = ppo_ref.gae(batch.rewards, zeros, batch.mask, batch.gamma, 1.0)
    want = oracles.discounted_returns(batch.rewards, batch.mask, batch.gamma)
    dtype = batch.rewards.dtype
    scale = 5.0 * batch.rewards.shape[1]
    oracles.assert_close_to_oracle(raw, want, dtype, scale=scale)
    oracles.assert_close_to_oracle(returns, want, dtype, scale=scale)
    whitened = ppo_ref.masked_whiten(raw, batch.mask)
    expected = oracles.masked_whiten(torch.tensor(want, dtype=torch.float64), batch.mask)
    spread = math.sqrt(oracles.masked_var(torch.tensor(want, dtype=torch.float64), batch.mask) + 1e-8)
    oracles.assert_close_to_oracle(whitened, expected, dtype, scale=scale / spread)


@pytest.mark.clause("RPP-2")
@given(cs.group_batches(dtypes=(torch.float64,)), st.data())
def test_reinforce_pp_baseline_is_score_minus_group_mean_whitened(
    batch: cs.GroupBatch, data: st.DataObject
) -> None:
    rows = batch.scores.shape[0]
    steps = data.draw(st.integers(1, 6), label="steps")
    mask = data.draw(
        cs.masks((rows, steps), empty_rows=True, min_tokens=2 if rows * steps >= 2 else 1), label="mask"
    )
    keep = mask != 0
    assume(int(keep.sum()) >= 2)
    centred = ppo_ref.group_advantages(batch.scores, batch.group_ids, "dr_grpo")
    per_token = torch.where(
        keep, centred.unsqueeze(1).expand(rows, steps), torch.zeros((), dtype=centred.dtype)
    )
    want = oracles.group_baseline_advantages(batch.scores, batch.group_ids, mask)
    oracles.assert_close_to_oracle(per_token, want, batch.scores.dtype, scale=5.0)
    whitened = ppo_ref.masked_whiten(per_token, mask)
    expected = oracles.masked_whiten(torch.tensor(want, dtype=torch.float64), mask)
    spread = math.sqrt(oracles.masked_var(torch.tensor(want, dtype=torch.float64), mask) + 1e-8)
    oracles.assert_close_to_oracle(whitened, expected, batch.scores.dtype, scale=5.0 / spread)


@pytest.mark.clause("GSPO-3")
def test_gspo_clipfrac_over_tokens_weighs_each_clipped_sequence_by_its_tokens() -> None:
    """``gspo_clipfrac='tokens'`` (the GSPO paper's statistic; verl, OpenRLHF): the rows of the hand
    case GSPO-3/statistics have 2, 1 and 2 action tokens and the first two are clipped (s = e^0.4
    above 1.2 with A = 1; s = e^-0.4 below 0.8 with A = -1): 3 of 5 tokens, where the reference counts
    2 of 3 sequences; the loss is the reference's. With ``approx_kl='k1'`` declared, GSPO-3's
    approx_kl is PG-5's k1: mean(old - new) over the 5 tokens = -(0.3 + 0.5 - 0.4 + 0 + 0.2) / 5."""
    logp = torch.tensor([[0.3, 0.5], [-0.4, 0.0], [0.0, 0.2]], dtype=torch.float64)
    old_logp = torch.zeros_like(logp)
    advantages = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    reference = ppo_ref.gspo_loss(logp, old_logp, advantages, mask, 0.2)
    variant = ReferenceVariant(parse_conventions({"gspo_clipfrac": "tokens", "approx_kl": "k1"}))
    tokens = variant.gspo_loss(logp, old_logp, advantages, mask, 0.2)
    assert float(reference.clipfrac) == pytest.approx(2 / 3)
    assert float(tokens.clipfrac) == pytest.approx(3 / 5)
    assert float(tokens.loss) == float(reference.loss)
    assert tokens.approx_kl is not None and float(tokens.approx_kl) == pytest.approx(-0.6 / 5)
