"""Gradients of the PPO-family functions: finite differences (``torch.autograd.gradcheck`` in
float64) and the analytic slopes their clauses state.

- CLIP-1, CLIP-2: d o_t / d logp_t = ratio_t A_t off the flat branches, 0 on them; the flat
  branches are A > 0 with ratio > 1 + eps_high, A < 0 with ratio < 1 - eps, and A < 0 with
  ratio > c under the dual clip (the dual bound c A does not depend on logp).
- GSPO-2: d loss / d logp_t = -s_i A_i / (n_i R) on the unclipped branch; equal to the GSPO-token
  form aggregated with seq-mean-token-mean, different from it under token-mean (TRL #3823).
- CISPO-1: every action token gets -w_t A_t (times its aggregation weight), clipped or not.
- KLL-1: d term / d logp is 1 (k1), delta (k2), 1 - exp(-delta) (k3), delta (k3+).
- KLL-2: the expected gradient over a ~ pi on a small categorical distribution, computed exactly as
  sum_a pi(a) grad l(a) and by sampling: k2 and k3+ give grad KL(pi || pi_ref), k1 gives 0, k3 gives
  grad KL(pi_ref || pi).
- IS-3: rollout weights carry no gradient.

Functions whose gradient is *not* the derivative of their value (CISPO's detached weight, k3+'s
straight-through) are checked analytically; gradcheck is shown to reject them.
"""

from __future__ import annotations

import math
from typing import Any

import oracles
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor
from torch.autograd.gradcheck import GradcheckError

import ppo_ref
from conformance import strategies as cs

KINK = 1e-6
F64 = torch.float64


def _leaf(t: Tensor) -> Tensor:
    return t.detach().clone().requires_grad_(True)


def _grad(loss: Tensor, wrt: Tensor) -> Tensor:
    (grad,) = torch.autograd.grad(loss, wrt)
    return grad


def _assert_close(got: Tensor, want: Any, compare: Tensor, dtype: torch.dtype, scale: float = 1.0) -> None:
    expected = torch.as_tensor(want, dtype=F64)
    oracles.assert_close_to_oracle(got.double()[compare], expected[compare].tolist(), dtype, scale=scale)


# --- gradcheck (float64, inputs away from every kink) -----------------------------------------------

MASK = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
LOG_RATIO = torch.tensor(
    [[0.5, -0.9, 0.0, 0.1], [1.6, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [-0.05, 0.3, 1.3, 0.0]], dtype=F64
)
"""Ratios 1.65, 0.41, 1.11, 4.95, 0.95, 1.35, 3.67: inside and beyond [0.8, 1.28] and the dual bound 3."""
ADVANTAGES = torch.tensor(
    [[1.5, -2.0, 0.0, 0.7], [-1.2, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.4, -0.8, -1.1, 0.0]], dtype=F64
)
OLD_LOGP = torch.tensor(
    [[-1.0, -2.0, -0.5, -3.0], [-2.5, -1.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0], [-0.7, -1.9, -2.2, -1.0]],
    dtype=F64,
)


@pytest.mark.parametrize("loss_agg", cs.LOSS_AGGREGATIONS)
def test_gradcheck_policy_loss_with_clip_higher_and_dual_clip(loss_agg: str) -> None:
    norm = {"norm_constant": 6.0} if loss_agg == "seq-mean-token-sum-norm" else {}

    def loss(logp: Tensor) -> Tensor:
        return ppo_ref.policy_loss(
            logp, OLD_LOGP, ADVANTAGES, MASK, 0.2, loss_agg, clip_eps_high=0.28, dual_clip=3.0, **norm
        ).loss

    assert torch.autograd.gradcheck(loss, (_leaf(OLD_LOGP + LOG_RATIO),))


@pytest.mark.parametrize("loss_agg", cs.LOSS_AGGREGATIONS)
def test_gradcheck_aggregate_loss_and_value_loss(loss_agg: str) -> None:
    norm = {"norm_constant": 3.5} if loss_agg == "seq-mean-token-sum-norm" else {}
    assert torch.autograd.gradcheck(
        lambda x: ppo_ref.aggregate_loss(x, MASK, loss_agg, **norm), (_leaf(LOG_RATIO),)
    )
    returns = ADVANTAGES * 2.0

    def value(v: Tensor) -> Tensor:
        return ppo_ref.value_loss(v, LOG_RATIO, returns, MASK, 0.2, loss_agg, **norm)

    assert torch.autograd.gradcheck(value, (_leaf(LOG_RATIO + 0.05 * ADVANTAGES + 0.5),))


def test_gradcheck_gspo_loss() -> None:
    advantages = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=F64)

    def loss(logp: Tensor) -> Tensor:
        return ppo_ref.gspo_loss(logp, OLD_LOGP, advantages, MASK, 0.2, clip_eps_high=0.3).loss

    assert torch.autograd.gradcheck(loss, (_leaf(OLD_LOGP + LOG_RATIO),))


@pytest.mark.parametrize(
    ("method", "std_scope"),
    [("grpo", "group"), ("grpo", "batch"), ("grpo", "none"), ("dr_grpo", "group"), ("rloo", "group")],
)
def test_gradcheck_group_advantages(method: str, std_scope: str) -> None:
    """A singleton group (id -1) included: its A = 0 must have a zero gradient, not NaN."""
    scores = torch.tensor([0.3, 1.7, -0.4, 2.2, 0.9, -1.1, 0.5], dtype=F64)
    ids = torch.tensor([4, 9, 4, -1, 9, 4, 9])
    assert torch.autograd.gradcheck(
        lambda r: ppo_ref.group_advantages(r, ids, method, std_scope=std_scope), (_leaf(scores),)
    )


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_gradcheck_kl_loss(estimator: str) -> None:
    assert torch.autograd.gradcheck(
        lambda logp: ppo_ref.kl_loss(logp, OLD_LOGP, MASK, estimator, "seq-mean-token-mean"),
        (_leaf(OLD_LOGP + LOG_RATIO),),
    )


def test_gradcheck_rejects_the_straight_through_and_detached_weight_forms() -> None:
    """k3+ and CISPO are built so that their gradient is not the derivative of their value."""
    logp = _leaf(OLD_LOGP + LOG_RATIO)
    with pytest.raises(GradcheckError):
        torch.autograd.gradcheck(lambda x: ppo_ref.kl_loss(x, OLD_LOGP, MASK, "k3+"), (logp,))
    with pytest.raises(GradcheckError):
        torch.autograd.gradcheck(
            lambda x: ppo_ref.cispo_loss(x, OLD_LOGP, ADVANTAGES, MASK, 0.2, 0.28).loss, (logp,)
        )


# --- CLIP-1, CLIP-2 -------------------------------------------------------------------------------


def _clip_kinks(batch: cs.ClipBatch) -> Tensor:
    """Action tokens whose ratio is within KINK (relative) of 1 - eps, 1 + eps_high or c."""
    keep = batch.mask != 0
    ratio = torch.where(keep, batch.logp.double() - batch.old_logp.double(), torch.zeros((), dtype=F64)).exp()
    edges = [1 - batch.clip_eps, 1 + (batch.clip_eps if batch.clip_eps_high is None else batch.clip_eps_high)]
    if batch.dual_clip is not None:
        edges.append(batch.dual_clip)
    band = KINK if batch.logp.dtype == F64 else 1e-4
    near = torch.zeros_like(keep)
    for edge in edges:
        near |= (ratio - edge).abs() <= band * edge
    return near


@pytest.mark.clause("CLIP-1", "CLIP-2")
@given(cs.clip_batches(loss_aggs=cs.LOSS_AGGREGATIONS), cs.norm_constants())
def test_clip_slopes(batch: cs.ClipBatch, constant: float) -> None:
    """d loss / d logp_t = -w_t * ratio_t A_t off the flat branches, 0 on them (dual-clip bound
    included), 0 off the mask; w_t the token's aggregation weight."""
    norm = constant if batch.loss_agg == "seq-mean-token-sum-norm" else None
    logp = _leaf(batch.logp)
    result = ppo_ref.policy_loss(
        logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_eps, batch.loss_agg,
        clip_eps_high=batch.clip_eps_high, dual_clip=batch.dual_clip, norm_constant=norm,
    )  # fmt: skip
    grad = _grad(result.loss, logp)
    want = oracles.clipped_policy_loss(
        batch.logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_eps, batch.clip_eps_high,
        batch.dual_clip, batch.loss_agg, tie_tol=0.0, norm_constant=norm,
    )  # fmt: skip
    weights = oracles.aggregation_weights(batch.mask, batch.loss_agg, norm)
    expected = [
        [-w * s for w, s in zip(wr, sr, strict=True)] for wr, sr in zip(weights, want.slope, strict=True)
    ]
    keep = batch.mask != 0
    _assert_close(grad, expected, keep & ~_clip_kinks(batch), batch.logp.dtype, scale=20.0 * 5.0)
    assert bool((grad[~keep] == 0).all())


def test_dual_clip_slope_is_zero_beyond_c_and_clip_higher_moves_the_upper_kink() -> None:
    """One token each: A = -2 at ratio 4 > c = 3 is flat (the loss is -cA whatever logp); A = 1 at
    ratio 1.25 is flat under the symmetric 0.2 and has slope 1.25 under clip_eps_high = 0.28."""
    old, mask = torch.zeros(1, 1, dtype=F64), torch.ones(1, 1)
    logp = _leaf(torch.tensor([[math.log(4.0)]], dtype=F64))
    result = ppo_ref.policy_loss(logp, old, torch.tensor([[-2.0]], dtype=F64), mask, 0.2, dual_clip=3.0)
    assert float(result.loss.detach()) == pytest.approx(6.0) and float(_grad(result.loss, logp)) == 0.0
    assert float(result.dual_clip_frac) == 1.0
    single = ppo_ref.policy_loss(_leaf(logp), old, torch.tensor([[-2.0]], dtype=F64), mask, 0.2)
    assert float(single.loss.detach()) == pytest.approx(8.0)
    logp = _leaf(torch.tensor([[math.log(1.25)]], dtype=F64))
    symmetric = ppo_ref.policy_loss(logp, old, torch.ones(1, 1, dtype=F64), mask, 0.2)
    assert float(_grad(symmetric.loss, logp)) == 0.0 and float(symmetric.clipfrac) == 1.0
    higher = ppo_ref.policy_loss(logp, old, torch.ones(1, 1, dtype=F64), mask, 0.2, clip_eps_high=0.28)
    assert float(_grad(higher.loss, logp)) == pytest.approx(-1.25) and float(higher.clipfrac) == 0.0


# --- GSPO-2 ---------------------------------------------------------------------------------------


def gspo_token_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps: float,
    eps_high: float,
    loss_agg: str,
) -> Tensor:
    """GSPO-token (Zheng et al. 2025, eq. 13): s_{i,t} = sg[s_i] * pi_t / sg[pi_t], clipped per token
    and aggregated with ``loss_agg``."""
    keep = mask != 0
    zero = torch.zeros((), dtype=logp.dtype)
    log_ratio = torch.where(keep, logp - old_logp, zero)
    n = keep.sum(dim=1).clamp(min=1)
    seq = (log_ratio.sum(dim=1) / n).detach()
    kept_logp = torch.where(keep, logp, zero)
    token_ratio = torch.exp(seq.unsqueeze(1) + kept_logp - kept_logp.detach())
    adv = advantages.unsqueeze(1).expand_as(token_ratio)
    objective = torch.minimum(token_ratio * adv, token_ratio.clamp(1 - eps, 1 + eps_high) * adv)
    return -ppo_ref.aggregate_loss(objective, keep, loss_agg)


@pytest.mark.clause("GSPO-2")
@given(cs.gspo_batches())
def test_gspo_gradient_is_the_gspo_token_form_under_seq_mean_token_mean(batch: cs.GSPOBatch) -> None:
    high = batch.clip_eps if batch.clip_eps_high is None else batch.clip_eps_high
    logp = _leaf(batch.logp)
    loss = ppo_ref.gspo_loss(
        logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_eps, clip_eps_high=high
    ).loss
    grad = _grad(loss, logp)
    token_logp = _leaf(batch.logp)
    token = gspo_token_loss(
        token_logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_eps, high, "seq-mean-token-mean"
    )
    token_grad = _grad(token, token_logp)
    dtype = batch.logp.dtype
    want = oracles.gspo_loss(
        batch.logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_eps, high, 0.0
    )
    keep = batch.mask != 0
    # Rows whose sequence ratio sits on a clip boundary have a one-sided slope: leave them out.
    edge = torch.zeros_like(keep)
    band = 1e-4 if dtype == torch.float32 else KINK
    for b, s in enumerate(want.seq_ratios):
        if (
            s is not None
            and min(abs(s - (1 - batch.clip_eps)), abs(s - (1 + high))) <= band * batch.logp.shape[1]
        ):
            edge[b] = True
    compare = keep & ~edge
    oracles.assert_close_to_oracle(token.detach(), float(loss.detach()), dtype, scale=5.0 * math.e)
    _assert_close(grad, want.gradient, compare, dtype, scale=5.0 * math.e)
    _assert_close(token_grad, grad.detach(), compare, dtype, scale=5.0 * math.e)
    assert bool((grad[~keep] == 0).all())


def test_gspo_token_form_differs_under_token_mean_on_unequal_lengths() -> None:
    """Rows of 1 and 3 tokens: seq-mean-token-mean gives each row weight 1/2, token-mean gives the
    long row 3/4 of the gradient (TRL #3823: GSPO run with token-mean is not GSPO)."""
    logp = torch.tensor([[-1.0, 0.0, 0.0], [-1.2, -0.8, -1.1]], dtype=F64)
    old = logp - 0.01
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([1.0, 1.0], dtype=F64)
    leaf = _leaf(logp)
    gspo = _grad(ppo_ref.gspo_loss(leaf, old, adv, mask, 0.2).loss, leaf)
    token_mean = _leaf(logp)
    wrong = _grad(gspo_token_loss(token_mean, old, adv, mask, 0.2, 0.2, "token-mean"), token_mean)
    s = math.exp(0.01)
    assert gspo.flatten().tolist() == pytest.approx([-s / 2, 0, 0, -s / 6, -s / 6, -s / 6])
    assert wrong.flatten().tolist() == pytest.approx([-s / 4, 0, 0, -s / 4, -s / 4, -s / 4])
    assert float(gspo[1].sum()) != pytest.approx(float(wrong[1].sum()))


# --- CISPO-1 --------------------------------------------------------------------------------------


@pytest.mark.clause("CISPO-1")
@given(cs.cispo_batches(), cs.norm_constants())
def test_cispo_gradient_is_minus_weight_times_advantage_on_every_action_token(
    batch: cs.CISPOBatch, constant: float
) -> None:
    norm = batch.norm_constant
    logp = _leaf(batch.logp)
    result = ppo_ref.cispo_loss(
        logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_low, batch.clip_high, batch.loss_agg,
        norm_constant=norm,
    )  # fmt: skip
    grad = _grad(result.loss, logp)
    keep = batch.mask != 0
    ratio = torch.where(keep, batch.logp.double() - batch.old_logp.double(), torch.zeros((), dtype=F64)).exp()
    weight = ratio.clamp(min=1 - batch.clip_low, max=1 + batch.clip_high)
    adv = torch.where(keep, batch.advantages.double(), torch.zeros((), dtype=F64))
    agg = torch.tensor(oracles.aggregation_weights(batch.mask, batch.loss_agg, norm), dtype=F64)
    expected = -weight * adv * agg
    _assert_close(grad, expected, keep, batch.logp.dtype, scale=(1 + batch.clip_high) * 5.0)
    # Clipped tokens keep their gradient (PPO-Clip would zero them): every token with A != 0 has one.
    moving = keep & (adv != 0) & (weight > 0)
    assert bool((grad[moving] != 0).all())
    assert bool((grad[~keep] == 0).all())


# --- KLL-1, KLL-2 ---------------------------------------------------------------------------------


@pytest.mark.clause("KLL-1")
@given(cs.kl_loss_batches(loss_aggs=("token-mean",)))
def test_kl_loss_slope_per_estimator(batch: cs.KLLossBatch) -> None:
    logp = _leaf(batch.logp)
    grad = _grad(ppo_ref.kl_loss(logp, batch.ref_logp, batch.mask, batch.estimator), logp)
    keep = batch.mask != 0
    n = max(int(keep.sum()), 1)
    delta = torch.where(keep, batch.logp.double() - batch.ref_logp.double(), torch.zeros((), dtype=F64))
    slope = {
        "k1": torch.ones_like(delta),
        "k2": delta,
        "k3": 1 - torch.exp(-delta),
        "k3+": delta,
    }[batch.estimator]
    _assert_close(grad, slope / n, keep, batch.logp.dtype, scale=math.exp(cs.LOG_RATIO_MAX))
    assert bool((grad[~keep] == 0).all())


def _categorical(theta: Tensor) -> Tensor:
    return torch.log_softmax(theta, dim=0)


def _per_action_gradients(theta: Tensor, ref: Tensor, estimator: str) -> Tensor:
    """(V, V): row a is d l(a) / d theta, l(a) the kl_loss of one sampled token a."""
    rows = []
    for a in range(theta.shape[0]):
        leaf = _leaf(theta)
        logp = _categorical(leaf)[a].reshape(1, 1)
        loss = ppo_ref.kl_loss(logp, ref[a].reshape(1, 1), torch.ones(1, 1), estimator)
        rows.append(_grad(loss, leaf))
    return torch.stack(rows)


def _analytic_kl_gradients(theta: Tensor, ref: Tensor) -> tuple[Tensor, Tensor]:
    """(grad KL(pi || pi_ref), grad KL(pi_ref || pi)) with respect to theta, pi = softmax(theta)."""
    leaf = _leaf(theta)
    logp = _categorical(leaf)
    forward = _grad((logp.exp() * (logp - ref)).sum(), leaf)
    leaf = _leaf(theta)
    reverse = _grad((ref.exp() * (ref - _categorical(leaf))).sum(), leaf)
    return forward, reverse


EXPECTED_GRADIENT = {"k1": "zero", "k2": "forward", "k3": "reverse", "k3+": "forward"}
"""What E_{a ~ pi}[grad l(a)] equals, per estimator (KLL-2)."""


@pytest.mark.clause("KLL-2")
@given(
    st.integers(2, 6).flatmap(
        lambda v: st.tuples(cs.float_tensors((v,), F64, -2.0, 2.0), cs.float_tensors((v,), F64, -2.0, 2.0))
    ),
    st.sampled_from(cs.KL_LOSS_ESTIMATORS),
)
def test_expected_gradient_on_a_categorical_distribution(
    logits: tuple[Tensor, Tensor], estimator: str
) -> None:
    """sum_a pi(a) grad l(a), exactly: k2 and k3+ give grad KL(pi || pi_ref) (unbiased as a loss),
    k1 gives 0, k3 gives grad KL(pi_ref || pi); and E[k1] = E[k3] = KL(pi || pi_ref) as values."""
    theta, ref_logits = logits
    ref = _categorical(ref_logits)
    pi = _categorical(theta).exp()
    expected_grad = (pi.unsqueeze(1) * _per_action_gradients(theta, ref, estimator)).sum(dim=0)
    forward, reverse = _analytic_kl_gradients(theta, ref)
    target = {"zero": torch.zeros_like(forward), "forward": forward, "reverse": reverse}[
        EXPECTED_GRADIENT[estimator]
    ]
    torch.testing.assert_close(expected_grad, target, rtol=1e-9, atol=1e-9)
    if estimator in ("k1", "k3"):
        logp = _categorical(theta)
        kl = float((pi * (logp - ref)).sum())
        values = torch.stack(
            [
                ppo_ref.kl_loss(logp[a].reshape(1, 1), ref[a].reshape(1, 1), torch.ones(1, 1), estimator)
                for a in range(len(pi))
            ]
        )
        assert float((pi * values).sum()) == pytest.approx(kl, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("estimator", cs.KL_LOSS_ESTIMATORS)
def test_monte_carlo_expected_gradient(estimator: str) -> None:
    """The same by sampling: 200 000 tokens a ~ pi (seed 0) in one (N, 1) batch, token-mean, so
    the gradient of the loss is the sample mean of grad l(a). Tolerance: 5 standard errors per
    component (computed exactly from the per-action gradients), i.e. a false alarm rate < 1e-5."""
    theta = torch.tensor([0.8, -0.3, 0.1, -1.2], dtype=F64)
    ref = _categorical(torch.tensor([0.0, 0.5, -0.7, 0.3], dtype=F64))
    pi = _categorical(theta).exp()
    samples = torch.multinomial(pi, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    leaf = _leaf(theta)
    logp = _categorical(leaf)[samples].reshape(-1, 1)
    loss = ppo_ref.kl_loss(logp, ref[samples].reshape(-1, 1), torch.ones_like(logp), estimator)
    sampled = _grad(loss, leaf)
    per_action = _per_action_gradients(theta, ref, estimator)
    mean = (pi.unsqueeze(1) * per_action).sum(dim=0)
    stderr = ((pi.unsqueeze(1) * (per_action - mean) ** 2).sum(dim=0) / samples.numel()).sqrt()
    forward, reverse = _analytic_kl_gradients(theta, ref)
    target = {"zero": torch.zeros_like(forward), "forward": forward, "reverse": reverse}[
        EXPECTED_GRADIENT[estimator]
    ]
    assert bool(((sampled - target).abs() <= 5 * stderr + 1e-12).all()), (sampled, target, stderr)
    if estimator == "k3":  # and k3 is *not* an estimate of grad KL(pi || pi_ref) on this example
        assert bool(((sampled - forward).abs() > 5 * stderr).any())


# --- IS-3 -----------------------------------------------------------------------------------------


@pytest.mark.clause("IS-3")
@given(cs.correction_batches())
def test_rollout_weights_carry_no_gradient(batch: cs.CorrectionBatch) -> None:
    """Multiplying a loss by the weights leaves the gradient with respect to logp the weights'
    multiple of the loss's own: the weights are constants (no path through logp or rollout_logp)."""
    low = None if batch.low is None or batch.low > batch.high else batch.low
    logp, rollout = _leaf(batch.logp), _leaf(batch.rollout_logp)
    weights = ppo_ref.rollout_correction(logp, rollout, batch.mask, level=batch.level, mode=batch.mode,
                                         high=batch.high, low=low)  # fmt: skip
    assert not weights.requires_grad
    keep = batch.mask != 0
    per_token = torch.where(keep, logp, torch.zeros((), dtype=logp.dtype))
    grad = _grad((weights * per_token).sum(), logp)
    assert torch.equal(grad[keep], weights[keep].to(grad.dtype))
