"""Mutants of the KL loss (KLL-1..3): value, gradient and aggregation of the KL-as-a-loss term."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import ppo_ref
from tests.mutants.base import MutantSpec, bool_mask, work_dtype

K3_DELTA_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


def _delta(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(bool mask, logp - ref_logp zeroed off the mask) in the working dtype."""
    keep = bool_mask(mask)
    dtype = work_dtype(logp, ref_logp)
    zero = torch.zeros((), dtype=dtype)
    return keep, torch.where(keep, logp.to(dtype), zero) - torch.where(keep, ref_logp.to(dtype), zero)


def _per_token(delta: Tensor, estimator: str) -> Tensor:
    """The reference's per-token terms (value and gradient) of ``estimator``."""
    if estimator == "k1":
        return delta
    k2 = 0.5 * delta * delta
    if estimator == "k2":
        return k2
    k3 = torch.expm1(-delta) + delta
    return k3 if estimator == "k3" else k3.detach() + (k2 - k2.detach())


def _aggregate(per_token: Tensor, keep: Tensor, loss_agg: str, counts: dict[str, Any]) -> Tensor:
    return ppo_ref.aggregate_loss(per_token, keep, loss_agg, **counts)


# --- KLL-1: value and gradient per estimator --------------------------------------------------------


def kl_loss_without_gradient(
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
    counts: dict[str, Any] = {
        "norm_constant": norm_constant,
        "token_count": token_count,
        "row_count": row_count,
    }
    # BUG (SkyRL #1340): the KL loss is computed inside a @torch.no_grad() helper: the right value
    # and no gradient at all, so the KL coefficient does nothing
    with torch.no_grad():
        return ppo_ref.kl_loss(logp, ref_logp, mask, estimator, loss_agg, **counts)


def kl_loss_k3_clamped(
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
    counts: dict[str, Any] = {
        "norm_constant": norm_constant,
        "token_count": token_count,
        "row_count": row_count,
    }
    ppo_ref.kl_loss(logp.detach(), ref_logp, mask, estimator, loss_agg, **counts)
    keep, delta = _delta(logp, ref_logp, mask)
    if estimator not in ("k3", "k3+"):
        return _aggregate(_per_token(delta, estimator), keep, loss_agg, counts)
    # BUG (verl #2928): low_var_kl clamps the log-ratio to +-20 and k3 to [-10, 10]: past the clamp
    # the value is capped and the gradient is 0
    delta = delta.clamp(-K3_DELTA_CLAMP, K3_DELTA_CLAMP)
    k3 = (torch.expm1(-delta) + delta).clamp(-K3_VALUE_CLAMP, K3_VALUE_CLAMP)
    if estimator == "k3+":
        k2 = 0.5 * delta * delta
        k3 = k3.detach() + (k2 - k2.detach())
    return _aggregate(k3, keep, loss_agg, counts)


def kl_loss_k3_sign_flipped(
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
    counts: dict[str, Any] = {
        "norm_constant": norm_constant,
        "token_count": token_count,
        "row_count": row_count,
    }
    ppo_ref.kl_loss(logp.detach(), ref_logp, mask, estimator, loss_agg, **counts)
    keep, delta = _delta(logp, ref_logp, mask)
    if estimator not in ("k3", "k3+"):
        return _aggregate(_per_token(delta, estimator), keep, loss_agg, counts)
    # BUG (KLL-1): k3 of the ratio the wrong way up, e^delta - 1 - delta (the ratio pi / pi_ref
    # where k3 needs pi_ref / pi): an estimate of KL(pi_ref || pi) with gradient e^delta - 1
    k3 = torch.expm1(delta) - delta
    if estimator == "k3+":
        k2 = 0.5 * delta * delta
        k3 = k3.detach() + (k2 - k2.detach())
    return _aggregate(k3, keep, loss_agg, counts)


# --- KLL-2: the expected gradient -------------------------------------------------------------------


def kl_loss_k3_plus_is_k3(
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
    counts: dict[str, Any] = {
        "norm_constant": norm_constant,
        "token_count": token_count,
        "row_count": row_count,
    }
    # BUG (TRL #4967, OpenRLHF PR #1309): k3 backpropagated as it is: the value of k3+ but the
    # gradient 1 - e^-delta, whose expectation under pi is the gradient of KL(pi_ref || pi), not of
    # KL(pi || pi_ref)
    name = "k3" if estimator == "k3+" else estimator
    ppo_ref.kl_loss(logp.detach(), ref_logp, mask, estimator, loss_agg, **counts)
    return ppo_ref.kl_loss(logp, ref_logp, mask, name, loss_agg, **counts)


# --- KLL-3: aggregation and masked-out tokens -------------------------------------------------------


def kl_loss_ignores_loss_agg(
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
    counts: dict[str, Any] = {
        "norm_constant": norm_constant,
        "token_count": token_count,
        "row_count": row_count,
    }
    ppo_ref.kl_loss(logp.detach(), ref_logp, mask, estimator, loss_agg, **counts)
    # BUG (TRL #2995): the KL term is always a token-mean over this call's tokens, whatever
    # aggregation (and counts) the policy loss uses: the two terms are normalised differently
    return ppo_ref.kl_loss(logp, ref_logp, mask, estimator)


def kl_loss_over_padding(
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
    counts: dict[str, Any] = {
        "norm_constant": norm_constant,
        "token_count": token_count,
        "row_count": row_count,
    }
    reference = ppo_ref.kl_loss(logp.detach(), ref_logp, mask, estimator, loss_agg, **counts)
    if loss_agg != "token-mean" or token_count is not None:
        return ppo_ref.kl_loss(logp, ref_logp, mask, estimator, loss_agg, **counts)
    keep, delta = _delta(logp, ref_logp, mask)
    per_token = _per_token(delta, estimator)
    if not per_token.numel():
        return reference
    # BUG (KLL-3): (kl * mask).mean(): the masked terms averaged over every position of the padded
    # batch, so padding counts as tokens with zero KL and dilutes the penalty (TRL #6809's pattern)
    return (per_token * keep.to(per_token.dtype)).mean()


# --- specs ------------------------------------------------------------------------------------------


def _kl(
    deltas: list[list[float]],
    estimator: str,
    mask: list[list[int]] | None = None,
    loss_agg: str = "token-mean",
) -> dict[str, Any]:
    """kl_loss inputs with the given log-ratios on the mask (ref_logp = -2; padding differs too)."""
    delta = torch.tensor(deltas, dtype=torch.float64)
    ref_logp = torch.full_like(delta, -2.0)
    keep = torch.ones_like(delta, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool)
    logp = torch.where(keep, ref_logp + delta, torch.full_like(delta, -0.5))
    return {
        "logp": logp.requires_grad_(),
        "ref_logp": ref_logp,
        "mask": keep.long(),
        "estimator": estimator,
        "loss_agg": loss_agg,
    }


SPECS: tuple[MutantSpec, ...] = (
    MutantSpec(
        "SkyRL1340-kl-loss-without-gradient",
        "SkyRL#1340",
        "kl_loss",
        "the KL loss computed under torch.no_grad(): the right value and no gradient",
        None,
        kl_loss_without_gradient,
        shows_on=lambda: _kl([[0.5, -0.3]], "k3"),
        clause="KLL-1",
    ),
    MutantSpec(
        "verl2928-kl-loss-k3-clamped",
        "verl#2928",
        "kl_loss",
        "k3 from a log-ratio clamped to +-20, itself clamped to [-10, 10] (verl low_var_kl)",
        "k3 or k3+ with a token whose k3 exceeds 10 (log-ratio below about -2.9)",
        kl_loss_k3_clamped,
        shows_on=lambda: _kl([[0.5, -4.0]], "k3"),
        hides_on=lambda: _kl([[0.5, -2.0]], "k3"),
        clause="KLL-1",
    ),
    MutantSpec(
        "KLL1-k3-ratio-inverted",
        "KLL-1",
        "kl_loss",
        "k3 = e^delta - 1 - delta: the ratio the wrong way up (value and gradient of KL(pi_ref || pi))",
        None,
        kl_loss_k3_sign_flipped,
        shows_on=lambda: _kl([[0.5, -0.3]], "k3"),
        clause="KLL-1",
    ),
    MutantSpec(
        "TRL4967-k3-plus-backprops-k3",
        "TRL#4967",
        "kl_loss",
        "k3+ backpropagated as k3: the value of k3, the gradient 1 - e^-delta instead of delta",
        "estimator='k3+' away from pi = pi_ref (gradient only; to first order in delta they agree)",
        kl_loss_k3_plus_is_k3,
        shows_on=lambda: _kl([[0.5, -0.3]], "k3+"),
        hides_on=lambda: _kl([[1e-5, -2e-5]], "k3+"),
        clause="KLL-2",
    ),
    MutantSpec(
        "TRL2995-kl-loss-ignores-loss-agg",
        "TRL#2995",
        "kl_loss",
        "the KL loss is always a token-mean over the call's tokens, whatever loss_agg and counts say",
        "a seq-mean aggregation with rows of unequal length (or whole-batch counts)",
        kl_loss_ignores_loss_agg,
        shows_on=lambda: _kl(
            [[0.5, -0.3, 0.0], [0.2, 0.0, 0.0]], "k3", [[1, 1, 0], [1, 0, 0]], "seq-mean-token-mean"
        ),
        hides_on=lambda: _kl(
            [[0.5, -0.3, 0.0], [0.2, 0.1, 0.0]], "k3", [[1, 1, 0], [1, 1, 0]], "seq-mean-token-mean"
        ),
        clause="KLL-3",
    ),
    MutantSpec(
        "KLL3-kl-loss-averaged-over-padding",
        "KLL-3",
        "kl_loss",
        "(kl * mask).mean(): token-mean over every position of the padded batch",
        "token-mean over a mask with padding or holes",
        kl_loss_over_padding,
        shows_on=lambda: _kl([[0.5, -0.3, 0.0], [0.2, 0.0, 0.0]], "k2", [[1, 1, 0], [1, 0, 0]]),
        hides_on=lambda: _kl([[0.5, -0.3, 0.7], [0.2, 0.1, -0.4]], "k2"),
        clause="KLL-3",
    ),
)
