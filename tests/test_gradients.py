"""Autograd slopes of the reference losses against their analytic derivatives.

- PG-1: d objective_t / d logp_t is ratio_t * A_t on the unclipped branch and 0 on the flat one
  (A > 0 with ratio > 1 + eps, or A < 0 with ratio < 1 - eps); the loss gradient is that slope
  times -(the token's weight in the aggregation): 1/N (token-mean), 1/(R n_b) (seq-mean-token-mean)
  or 1/R (seq-mean-token-sum), with N action tokens, R rows that have one, n_b tokens in row b.
- VF-1/VF-2: d loss / d V_t = (V_t - R_t) / N, or (V_clip - R_t) / N * [|V - V_old| < c] when the
  clipped term is the larger.
- KL-1..3: d k1 / d logp = 1, d k2 / d logp = delta, d k3 / d logp = 1 - exp(-delta), and the
  negatives with respect to ref_logp.
- PEN-1: d loss / d logp_t = -(ratio_t A_t - beta (ratio_t - 1)) / N.
- LOGP-1/2, ENT-1, MASK-1: the gradients of the log-probs, entropy and masked mean.

Masked-out entries hold NaN or inf in most draws; their gradients must be exactly 0. Tokens within
1e-6 of a kink (clip boundary, equal branches) are left out of the comparison: there the slope is
one-sided and either side is correct.
"""

from __future__ import annotations

import math

import oracles
import pytest
import torch
from hypothesis import assume, given
from torch import Tensor

import ppo_ref
from conformance import strategies as cs

KINK = 1e-6


def _leaf(t: Tensor) -> Tensor:
    return t.detach().clone().requires_grad_(True)


def _assert_grad(grad: Tensor | None, expected: Tensor, compare: Tensor, dtype: torch.dtype) -> None:
    """``grad`` equals ``expected`` where ``compare`` is True, within the dtype's tolerance."""
    assert grad is not None
    assert bool(torch.isfinite(grad).all())
    rel = oracles.tolerance(dtype)
    torch.testing.assert_close(grad[compare].double(), expected[compare].double(), rtol=rel, atol=rel)


def _token_weights(keep: Tensor, loss_agg: str) -> Tensor:
    """Each action token's weight in the aggregated loss (0 off the mask)."""
    tokens = keep.sum(dim=1, keepdim=True).double()
    rows = max(int(keep.any(dim=1).sum()), 1)
    if loss_agg == "token-mean":
        weight = torch.full_like(tokens, 1.0 / max(int(keep.sum()), 1))
    elif loss_agg == "seq-mean-token-mean":
        weight = 1.0 / (rows * tokens.clamp(min=1))
    else:
        weight = torch.full_like(tokens, 1.0 / rows)
    return torch.where(keep, weight.expand_as(keep), 0.0)


@pytest.mark.clause("PG-1", "PG-2", "IN-1")
@given(cs.policy_batches())
def test_clipped_objective_slopes(batch: cs.PolicyBatch) -> None:
    logp = _leaf(batch.logp)
    result = ppo_ref.policy_loss(
        logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_eps, batch.loss_agg
    )
    result.loss.backward()
    keep = batch.mask != 0
    ratio = torch.exp(batch.logp.double() - batch.old_logp.double())
    adv = batch.advantages.double()
    upper, lower = 1.0 + batch.clip_eps, 1.0 - batch.clip_eps
    flat = ((adv > 0) & (ratio > upper)) | ((adv < 0) & (ratio < lower))
    slope = torch.where(flat, 0.0, ratio * adv)  # d objective / d logp = ratio * d objective / d ratio
    expected = -_token_weights(keep, batch.loss_agg) * torch.where(keep, slope, 0.0)
    # Within float rounding of a boundary the branch is ambiguous (and float32 ratios are rounded).
    near_kink = ((ratio - upper).abs() < 10 * oracles.tolerance(batch.logp.dtype)) | (
        (ratio - lower).abs() < 10 * oracles.tolerance(batch.logp.dtype)
    )
    _assert_grad(logp.grad, expected, keep & ~near_kink, batch.logp.dtype)
    assert logp.grad is not None and bool((logp.grad[~keep] == 0).all())


@pytest.mark.clause("VF-1", "VF-2", "IN-1")
@given(cs.value_batches())
def test_value_loss_gradient(batch: cs.ValueBatch) -> None:
    values = _leaf(batch.values)
    ppo_ref.value_loss(values, batch.old_values, batch.returns, batch.mask, batch.clip_eps).backward()
    keep = batch.mask != 0
    count = max(int(keep.sum()), 1)
    v, old, target = (t.double() for t in (batch.values, batch.old_values, batch.returns))
    plain = v - target
    compare = keep.clone()
    if batch.clip_eps is None:
        expected = plain / count
    else:
        c = batch.clip_eps
        moved = v - old
        clipped = old + moved.clamp(-c, c) - target
        clipped_larger = clipped.abs() > plain.abs()
        inside = moved.abs() < c
        expected = torch.where(clipped_larger, clipped * inside, plain) / count
        scale = 1 + v.abs() + old.abs() + target.abs()
        compare &= ((clipped.abs() - plain.abs()).abs() > KINK * scale) & (
            (moved.abs() - c).abs() > KINK * scale
        )
    _assert_grad(values.grad, torch.where(keep, expected, 0.0), compare, batch.values.dtype)
    assert values.grad is not None and bool((values.grad[~keep] == 0).all())


@pytest.mark.clause("KL-1", "KL-2", "KL-3", "IN-1")
@given(cs.kl_batches())
def test_kl_estimator_gradients(batch: cs.KLBatch) -> None:
    logp, ref_logp = _leaf(batch.logp), _leaf(batch.ref_logp)
    ppo_ref.kl_penalty(logp, ref_logp, batch.estimator, mask=batch.mask).sum().backward()
    keep = torch.ones_like(batch.logp, dtype=torch.bool) if batch.mask is None else batch.mask != 0
    delta = torch.where(keep, batch.logp.double() - batch.ref_logp.double(), 0.0)
    slope = {"k1": torch.ones_like(delta), "k2": delta, "k3": 1.0 - torch.exp(-delta)}[batch.estimator]
    slope = torch.where(keep, slope, 0.0)
    _assert_grad(logp.grad, slope, keep, batch.logp.dtype)
    _assert_grad(ref_logp.grad, -slope, keep, batch.logp.dtype)
    assert logp.grad is not None and bool((logp.grad[~keep] == 0).all())
    assert ref_logp.grad is not None and bool((ref_logp.grad[~keep] == 0).all())


@pytest.mark.clause("PEN-1", "IN-1")
@given(cs.penalty_batches())
def test_penalty_loss_gradient(batch: cs.PenaltyBatch) -> None:
    logp = _leaf(batch.logp)
    ppo_ref.ppo_penalty_loss(logp, batch.old_logp, batch.advantages, batch.mask, batch.beta).loss.backward()
    keep = batch.mask != 0
    ratio = torch.exp(torch.where(keep, batch.logp.double() - batch.old_logp.double(), 0.0))
    expected = -(ratio * batch.advantages.double() - batch.beta * (ratio - 1.0)) / max(int(keep.sum()), 1)
    scale = math.exp(cs.LOG_RATIO_MAX) * (5.0 + batch.beta)
    assert logp.grad is not None
    rel = oracles.tolerance(batch.logp.dtype)
    torch.testing.assert_close(logp.grad[keep].double(), expected[keep], rtol=rel, atol=rel * scale)
    assert bool((logp.grad[~keep] == 0).all())


@pytest.mark.clause("LOGP-1", "LOGP-2")
@given(cs.logits_batches(dtypes=(torch.float64,), banned_tokens=False))
def test_token_logprobs_gradient(batch: cs.LogitsBatch) -> None:
    # With L = 1 nothing is scored and the empty result has no graph (nothing to differentiate).
    assume(batch.logits.shape[1] >= 2)
    logits = _leaf(batch.logits)
    ppo_ref.token_logprobs(logits, batch.input_ids, batch.temperature).sum().backward()
    # d out[b, i] / d logits[b, i, v] = ([v == id[b, i + 1]] - softmax(logits[b, i] / T)_v) / T;
    # the last position scores nothing.
    probs = torch.softmax(batch.logits / batch.temperature, dim=-1)
    one_hot = torch.nn.functional.one_hot(batch.input_ids[:, 1:].long(), batch.logits.shape[-1]).double()
    expected = torch.zeros_like(batch.logits)
    expected[:, :-1] = (one_hot - probs[:, :-1]) / batch.temperature
    assert logits.grad is not None
    torch.testing.assert_close(logits.grad, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.clause("ENT-1")
@given(cs.logits_batches(dtypes=(torch.float64,)))
def test_entropy_gradient(batch: cs.LogitsBatch) -> None:
    logits = _leaf(batch.logits)
    entropy = ppo_ref.entropy(logits)
    entropy.sum().backward()
    # dH / dz_v = -p_v (log p_v + H); banned tokens (p = 0) get 0.
    log_probs = torch.log_softmax(batch.logits, dim=-1)
    probs = log_probs.exp()
    expected = torch.where(probs > 0, -probs * (log_probs + entropy.detach()[..., None]), 0.0)
    assert logits.grad is not None
    torch.testing.assert_close(logits.grad, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.clause("MASK-1", "IN-1")
@given(cs.masked_batches(ndims=(1, 2, 3)))
def test_masked_mean_gradient(batch: cs.MaskedBatch) -> None:
    x = _leaf(batch.x)
    ppo_ref.masked_mean(x, batch.mask).backward()
    keep = batch.mask != 0
    expected = keep.double() / max(int(keep.sum()), 1)
    assert x.grad is not None
    torch.testing.assert_close(x.grad.double(), expected, rtol=1e-7, atol=1e-9)
