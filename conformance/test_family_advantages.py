"""GRP-1..4: group advantages (GRPO, Dr. GRPO, RLOO) against the reference variant, and the
identities of the clauses checked on the implementation's own output: within-group sums vanish,
constant groups give exactly 0, rloo = n/(n-1) dr_grpo, grpo's invariance to a r + b, dr_grpo's and
rloo's scale equivariance, permutation equivariance."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch import Tensor

from ppo_ref.adapters.conventions import constant_group_bound, singleton_rows

from . import strategies as cs
from .support import Context, as_tensor, assert_close, call_both, call_impl, examples

pytestmark = pytest.mark.ops("group_advantages")


def _by_method(*clauses: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize(
        "method",
        [
            pytest.param(m, marks=[pytest.mark.clause(*clauses), pytest.mark.needs(f"group_method:{m}")])
            for m in cs.GROUP_METHODS
        ],
    )


def _batch(ctx: Context, data: st.DataObject, method: str, **options: Any) -> cs.GroupBatch:
    scopes = [s for s in cs.STD_SCOPES if s in ctx.conventions.group_std_scopes] or ["group"]
    return data.draw(cs.group_batches(methods=(method,), scopes=scopes, **options), label="batch")


def _kwargs(batch: cs.GroupBatch, **overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"scores": batch.scores, "group_ids": batch.group_ids, "method": batch.method}
    if batch.method == "grpo":
        kwargs.update(std_scope=batch.std_scope, eps=batch.eps)
    return {**kwargs, **overrides}


def _eps(ctx: Context, batch: cs.GroupBatch) -> float:
    declared = ctx.conventions.group_std_eps
    return batch.eps if declared is None else declared


def _amplification(ctx: Context, batch: cs.GroupBatch) -> float:
    """max |r| / (std + eps): how much grpo's division amplifies the rounding of a group mean."""
    scores = batch.scores.double()
    if batch.method != "grpo" or batch.std_scope == "none":
        return max(1.0, float(scores.abs().max()) if scores.numel() else 1.0)
    stds = []
    for gid in torch.unique(batch.group_ids):
        group = scores[batch.group_ids == gid]
        if group.numel() > 1 and float(group.max() - group.min()) > 0:
            stds.append(float(group.std()) if batch.std_scope == "group" else float(scores.std()))
    if not stds:
        return 1.0
    return max(1.0, float(scores.abs().max()) / (min(stds) + _eps(ctx, batch)))


def _out(ctx: Context, batch: cs.GroupBatch, **overrides: Any) -> Tensor:
    return as_tensor(call_impl(ctx, "group_advantages", **_kwargs(batch, **overrides)), "group_advantages")


@_by_method("GRP-1", "GRP-2", "GRP-3")
@examples()
@given(data=st.data())
def test_group_advantages_match_the_reference(ctx: Context, method: str, data: st.DataObject) -> None:
    batch = _batch(ctx, data, method)
    actual, expected = call_both(ctx, "group_advantages", **_kwargs(batch))
    what = f"group_advantages({method}, std_scope={batch.std_scope})"
    assert_close(actual, expected, batch.scores.dtype, what, scale=_amplification(ctx, batch))


@_by_method("GRP-3", "GRP-4")
@examples()
@given(data=st.data())
def test_groups_sum_to_zero_and_constant_groups_give_exactly_zero(
    ctx: Context, method: str, data: st.DataObject
) -> None:
    """Within every group of two or more the advantages sum to 0; a group whose scores are all
    equal gets exactly 0 (also with eps = 0, where its 0/0 must not become NaN), or under a declared
    ``constant_groups='rounding'`` at most ``constant_group_bound`` (the rounding of its mean)."""
    batch = _batch(ctx, data, method)
    eps_zero = method == "grpo" and data.draw(st.booleans(), label="eps = 0")
    out = _out(ctx, batch, **({"eps": 0.0} if eps_zero else {})).detach().double()
    alone = singleton_rows(batch.group_ids)
    rtol, _ = (1e-5, 0) if batch.scores.dtype == torch.float32 else (1e-7, 0)
    for gid in torch.unique(batch.group_ids):
        rows = (batch.group_ids == gid) & ~alone
        if not bool(rows.any()):
            continue
        group = batch.scores[rows]
        if bool((group == group[0]).all()):
            # exact 0 (the reference), or 0 up to the mean's rounding (declared constant_groups)
            bound = 0.0
            if ctx.conventions.constant_groups == "rounding":
                # grpo divides the mean's rounding by std + eps (the std of a constant group is
                # rounding too): with eps > 0 that amplifies it by up to 1 / eps
                declared = ctx.conventions.group_std_eps
                used = declared if declared is not None else (0.0 if eps_zero else batch.eps)
                divides = method == "grpo" and batch.std_scope != "none" and used > 0
                bound = constant_group_bound(group, int(rows.sum()), std_eps=used if divides else None)
            assert bool((out[rows].abs() <= bound).all()), (
                f"constant group {int(gid)}: advantages {out[rows].tolist()}"
                + (f" (declared constant_groups='rounding': |A| <= {bound:.3g})" if bound else "")
            )
        total = float(out[rows].sum())
        bound = rtol * 10 * max(1.0, float(out[rows].abs().sum()))
        assert abs(total) <= bound, f"group {int(gid)}: advantages {out[rows].tolist()} sum to {total}"


@_by_method("GRP-3")
@examples()
@given(data=st.data())
def test_a_group_of_one_gets_the_declared_singleton_value(
    ctx: Context, method: str, data: st.DataObject
) -> None:
    """A lone sample has no baseline: A = 0 (reference), or the declared group_singleton variant."""
    batch = _batch(ctx, data, method)
    alone = singleton_rows(batch.group_ids)
    assume(bool(alone.any()))
    actual, expected = call_both(ctx, "group_advantages", **_kwargs(batch))
    got = as_tensor(actual, "group_advantages")
    what = f"singletons ({ctx.conventions.group_singleton})"
    assert_close(got[alone], expected[alone], batch.scores.dtype, what, scale=_amplification(ctx, batch))


@pytest.mark.clause("GRP-4")
@pytest.mark.needs("group_method:rloo", "group_method:dr_grpo")
@examples()
@given(data=st.data())
def test_rloo_is_n_over_n_minus_one_times_dr_grpo(ctx: Context, data: st.DataObject) -> None:
    batch = data.draw(cs.group_batches(methods=("rloo",)), label="batch")
    rloo = _out(ctx, batch).detach().double()
    dr = _out(ctx, batch, method="dr_grpo").detach().double()
    _, inverse, counts = torch.unique(batch.group_ids, return_inverse=True, return_counts=True)
    n = counts[inverse].double()
    keep = n > 1  # singletons follow the declared group_singleton rule, checked above
    expected = dr * n / (n - 1).clamp(min=1)
    assert_close(rloo[keep], expected[keep], batch.scores.dtype, "rloo vs n/(n-1) * dr_grpo",
                 scale=_amplification(ctx, batch))  # fmt: skip


def _affine_bound(ctx: Context, batch: cs.GroupBatch, a: float) -> Tensor:
    """|A(a r + b; e) - A(r; e)| = |r - mean| |e/a - e| / ((std + e)(std + e/a)) per row (GRP-4)."""
    e = _eps(ctx, batch)
    scores = batch.scores.double()
    bound = torch.zeros_like(scores)
    for gid in torch.unique(batch.group_ids):
        rows = batch.group_ids == gid
        if int(rows.sum()) < 2:
            continue
        group = scores[rows]
        std = float(group.std()) if batch.std_scope == "group" else float(scores.std())
        if std + e / a == 0 or std + e == 0:
            continue
        bound[rows] = (group - group.mean()).abs() * abs(e / a - e) / ((std + e) * (std + e / a))
    return bound


@pytest.mark.clause("GRP-4")
@pytest.mark.needs("group_method:grpo")
@examples()
@given(data=st.data(), a=st.floats(0.25, 4.0), b=st.floats(-3.0, 3.0))
def test_grpo_is_invariant_to_a_positive_affine_map_up_to_eps(
    ctx: Context, data: st.DataObject, a: float, b: float
) -> None:
    """A(a r + b) = A(r) within the effect of eps (exactly computed per row), except std_scope
    'none', where A(a r + b) = a A(r)."""
    batch = _batch(ctx, data, "grpo", dtypes=(torch.float64,))
    moved = _out(ctx, batch, scores=batch.scores * a + b).detach().double()
    base = _out(ctx, batch).detach().double()
    alone = singleton_rows(batch.group_ids)
    if batch.std_scope == "none":
        assert_close(
            moved[~alone], a * base[~alone], torch.float32, "A(a r + b) vs a A(r)", scale=abs(b) + 10
        )
        return
    slack = _affine_bound(ctx, batch, a)[~alone] + 1e-5 * _amplification(ctx, batch) * (abs(a) + abs(b) + 1)
    diff = (moved[~alone] - base[~alone]).abs()
    assert bool((diff <= slack).all()), (
        f"A(a r + b) - A(r) = {(moved - base).tolist()}, allowed {slack.tolist()}"
    )


@pytest.mark.clause("GRP-4")
@pytest.mark.parametrize(
    "method", [pytest.param(m, marks=pytest.mark.needs(f"group_method:{m}")) for m in ("dr_grpo", "rloo")]
)
@examples()
@given(data=st.data(), a=st.floats(-4.0, 4.0), b=st.floats(-3.0, 3.0))
def test_dr_grpo_and_rloo_scale_with_the_scores_and_ignore_a_shift(
    ctx: Context, method: str, data: st.DataObject, a: float, b: float
) -> None:
    batch = data.draw(cs.group_batches(methods=(method,), dtypes=(torch.float64,)), label="batch")
    moved = _out(ctx, batch, scores=batch.scores * a + b).detach().double()
    base = _out(ctx, batch).detach().double()
    alone = singleton_rows(batch.group_ids)
    scale = (abs(b) + 5.0) * 10
    assert_close(
        moved[~alone], a * base[~alone], torch.float32, f"{method}(a r + b) vs a {method}(r)", scale=scale
    )


@_by_method("GRP-4")
@examples()
@given(data=st.data())
def test_permuting_rows_permutes_the_advantages(ctx: Context, method: str, data: st.DataObject) -> None:
    batch = _batch(ctx, data, method)
    order = torch.tensor(data.draw(st.permutations(range(batch.scores.shape[0])), label="order"))
    base = _out(ctx, batch).detach()
    moved = _out(ctx, batch, scores=batch.scores[order], group_ids=batch.group_ids[order])
    assert_close(moved, base[order], batch.scores.dtype, f"rows in order {order.tolist()}",
                 scale=_amplification(ctx, batch))  # fmt: skip
