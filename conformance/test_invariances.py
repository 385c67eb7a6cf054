"""IN-1: masked-out entries never matter. For every op that takes a mask: writing other values into
the masked-out slots, as the adapter's declared ``masked_fill`` allows (arbitrary values, NaN and
+-inf included, under the reference's ``any``), or appending masked-out columns of them, leaves
every output and gradient unchanged and finite, and the appended columns' outputs are 0.

The same check with junk whatever is declared is robustness (ROB-1..3, ``test_robustness.py``,
which reuses :func:`check_masked_out_entries`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
    call_impl,
    examples,
    grad_of,
    note_repro,
    whitening_scale,
)


@dataclass(frozen=True)
class OpInputs:
    """How to draw clean inputs of one op, which of them are per-token, and what to differentiate."""

    draw: Callable[[Context, st.DataObject], dict[str, Any]]
    per_token: tuple[str, ...]
    grad_wrt: str | None = None


def _estimator(ctx: Context, data: st.DataObject) -> str:
    return data.draw(st.sampled_from(sorted(ctx.conventions.kl_estimators)), label="estimator")


def _agg(ctx: Context, data: st.DataObject) -> str:
    modes = sorted(set(ctx.conventions.loss_aggregations) & set(cs.COUNT_AGGREGATIONS))  # norm mode: AGG-1
    return data.draw(st.sampled_from(modes), label="loss_agg")


def _masked(ctx: Context, data: st.DataObject, min_tokens: int = 0) -> dict[str, Any]:
    batch = data.draw(cs.masked_batches(min_tokens=min_tokens, junk=False), label="batch")
    return {"x": batch.x, "mask": batch.mask}


def _kl(ctx: Context, data: st.DataObject) -> dict[str, Any]:
    b = data.draw(cs.kl_batches(with_mask=True, junk=False), label="batch")
    return {"logp": b.logp, "ref_logp": b.ref_logp, "estimator": _estimator(ctx, data), "mask": b.mask}


def _rewards(ctx: Context, data: st.DataObject) -> dict[str, Any]:
    b = data.draw(cs.reward_batches(junk=False), label="batch")
    return batch_kwargs(b, ("scores", "logp", "ref_logp", "mask", "kl_coef"), estimator=_estimator(ctx, data))


def _gae(ctx: Context, data: st.DataObject) -> dict[str, Any]:
    b = data.draw(
        cs.gae_batches(junk=False, bootstrap=None if ctx.conventions.gae_bootstrap != "none" else False)
    )
    if ctx.conventions.gae_whitening != "none":
        assume(int((b.mask != 0).sum()) >= 2)
    return batch_kwargs(b, ("rewards", "values", "mask", "gamma", "lam"), ("last_values",))


def _policy(ctx: Context, data: st.DataObject) -> dict[str, Any]:
    b = data.draw(cs.policy_batches(loss_aggs=(_agg(ctx, data),), junk=False), label="batch")
    return batch_kwargs(b, ("logp", "old_logp", "advantages", "mask", "clip_eps", "loss_agg"))


def _value(ctx: Context, data: st.DataObject) -> dict[str, Any]:
    modes = sorted(ctx.conventions.value_clip_modes)
    b = data.draw(
        cs.value_batches(clip=data.draw(st.sampled_from(modes)) == "clipped", junk=False), label="batch"
    )
    return batch_kwargs(b, ("values", "old_values", "returns", "mask", "clip_eps"))


def _penalty(ctx: Context, data: st.DataObject) -> dict[str, Any]:
    b = data.draw(cs.penalty_batches(junk=False), label="batch")
    return batch_kwargs(b, ("logp", "old_logp", "advantages", "mask", "beta"))


OPS: dict[str, OpInputs] = {
    "masked_mean": OpInputs(_masked, ("x",), "x"),
    "masked_whiten": OpInputs(lambda ctx, data: _masked(ctx, data, min_tokens=2), ("x",)),
    "kl_penalty": OpInputs(_kl, ("logp", "ref_logp"), "logp"),
    "token_rewards": OpInputs(_rewards, ("logp", "ref_logp")),
    "gae": OpInputs(_gae, ("rewards", "values")),
    "policy_loss": OpInputs(_policy, ("logp", "old_logp", "advantages"), "logp"),
    "value_loss": OpInputs(_value, ("values", "old_values", "returns"), "values"),
    "ppo_penalty_loss": OpInputs(_penalty, ("logp", "old_logp", "advantages"), "logp"),
}
STATISTICS = ("loss", "clipfrac", "approx_kl", "ratio_outside_frac", "ratio_mean", "ratio_max", "kl")


def _outputs(op: str, result: Any) -> dict[str, Tensor]:
    if op == "gae":
        return {"advantages": as_tensor(result[0], "advantages"), "returns": as_tensor(result[1], "returns")}
    if op in ("policy_loss", "ppo_penalty_loss"):
        return {
            n: as_tensor(getattr(result, n), n) for n in STATISTICS if getattr(result, n, None) is not None
        }
    return {"out": as_tensor(result, op)}


def outputs_and_grad(
    function: Callable[..., Any], op: str, kwargs: dict[str, Any], wrt: str
) -> tuple[dict[str, Tensor], Tensor]:
    """``function``'s outputs on fresh copies of ``kwargs`` and the gradient of its loss (or of its
    output's sum) in ``kwargs[wrt]`` (zeros when nothing is differentiable)."""
    leaf = kwargs[wrt].detach().clone().requires_grad_(True)
    result = function(
        **{**{k: v.clone() if isinstance(v, Tensor) else v for k, v in kwargs.items()}, wrt: leaf}
    )
    outputs = _outputs(op, result)
    scalar = outputs["loss"] if "loss" in outputs else outputs["out"].sum()
    return outputs, grad_of(scalar, leaf, f"{op} output") if scalar.requires_grad else torch.zeros_like(leaf)


def _run(
    ctx: Context, op: str, kwargs: dict[str, Any], wrt: str | None
) -> tuple[dict[str, Tensor], Tensor | None]:
    note_repro(ctx, op, **kwargs)
    if wrt is None:
        return _outputs(op, call_impl(ctx, op, **kwargs)), None
    return outputs_and_grad(ctx.op(op), op, kwargs, wrt)


def _compare(
    op: str,
    got: dict[str, Tensor],
    want: dict[str, Tensor],
    dtype: torch.dtype,
    how: str,
    skip: frozenset[str] = frozenset(),
    scale: float = 1.0,
) -> None:
    assert set(got) == set(want), f"{op} {how}: outputs {sorted(got)} instead of {sorted(want)}"
    for name, expected in want.items():
        if name in skip:
            continue
        value = got[name].detach()
        if expected.dim() == 2 and value.dim() == 2 and value.shape[1] > expected.shape[1]:
            extra = value[:, expected.shape[1] :]
            assert bool((extra == 0).all()), f"{op} {how}: {name} at the appended masked-out columns: {extra}"
            value = value[:, : expected.shape[1]]
        assert bool(torch.isfinite(value).all()) or not bool(torch.isfinite(expected).all()), (
            f"{op} {how}: {name} is not finite: {value}"
        )
        assert_close(value, expected.detach(), dtype, f"{op} {how}: {name}", scale=scale)


def _whitening_scale(ctx: Context, op: str, clean: dict[str, Any]) -> float:
    """Rounding amplification of whitened outputs (masked_whiten, or gae with gae_whitening)."""
    if op == "masked_whiten":
        return whitening_scale(clean["x"], clean["mask"])
    if op == "gae" and ctx.conventions.gae_whitening != "none":
        return whitening_scale(ppo_ref.gae(**clean)[0], clean["mask"])
    return 1.0


@pytest.mark.clause("IN-1")
@pytest.mark.parametrize("op", [pytest.param(op, marks=pytest.mark.ops(op)) for op in OPS])
@examples()
@given(data=st.data())
def test_masked_out_entries_change_nothing(ctx: Context, op: str, data: st.DataObject) -> None:
    check_masked_out_entries(ctx, op, data, cs.masked_fills)


def check_masked_out_entries(
    ctx: Context,
    op: str,
    data: st.DataObject,
    fills: Callable[[tuple[int, ...], torch.dtype], st.SearchStrategy[Tensor]],
) -> None:
    """Inputs of ``op`` drawn as declared, then the same with ``fills`` in the masked-out slots and
    with masked-out columns of ``fills`` appended: outputs and gradients unchanged and finite."""
    spec = OPS[op]
    clean = spec.draw(ctx, data)
    mask = clean["mask"]
    dtype = clean[spec.per_token[0]].dtype
    base, base_grad = _run(ctx, op, clean, spec.grad_wrt)

    junk = {
        name: cs.fill_masked(clean[name], mask, data.draw(fills(tuple(mask.shape), dtype)))
        for name in spec.per_token
    }
    junked, junked_grad = _run(ctx, op, {**clean, **junk}, spec.grad_wrt)
    scale = _whitening_scale(ctx, op, clean)
    _compare(op, junked, base, dtype, "with junk in the masked-out slots", scale=scale)
    if base_grad is not None and junked_grad is not None:
        assert bool(torch.isfinite(junked_grad).all()), f"{op}: non-finite gradient with junk: {junked_grad}"
        assert_close(junked_grad, base_grad, dtype, f"{op}: gradient with junk in the masked-out slots")

    columns = data.draw(st.integers(1, 3), label="appended columns")
    padded = {**clean, "mask": cs.append_padding(mask, columns, 0)}
    for name in spec.per_token:
        fill = data.draw(fills((mask.shape[0], columns), dtype))
        padded[name] = cs.append_padding(junk[name], columns, fill)
    if op == "token_rewards" and ctx.conventions.score_placement != "last-action-token":
        return  # the declared placement puts the score on the slot after the last action token
    if op in ("value_loss", "gae") and ctx.conventions.value_after_last_action_token == "trained":
        return  # the declared value slot after the last action token moves into the new columns
    diluted = frozenset(ctx.conventions.unmasked_statistics)  # declared: padding dilutes them
    padded_out, padded_grad = _run(ctx, op, padded, spec.grad_wrt)
    _compare(op, padded_out, base, dtype, f"with {columns} masked-out columns appended", diluted, scale)
    if base_grad is not None and padded_grad is not None:
        assert bool(torch.isfinite(padded_grad).all()), (
            f"{op}: non-finite gradient with padding: {padded_grad}"
        )
        assert bool((padded_grad[:, mask.shape[1] :] == 0).all()), f"{op}: gradient on appended padding"
        assert_close(
            padded_grad[:, : mask.shape[1]], base_grad, dtype, f"{op}: gradient with padding appended"
        )
