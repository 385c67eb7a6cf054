"""ROB-1..4: robustness to garbage in the masked-out slots, whatever the adapter declares.

The value clauses (MASK, KL, RWD, GAE, PG, VF, ..., IN-1) are checked on inputs that obey the
adapter's declared input conventions (``masked_fill``: what its own pipeline puts into masked-out
slots). These properties write NaN, +-inf, +-1e6 and arbitrary floats there in every case, and
append masked-out columns of them: every output, statistic and gradient must equal the one computed
from the declared inputs, and stay finite. A library whose masked reductions multiply by the mask
(``x * mask``, ``0 * NaN = NaN``) is right on its own inputs and fails only here.

- ROB-1: masked statistics, KL estimates and token rewards;
- ROB-2: GAE (junk in the padding and in inserted holes);
- ROB-3: the policy, value and PPO-Penalty losses (and a batch without action tokens made of junk);
- ROB-4: the PPO-family losses and weights (aggregate_loss, kl_loss, gspo_loss, cispo_loss,
  rollout_correction).

The hand cases that put NaN or inf into masked-out slots are run here too, as they are
(``test_hand_cases.py``, clause ROB-n of their op).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from . import strategies as cs
from .support import Context, as_tensor, assert_close, call_impl, examples, grad_of, note_repro, statistic
from .test_family_correction import _kwargs as correction_kwargs
from .test_family_correction import declared_bounds
from .test_invariances import OPS, check_masked_out_entries

ROBUSTNESS_CLAUSES: dict[str, str] = {
    "masked_mean": "ROB-1",
    "masked_whiten": "ROB-1",
    "kl_penalty": "ROB-1",
    "token_rewards": "ROB-1",
    "gae": "ROB-2",
    "policy_loss": "ROB-3",
    "value_loss": "ROB-3",
    "ppo_penalty_loss": "ROB-3",
    "aggregate_loss": "ROB-4",
    "kl_loss": "ROB-4",
    "gspo_loss": "ROB-4",
    "cispo_loss": "ROB-4",
    "rollout_correction": "ROB-4",
}
"""The robustness clause of each op that takes a mask."""


def _param(op: str) -> Any:
    return pytest.param(op, marks=[pytest.mark.ops(op), pytest.mark.clause(ROBUSTNESS_CLAUSES[op])])


@pytest.mark.parametrize("op", [_param(op) for op in OPS])
@examples()
@given(data=st.data())
def test_junk_in_masked_out_slots_changes_nothing(ctx: Context, op: str, data: st.DataObject) -> None:
    """ROB-1..3: IN-1's check with junk (NaN, +-inf, any float) whatever ``masked_fill`` declares."""
    check_masked_out_entries(ctx, op, data, cs.junk_tensors)


@pytest.mark.clause("ROB-2")
@pytest.mark.ops("gae")
@pytest.mark.needs("mask_holes:gae")
@examples()
@given(batch=cs.gae_batches(bootstrap=False, junk=False), data=st.data())
def test_junk_in_inserted_holes_changes_no_advantage(
    ctx: Context, batch: cs.GAEBatch, data: st.DataObject
) -> None:
    """ROB-2: holes inserted inside the rows hold junk rewards and values; the advantages of the
    action tokens are those of the declared inputs without the holes."""
    if ctx.conventions.gae_whitening != "none" and int((batch.mask != 0).sum()) < 2:
        return
    positions = data.draw(cs.hole_positions(batch.mask.shape[1]), label="hole positions")
    rows = batch.mask.shape[0]
    junk = [data.draw(cs.junk_tensors((rows, len(positions)), batch.rewards.dtype)) for _ in range(2)]
    kwargs = {"rewards": batch.rewards, "values": batch.values, "mask": batch.mask, "gamma": batch.gamma}
    kwargs["lam"] = batch.lam
    holed = {
        **kwargs,
        "rewards": cs.insert_holes(batch.rewards, positions, junk[0]),
        "values": cs.insert_holes(batch.values, positions, junk[1]),
        "mask": cs.insert_holes(batch.mask, positions, 0),
    }
    before = as_tensor(call_impl(ctx, "gae", **kwargs)[0], "advantages")
    after = as_tensor(call_impl(ctx, "gae", **holed)[0], "advantages")
    kept = cs.insert_holes(torch.ones_like(batch.mask, dtype=torch.bool), positions, False)
    assert bool(torch.isfinite(after).all()) or not bool(torch.isfinite(before).all()), (
        f"advantages with junk in the holes at {positions} are not finite: {after}"
    )
    assert_close(after[:, kept[0]], before, batch.rewards.dtype, f"advantages with junk holes at {positions}")


@pytest.mark.clause("ROB-3")
@pytest.mark.ops("policy_loss")
@examples()
@given(rows=st.integers(1, 4), steps=st.integers(0, 4), dtype=cs.float_dtypes(), data=st.data())
def test_batch_of_junk_without_action_tokens_gives_zero(
    ctx: Context, rows: int, steps: int, dtype: torch.dtype, data: st.DataObject
) -> None:
    """ROB-3: every slot masked out and holding junk: loss 0 with a zero gradient, statistics 0."""
    modes = sorted(set(ctx.conventions.loss_aggregations) & set(cs.COUNT_AGGREGATIONS))
    junk = [data.draw(cs.junk_tensors((rows, steps), dtype)) for _ in range(3)]
    kwargs = {
        "logp": junk[0],
        "old_logp": junk[1],
        "advantages": junk[2],
        "mask": torch.zeros(rows, steps, dtype=torch.bool),
        "clip_eps": 0.2,
        "loss_agg": data.draw(st.sampled_from(modes), label="loss_agg"),
    }
    note_repro(ctx, "policy_loss", **kwargs)
    logp = junk[0].clone().requires_grad_(True)
    result = ctx.op("policy_loss")(**{**kwargs, "logp": logp})
    loss = as_tensor(statistic(result, "loss", "policy_loss"), "loss")
    assert float(loss.detach()) == 0.0, f"loss of a junk batch without action tokens: {loss}"
    if loss.requires_grad:
        grad = grad_of(loss, logp, "policy loss")
        assert bool((grad == 0).all()), f"gradient of a junk batch without action tokens: {grad}"
    for name in ("clipfrac", "approx_kl", "ratio_outside_frac", "ratio_mean", "ratio_max"):
        value = getattr(result, name, None)
        if value is not None:
            assert float(as_tensor(value, name)) == 0.0, (
                f"{name} of a junk batch without action tokens: {value}"
            )


# --- ROB-4: the PPO-family ops ---------------------------------------------------------------------


def _agg_modes(ctx: Context) -> list[str]:
    return sorted(set(ctx.conventions.loss_aggregations) & set(cs.LOSS_AGGREGATIONS))


def _with_norm(kwargs: dict[str, Any], norm_constant: float | None) -> dict[str, Any]:
    return kwargs if norm_constant is None else {**kwargs, "norm_constant": norm_constant}


def _family(ctx: Context, op: str, data: st.DataObject) -> tuple[dict[str, Any], tuple[str, ...], str | None]:
    """(declared inputs of ``op``, its per-token inputs, the input to differentiate or None)."""
    c = ctx.conventions
    if op == "aggregate_loss":
        a = data.draw(cs.aggregation_batches(loss_aggs=_agg_modes(ctx), junk=False), label="batch")
        kwargs = {"per_token": a.per_token, "mask": a.mask, "loss_agg": a.loss_agg}
        return _with_norm(kwargs, a.norm_constant), ("per_token",), "per_token"
    if op == "kl_loss":
        estimators = sorted(c.kl_loss_estimators)
        k = data.draw(cs.kl_loss_batches(estimators=estimators, loss_aggs=_agg_modes(ctx), junk=False))
        kwargs = {"logp": k.logp, "ref_logp": k.ref_logp, "mask": k.mask, "estimator": k.estimator}
        return _with_norm({**kwargs, "loss_agg": k.loss_agg}, k.norm_constant), ("logp", "ref_logp"), "logp"
    if op == "gspo_loss":
        g = data.draw(cs.gspo_batches(junk=False), label="batch")
        kwargs = {"logp": g.logp, "old_logp": g.old_logp, "advantages": g.advantages, "mask": g.mask}
        return {**kwargs, "clip_eps": g.clip_eps}, ("logp", "old_logp"), "logp"
    if op == "cispo_loss":
        b = data.draw(cs.cispo_batches(loss_aggs=_agg_modes(ctx), junk=False), label="batch")
        kwargs = {"logp": b.logp, "old_logp": b.old_logp, "advantages": b.advantages, "mask": b.mask}
        kwargs = {**kwargs, "clip_low": b.clip_low, "clip_high": b.clip_high, "loss_agg": b.loss_agg}
        return _with_norm(kwargs, b.norm_constant), ("logp", "old_logp", "advantages"), "logp"
    levels, modes = sorted(c.correction_levels), sorted(c.correction_modes)
    r = data.draw(cs.correction_batches(levels=levels, modes=modes, junk=False), label="batch")
    # Within the declared correction_bounds (as IS-1..3 draw them), so that a library without an
    # open lower bound is tested for robustness rather than stopped at its ValueError.
    return correction_kwargs(declared_bounds(ctx, r)), ("logp", "rollout_logp"), None


def _family_outputs(result: Any) -> dict[str, Tensor]:
    if isinstance(result, Tensor | float | int):
        return {"out": as_tensor(result, "result")}
    names = ("loss", "clipfrac", "approx_kl", "ratio_mean", "ratio_max")
    return {n: as_tensor(getattr(result, n), n) for n in names if getattr(result, n, None) is not None}


def _family_run(
    ctx: Context, op: str, kwargs: dict[str, Any], wrt: str | None
) -> tuple[dict[str, Tensor], Tensor | None]:
    note_repro(ctx, op, **kwargs)
    fresh = {k: v.detach().clone() if isinstance(v, Tensor) else v for k, v in kwargs.items()}
    if wrt is not None:
        fresh[wrt] = fresh[wrt].requires_grad_(True)
    outputs = _family_outputs(ctx.op(op)(**fresh))
    if wrt is None:
        return outputs, None
    scalar = outputs["loss"] if "loss" in outputs else outputs["out"].sum()
    grad = (
        grad_of(scalar, fresh[wrt], f"{op} output") if scalar.requires_grad else torch.zeros_like(fresh[wrt])
    )
    return outputs, grad


FAMILY_OPS: tuple[str, ...] = ("aggregate_loss", "kl_loss", "gspo_loss", "cispo_loss", "rollout_correction")
SCALE = math.exp(2 * cs.LOG_RATIO_MAX)
"""Absolute-tolerance scale of these comparisons (ratios up to e^3 multiply rounding)."""


@pytest.mark.parametrize("op", [_param(op) for op in FAMILY_OPS])
@examples()
@given(data=st.data())
def test_family_ops_ignore_junk_in_masked_out_slots(ctx: Context, op: str, data: st.DataObject) -> None:
    """ROB-4: junk in the masked-out slots of every per-token input leaves every output and the
    gradient unchanged and finite."""
    clean, per_token, wrt = _family(ctx, op, data)
    mask = clean["mask"]
    base, base_grad = _family_run(ctx, op, clean, wrt)
    junked = dict(clean)
    for name in per_token:
        fill = data.draw(cs.junk_tensors(tuple(mask.shape), clean[name].dtype), label=f"junk {name}")
        junked[name] = cs.fill_masked(clean[name], mask, fill)
    got, grad = _family_run(ctx, op, junked, wrt)
    dtype = clean[per_token[0]].dtype
    assert set(got) == set(base), f"{op}: outputs {sorted(got)} with junk, {sorted(base)} without"
    for name, expected in base.items():
        value = got[name].detach()
        assert bool(torch.isfinite(value).all()) or not bool(torch.isfinite(expected).all()), (
            f"{op} with junk in the masked-out slots: {name} is not finite: {value}"
        )
        assert_close(
            value, expected.detach(), dtype, f"{op} with junk in the masked-out slots: {name}", SCALE
        )
    if grad is not None and base_grad is not None:
        assert bool(torch.isfinite(grad).all()), f"{op}: non-finite gradient with junk: {grad}"
        assert_close(grad, base_grad, dtype, f"{op}: gradient with junk in the masked-out slots", SCALE)
