"""KL to the reference as a loss term, instead of in the reward (spec KLL-1..3)."""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from ppo_ref._validate import check_finite_where, check_float, check_mask, compute_dtype
from ppo_ref.aggregation import _reduce, _sums, check_aggregation, mask_weights

__all__ = ["KL_LOSS_ESTIMATORS", "KLLossEstimator", "kl_loss"]

KLLossEstimator = Literal["k1", "k2", "k3", "k3+"]
KL_LOSS_ESTIMATORS: tuple[str, ...] = get_args(KLLossEstimator)


def kl_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    estimator: str,
    loss_agg: str = "token-mean",
    *,
    norm_constant: float | None = None,
    token_count: int | Tensor | None = None,
    row_count: int | Tensor | None = None,
) -> Tensor:
    r"""The KL penalty as a differentiable loss, to add to the policy loss (spec KLL-1..3).

    With :math:`\delta_t = \log\pi(a_t) - \log\pi_{ref}(a_t)` on the sampled tokens:

    ==========  ==========================  ==================================  ==================
    estimator   value per token             gradient in ``logp``                as a loss
    ==========  ==========================  ==================================  ==================
    ``k1``      :math:`\delta`              :math:`1`                           E[∇] = 0: no pull
    ``k2``      :math:`\tfrac12\delta^2`    :math:`\delta`                      ∇ KL(π ‖ π_ref)
    ``k3``      :math:`e^{-\delta}-1+\delta` :math:`1 - e^{-\delta}`             ∇ KL(π_ref ‖ π)
    ``k3+``     k3's value                  k2's, :math:`\delta` (straight-      ∇ KL(π ‖ π_ref)
                                            through)
    ==========  ==========================  ==================================  ==================

    The last column is the expectation over :math:`a \sim \pi` of the gradient (KLL-2): the score
    function gives :math:`\nabla KL(\pi\|\pi_{ref}) = E_\pi[\delta\,\nabla\log\pi]`, so only an
    estimator whose gradient in ``logp`` is :math:`\delta` (``k2``, ``k3+``) is unbiased as a loss,
    while ``k1`` and ``k3`` are unbiased estimates of the *value* and belong in the reward (verl's
    ``k3+``; TRL #4967, OpenRLHF PR #1309; arXiv 2510.01555).

    ``logp`` (differentiable) and ``ref_logp`` are (B, T); ``mask`` (B, T); the per-token values are
    reduced with ``loss_agg`` and its keywords as in :func:`ppo_ref.aggregate_loss`. Returns 0-dim;
    multiply by the KL coefficient outside.

    Example (δ = ln 2 on one token: k3 = 0.5 - 1 + ln 2 = 0.1931, gradient 1 - 0.5)::

        >>> logp = torch.tensor([[2.0]]).log().requires_grad_()
        >>> loss = kl_loss(logp, torch.zeros(1, 1), torch.ones(1, 1), "k3")
        >>> loss.backward(); loss.detach(), logp.grad
        (tensor(0.1931), tensor([[0.5000]]))
    """
    keep = check_mask(mask)
    check_float(logp, "logp", shape=keep.shape)
    check_float(ref_logp, "ref_logp", shape=keep.shape)
    if estimator not in KL_LOSS_ESTIMATORS:
        raise ValueError(f"estimator: expected one of {KL_LOSS_ESTIMATORS}, got {estimator!r}")
    constant, tokens_total, rows_total = check_aggregation(
        keep, loss_agg, norm_constant, token_count, row_count
    )
    dtype = compute_dtype(logp, ref_logp)
    weights = mask_weights(keep, dtype)
    # (logp - ref_logp) * weights: on the mask the same difference as zeroing each input with
    # where first; off it a zero (of either sign), unless an input is inf or NaN there: the sum
    # is then non-finite and the computation is redone with where, as before.
    if estimator == "k1":
        row_sums, total = _sums((logp.to(dtype) - ref_logp.to(dtype)) * weights, loss_agg)
    else:
        # k2 and k3 read -delta, computed as (ref_logp - logp) * weights: a - b = -(b - a) exactly,
        # so these are the same numbers, gradients included, without a pass to negate delta.
        row_sums, total = _sums(
            _even_terms((ref_logp.to(dtype) - logp.to(dtype)) * weights, estimator), loss_agg
        )
    if not bool(torch.isfinite(total.detach())):
        zero = torch.zeros((), dtype=dtype, device=keep.device)
        delta = torch.where(keep, logp.to(dtype), zero) - torch.where(keep, ref_logp.to(dtype), zero)
        row_sums, total = _terms(delta, estimator, loss_agg)
        # Off the mask delta = +0 now, so every estimator's term is exactly +0 there: per_token is
        # already masked (the sums equal the masked sums), and its sum proves the inputs finite (an
        # inf or NaN in either on the mask makes its term inf or NaN); only a non-finite sum needs
        # the entry-by-entry checks, in the order logp, ref_logp.
        if not bool(torch.isfinite(total.detach())):
            check_finite_where(logp, keep, "logp")
            check_finite_where(ref_logp, keep, "ref_logp")
    return _reduce(keep, loss_agg, constant, tokens_total, rows_total, total, row_sums, weights)


def _even_terms(neg_delta: Tensor, estimator: str) -> Tensor:
    """The k2, k3 or k3+ terms from ``-delta``: ``k3 = expm1(-delta) - (-delta)``, ``k2 =
    0.5 (-delta)^2`` (the same numbers as from ``delta``, rounding being symmetric)."""
    if estimator == "k2":
        return 0.5 * neg_delta * neg_delta
    k3 = torch.expm1(neg_delta) - neg_delta
    if estimator == "k3":
        return k3
    k2 = 0.5 * neg_delta * neg_delta
    return k3.detach() + (k2 - k2.detach())


def _terms(delta: Tensor, estimator: str, loss_agg: str) -> tuple[Tensor | None, Tensor]:
    """The row sums (per-row modes) and the sum of ``estimator``'s per-token terms at ``delta``."""
    if estimator == "k1":
        per_token = delta
    elif estimator == "k2":
        per_token = 0.5 * delta * delta
    else:
        k3 = torch.expm1(-delta) + delta
        if estimator == "k3":
            per_token = k3
        else:  # k3+: k3's value, k2's gradient
            k2 = 0.5 * delta * delta
            per_token = k3.detach() + (k2 - k2.detach())
    return _sums(per_token, loss_agg)
