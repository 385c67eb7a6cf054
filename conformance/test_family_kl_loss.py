"""KLL-1..3: the KL penalty as a loss. Value and gradient per estimator against the reference, the
expected gradient over a ~ pi on small categorical distributions (which estimators are unbiased as
a loss: TRL #4967, OpenRLHF PR #1309, SkyRL #1340), and masked-out tokens."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from . import strategies as cs
from .support import Context, as_tensor, assert_close, batch_kwargs, call_both, examples, grad_of, note_repro

pytestmark = pytest.mark.ops("kl_loss")

F64 = torch.float64
SLOPE_SCALE = math.exp(cs.LOG_RATIO_MAX)
"""Largest slope magnitude on drawn inputs (k3's 1 - e^-delta with |delta| <= 3)."""


def _by_estimator(*clauses: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize(
        "estimator",
        [
            pytest.param(k, marks=[pytest.mark.clause(*clauses), pytest.mark.needs(f"kl_loss_estimator:{k}")])
            for k in cs.KL_LOSS_ESTIMATORS
        ],
    )


def _aggs(ctx: Context) -> tuple[str, ...]:
    aggs = [a for a in cs.LOSS_AGGREGATIONS if a in ctx.conventions.loss_aggregations]
    if "counts" not in ctx.conventions.policy_loss_options:  # the norm mode needs norm_constant
        aggs = [a for a in aggs if a != "seq-mean-token-sum-norm"] or aggs
    return tuple(aggs)


def _kwargs(batch: cs.KLLossBatch, **overrides: Any) -> dict[str, Any]:
    names = ("logp", "ref_logp", "mask", "estimator", "loss_agg")
    return batch_kwargs(batch, names, ("norm_constant",), **overrides)


@_by_estimator("KLL-1", "KLL-3")
@examples()
@given(data=st.data())
def test_kl_loss_matches_the_reference(ctx: Context, estimator: str, data: st.DataObject) -> None:
    batch = data.draw(cs.kl_loss_batches(estimators=(estimator,), loss_aggs=_aggs(ctx)), label="batch")
    actual, expected = call_both(ctx, "kl_loss", **_kwargs(batch))
    scale = math.exp(2 * cs.LOG_RATIO_MAX) * batch.mask.shape[1]
    assert_close(actual, expected, batch.logp.dtype, f"kl_loss({estimator}, {batch.loss_agg})", scale=scale)


@_by_estimator("KLL-1")
@examples()
@given(data=st.data())
def test_kl_loss_gradient_per_estimator(ctx: Context, estimator: str, data: st.DataObject) -> None:
    """d loss / d logp_t = w_t * (1 | delta | 1 - e^-delta | delta) for k1 | k2 | k3 | k3+, w_t the
    token's aggregation weight; 0 off the mask."""
    aggs = tuple(a for a in _aggs(ctx) if a != "seq-mean-token-sum-norm") or ("token-mean",)
    batch = data.draw(cs.kl_loss_batches(estimators=(estimator,), loss_aggs=aggs), label="batch")
    note_repro(ctx, "kl_loss", **_kwargs(batch))
    logp = batch.logp.detach().clone().requires_grad_(True)
    grad = grad_of(ctx.op("kl_loss")(**_kwargs(batch, logp=logp)), logp, f"kl_loss({estimator})").double()
    keep = batch.mask != 0
    delta = torch.where(keep, batch.logp.double() - batch.ref_logp.double(), torch.zeros((), dtype=F64))
    slope = {"k1": torch.ones_like(delta), "k2": delta, "k3": 1 - torch.exp(-delta), "k3+": delta}[estimator]
    counts = keep.double()
    row_tokens = counts.sum(dim=1, keepdim=True)
    rows = max(int((row_tokens > 0).sum()), 1)
    weight = {
        "token-mean": counts / max(float(counts.sum()), 1.0),
        "seq-mean-token-mean": counts / row_tokens.clamp(min=1) / rows,
        "seq-mean-token-sum": counts / rows,
    }[batch.loss_agg]
    assert bool(torch.isfinite(grad).all()), f"non-finite gradient: {grad}"
    assert_close(grad[keep], (weight * slope)[keep], batch.logp.dtype, f"d kl_loss({estimator}) / d logp",
                 scale=SLOPE_SCALE)  # fmt: skip
    assert bool((grad[~keep] == 0).all()), "gradient off the mask"


EXPECTED = {"k1": "zero", "k2": "forward", "k3": "reverse", "k3+": "forward"}
"""E_{a ~ pi}[grad l(a)]: 0 (k1), grad KL(pi || pi_ref) (k2, k3+), grad KL(pi_ref || pi) (k3)."""


def _targets(theta: Tensor, ref: Tensor) -> dict[str, Tensor]:
    leaf = theta.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(leaf, dim=0)
    (forward,) = torch.autograd.grad((logp.exp() * (logp - ref)).sum(), leaf)
    leaf = theta.detach().clone().requires_grad_(True)
    (reverse,) = torch.autograd.grad((ref.exp() * (ref - torch.log_softmax(leaf, dim=0))).sum(), leaf)
    return {"zero": torch.zeros_like(forward), "forward": forward, "reverse": reverse}


@_by_estimator("KLL-2")
@examples()
@given(
    logits=st.integers(2, 6).flatmap(
        lambda v: st.tuples(cs.float_tensors((v,), F64, -2.0, 2.0), cs.float_tensors((v,), F64, -2.0, 2.0))
    )
)
def test_expected_gradient_over_a_categorical_distribution(
    ctx: Context, estimator: str, logits: tuple[Tensor, Tensor]
) -> None:
    """pi = softmax(theta) over V actions; one call per action a (a single token), weighted by
    pi(a) held constant: the gradient of the sum is sum_a pi(a) grad l(a), exactly the expectation
    over a ~ pi. k2 and k3+ must give grad KL(pi || pi_ref) (unbiased as a loss), k1 zero and k3
    grad KL(pi_ref || pi)."""
    theta, ref_logits = logits
    ref = torch.log_softmax(ref_logits, dim=0)
    vocab = theta.shape[0]
    leaf = theta.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(leaf, dim=0).reshape(vocab, 1)
    pi = logp.detach().exp()
    kwargs = {"ref_logp": ref.reshape(vocab, 1), "mask": torch.ones(vocab, 1), "estimator": estimator,
              "loss_agg": "token-mean"}  # fmt: skip
    note_repro(ctx, "kl_loss", logp=logp.detach(), **kwargs)
    total = torch.zeros((), dtype=F64)
    for a in range(vocab):
        row = {k: (v[a : a + 1] if isinstance(v, Tensor) else v) for k, v in kwargs.items()}
        total = total + pi[a, 0] * as_tensor(ctx.op("kl_loss")(logp=logp[a : a + 1], **row), "kl_loss")
    expected_grad = grad_of(total, leaf, f"kl_loss({estimator})")
    target = _targets(theta, ref)[EXPECTED[estimator]]
    assert_close(expected_grad, target, F64, f"E_pi[grad {estimator}] vs {EXPECTED[estimator]} KL gradient")


@pytest.mark.clause("KLL-3")
@pytest.mark.needs("kl_loss_estimator:k3")
@examples()
@given(data=st.data())
def test_masked_out_tokens_change_neither_the_loss_nor_its_gradient(
    ctx: Context, data: st.DataObject
) -> None:
    """Values in the masked-out slots, as the declared ``masked_fill`` allows (NaN and inf under the
    reference's ``any``; robustness to them whatever is declared is ROB-4), change nothing."""
    batch = data.draw(cs.kl_loss_batches(estimators=("k3",), loss_aggs=_aggs(ctx), junk=False), label="batch")
    junk = data.draw(cs.masked_fills(tuple(batch.mask.shape), batch.logp.dtype), label="masked-out values")
    results, grads = [], []
    keep = batch.mask != 0
    for logp_in, ref_in in (
        (batch.logp, batch.ref_logp),
        (cs.fill_masked(batch.logp, batch.mask, junk), cs.fill_masked(batch.ref_logp, batch.mask, junk)),
    ):
        kwargs = _kwargs(batch, logp=logp_in, ref_logp=ref_in)
        note_repro(ctx, "kl_loss", **kwargs)
        logp = logp_in.detach().clone().requires_grad_(True)
        out = as_tensor(ctx.op("kl_loss")(**{**kwargs, "logp": logp}), "kl_loss")
        results.append(out)
        grads.append(grad_of(out, logp, "kl_loss"))
    assert_close(results[1], results[0].detach(), batch.logp.dtype, "kl_loss with other values off the mask",
                 scale=math.exp(2 * cs.LOG_RATIO_MAX))  # fmt: skip
    assert bool(torch.isfinite(grads[1]).all()) and bool((grads[1][~keep] == 0).all())
    assert_close(grads[1], grads[0], batch.logp.dtype, "gradient with junk off the mask", scale=SLOPE_SCALE)
