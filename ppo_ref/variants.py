"""Policy losses other than PPO-Clip that trainers run today: GSPO and CISPO (spec GSPO-*, CISPO-*)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ppo_ref._validate import check_finite_where, check_float, check_real, check_rows
from ppo_ref.aggregation import _PER_ROW, _count, _reduce, check_aggregation
from ppo_ref.losses import _pair_kl
from ppo_ref.masked import masked_sum

__all__ = ["CISPOLossResult", "GSPOLossResult", "RatioLossResult", "cispo_loss", "gspo_loss"]


@dataclass(frozen=True)
class RatioLossResult:
    """What :func:`gspo_loss` and :func:`cispo_loss` return. Every field is a 0-dim tensor; only
    ``loss`` has a graph.

    Attributes:
        loss: the loss, to minimise; differentiable in ``logp``.
        clipfrac: GSPO: share of sequences (rows with an action token) on the flat branch; CISPO:
            share of action tokens whose weight the clip changed (ρ outside the bounds).
        ratio_mean: GSPO: mean of the sequence ratios s_i over those rows; CISPO: masked mean of
            the token ratio ρ.
        ratio_max: the largest of those ratios (0 for a batch without an action token).
        approx_kl: masked token-mean of ``(ρ - 1) - log ρ``, as in :func:`ppo_ref.policy_loss`.
    """

    loss: Tensor
    clipfrac: Tensor
    ratio_mean: Tensor
    ratio_max: Tensor
    approx_kl: Tensor


GSPOLossResult = RatioLossResult
"""The name :func:`gspo_loss`'s result had before GSPO and CISPO shared one type (kept for imports)."""

CISPOLossResult = RatioLossResult
"""The name :func:`cispo_loss`'s result had before GSPO and CISPO shared one type (kept for imports)."""


def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    *,
    clip_eps_high: float | None = None,
    row_count: int | Tensor | None = None,
) -> RatioLossResult:
    r"""Group Sequence Policy Optimization: a clipped sequence ratio (arXiv 2507.18071).

    .. math:: s_i = \exp\Big(\frac{1}{|y_i|}\sum_{t \in y_i} \big(\log\pi(a_t) - \log\pi_{old}(a_t)\big)\Big),
              \qquad o_i = \min\big(s_i A_i,\ \operatorname{clip}(s_i, 1-\epsilon, 1+\epsilon_h) A_i\big),
              \qquad \text{loss} = -\frac{1}{R}\sum_i o_i

    over the R rows with at least one action token (``row_count``: the whole batch's R, for a call
    on one micro-batch). ``logp``, ``old_logp`` and ``mask`` are (B, T); ``advantages`` is (B,), one
    per sequence; ``clip_eps`` > 0 and ``clip_eps_high`` (None: the same) are the clip offsets
    (the paper uses 3e-4 and 4e-4). The ratio is the geometric mean of the token ratios, so a
    sequence's length does not change its scale.

    Gradient: :math:`\partial o_i/\partial \log\pi(a_t) = s_i A_i / |y_i|` on the unclipped branch,
    0 on the flat one. This equals the GSPO-token form (:math:`\log s_{i,t} = \mathrm{sg}[\log s_i]
    + \log\pi_t - \mathrm{sg}[\log\pi_t]`, the paper's GSPO-token) aggregated with
    ``seq-mean-token-mean``, in value and gradient; under ``token-mean`` the two differ (long
    sequences weigh more).

    Example (one row of two tokens with log-ratios 0.1 and 0.3: s = e^0.2 = 1.2214, clipped to 1.2)::

        >>> r = gspo_loss(torch.tensor([[0.1, 0.3]]), torch.zeros(1, 2), torch.tensor([1.0]),
        ...               torch.ones(1, 2), clip_eps=0.2)
        >>> r.loss, r.clipfrac
        (tensor(-1.2000), tensor(1.))
    """
    # The k3 terms' sum (0 off the mask, where the log-ratio is 0) is the approx-KL statistic and
    # proves logp and old_logp finite (an inf or NaN log-ratio makes its term inf or NaN).
    keep, _, log_ratio, zero, kl_sum, weights = _pair_kl(logp, old_logp, mask)
    eps = check_real(clip_eps, "clip_eps", low=0.0, low_open=True)
    eps_high = (
        eps if clip_eps_high is None else check_real(clip_eps_high, "clip_eps_high", low=0.0, low_open=True)
    )
    _, _, rows_total = check_aggregation(keep, "seq-mean-token-mean", None, None, row_count)
    adv = check_rows(advantages, "advantages", keep.shape[0]).to(log_ratio.dtype)
    row_tokens = _count(keep, weights, dim=1)
    nonempty = row_tokens > 0
    # log_ratio is 0 off the mask, so its row sums are the masked row sums.
    seq_log_ratio = log_ratio.sum(dim=1) / row_tokens.clamp(min=1)
    seq_ratio = torch.exp(seq_log_ratio)
    unclipped = seq_ratio * adv
    clipped = torch.clamp(seq_ratio, 1.0 - eps, 1.0 + eps_high) * adv
    objective = torch.minimum(unclipped, clipped)
    rows = rows_total if rows_total is not None else nonempty.sum().clamp(min=1)
    loss = -masked_sum(objective, nonempty) / rows
    with torch.no_grad():
        seqs = nonempty.sum().clamp(min=1)
        kept_ratio = torch.where(nonempty, seq_ratio, zero)
        return RatioLossResult(
            loss=loss,
            clipfrac=torch.count_nonzero(nonempty & (clipped < unclipped)).to(zero.dtype) / seqs,
            ratio_mean=kept_ratio.sum() / seqs,
            ratio_max=kept_ratio.amax() if kept_ratio.numel() else zero,
            approx_kl=kl_sum / row_tokens.sum().clamp(min=1),
        )


def cispo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    loss_agg: str = "token-mean",
    *,
    norm_constant: float | None = None,
    token_count: int | Tensor | None = None,
    row_count: int | Tensor | None = None,
) -> RatioLossResult:
    r"""Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv 2506.13585): clip the weight, not the update.

    .. math:: \ell_t = -\,\mathrm{sg}\big[\operatorname{clip}(\rho_t, 1 - \epsilon_{low},
              1 + \epsilon_{high})\big]\, A_t \log\pi(a_t),
              \qquad \text{loss} = \operatorname{aggregate}(\ell)

    The weight is detached, so every action token keeps a gradient :math:`-w_t A_t` in
    ``logp`` (PPO-Clip would drop the clipped ones). Shapes as in :func:`ppo_ref.policy_loss`:
    ``logp``, ``old_logp``, ``advantages``, ``mask`` are (B, T). ``clip_low`` and ``clip_high``
    (>= 0) are offsets from 1 (the reference parametrisation, verl's); a lower bound
    ``1 - clip_low <= 0`` means none. ScaleRL's [0, 5] is ``clip_low=1, clip_high=4``. Other
    libraries parametrise differently (TRL: an absolute cap ``min(ρ, ε_high)``; skyrl-train 0.3.1's
    defaults 0 and 5 give [1, 6]): declared conventions, see the spec's CISPO-2. ``loss_agg`` and
    its keywords as in :func:`ppo_ref.aggregate_loss`.

    Example (ρ = 2 clipped to 1.2, A = 1, logp = ln 0.5: loss = -1.2 * ln 0.5, gradient -1.2)::

        >>> logp = torch.tensor([[0.5]]).log().requires_grad_()
        >>> r = cispo_loss(logp, logp.detach() - torch.tensor(2.0).log(), torch.ones(1, 1),
        ...                torch.ones(1, 1), clip_low=0.2, clip_high=0.2)
        >>> r.loss.backward(); r.loss.detach(), logp.grad
        (tensor(0.8318), tensor([[-1.2000]]))
    """
    # k3 terms (0 off the mask): the approx-KL statistic, and the proof that logp and old_logp are
    # finite on the mask (see gspo_loss).
    keep, kept_logp, log_ratio, zero, kl_sum, weights = _pair_kl(logp, old_logp, mask)
    low = check_real(clip_low, "clip_low", low=0.0)
    high = check_real(clip_high, "clip_high", low=0.0)
    constant, tokens_total, rows_total = check_aggregation(
        keep, loss_agg, norm_constant, token_count, row_count
    )
    check_float(advantages, "advantages", shape=keep.shape)
    dtype = log_ratio.dtype
    with torch.no_grad():
        ratio = torch.exp(log_ratio)
        weight = torch.clamp(ratio, min=1.0 - low, max=1.0 + high)
    # The advantages zeroed off the mask by the weights (see _pair_kl); where if the sum is not
    # finite. Off the mask adv = 0 and kept_logp is finite (or 0, from _pair_kl's fallback), so
    # per_token is 0 there and its sums are the masked sums.
    adv = advantages.to(dtype) * weights
    row_sums, total = _cispo_terms(weight, adv, kept_logp, loss_agg)
    if not bool(torch.isfinite(total.detach())):
        adv = torch.where(keep, advantages, torch.zeros((), dtype=advantages.dtype, device=advantages.device))
        row_sums, total = _cispo_terms(weight, adv.to(dtype), kept_logp, loss_agg)
        # An inf or NaN advantage on the mask makes its term inf or NaN (the weight and logp are
        # finite there), so a finite sum proves the advantages finite; otherwise check them one by
        # one.
        if not bool(torch.isfinite(total.detach())):
            check_finite_where(advantages, keep, "advantages")
    loss = _reduce(keep, loss_agg, constant, tokens_total, rows_total, total, row_sums, weights)
    with torch.no_grad():
        tokens = _count(keep, weights).clamp(min=1)
        kept_ratio = ratio * weights  # ratio is exactly 1 off the mask: 1 * 0 = +0, as where gives
        # Off the mask ratio = 1 = weight (1 is inside [1 - low, 1 + high]): no mask needed.
        return RatioLossResult(
            loss=loss,
            clipfrac=torch.count_nonzero(weight != ratio).to(zero.dtype) / tokens,
            ratio_mean=kept_ratio.sum() / tokens,
            ratio_max=kept_ratio.amax() if ratio.numel() else zero,
            approx_kl=kl_sum / tokens,
        )


def _cispo_terms(
    weight: Tensor, adv: Tensor, kept_logp: Tensor, loss_agg: str
) -> tuple[Tensor | None, Tensor]:
    """The row sums (per-row modes) and the sum of CISPO's per-token terms ``-w A log pi``.

    Computed as ``0 - sum(w A log pi)``: rounding is symmetric, so this is ``sum(-w A log pi)``
    bit for bit (a zero sum is +0 both ways), gradient included, without a pass to negate ``w``.
    """
    per_token = weight * adv * kept_logp
    if loss_agg in _PER_ROW:
        row_sums = 0.0 - per_token.sum(dim=1)
        return row_sums, row_sums.sum()
    return None, 0.0 - per_token.sum()
