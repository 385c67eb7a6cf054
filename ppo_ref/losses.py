"""PPO losses: the clipped policy objective, the value loss and PPO-Penalty (spec PG-*, VF-*, PEN-*)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from ppo_ref._validate import check_finite_where, check_float, check_mask, check_real, compute_dtype
from ppo_ref.aggregation import (
    LossAggregation,
    _count,
    aggregate,
    aggregate_loss,
    check_aggregation,
    mask_weights,
)
from ppo_ref.masked import masked_sum

__all__ = [
    "VALUE_CLIP_FORMS",
    "LossAggregation",
    "PenaltyLossResult",
    "PolicyLossResult",
    "ValueClipForm",
    "aggregate_loss",
    "policy_loss",
    "ppo_penalty_loss",
    "update_penalty_beta",
    "value_loss",
]

ValueClipForm = Literal["max", "clipped-only"]
VALUE_CLIP_FORMS: tuple[str, ...] = get_args(ValueClipForm)
"""The forms of the clipped value loss :func:`value_loss` computes (its ``clip_form``)."""


@dataclass(frozen=True)
class PolicyLossResult:
    """What :func:`policy_loss` returns. Every field is a 0-dim tensor; only ``loss`` has a graph.

    Attributes:
        loss: the PPO-Clip loss, to minimise; differentiable in ``logp``.
        clipfrac: share of action tokens on the flat (clipped) branch of the objective.
        ratio_outside_frac: share of action tokens with ``|ratio - 1| > clip_eps``.
        approx_kl: masked mean of ``(ratio - 1) - log(ratio)``, an estimate of KL(π_old ‖ π).
        ratio_mean: masked mean of the ratio.
        ratio_max: largest ratio on an action token (0 for a batch without one).
        dual_clip_frac: share of action tokens on which the dual clip binds (0 without one).
    """

    loss: Tensor
    clipfrac: Tensor
    ratio_outside_frac: Tensor
    approx_kl: Tensor
    ratio_mean: Tensor
    ratio_max: Tensor
    dual_clip_frac: Tensor


def _zeroed(x: Tensor, keep: Tensor, name: str) -> Tensor:
    """``x`` with its masked-out entries set to 0, after checking that its masked-in ones are finite.

    Zeroing comes before any arithmetic, so a NaN in a masked-out slot cannot reach a gradient. A
    finite sum of the zeroed tensor proves every masked-in entry finite; only a non-finite sum
    (which huge finite entries can also give) needs the entry-by-entry check.
    """
    zeroed = torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if not bool(torch.isfinite(zeroed.detach().sum())):
        check_finite_where(x, keep, name)
    return zeroed


def _check_pair(
    logp: Tensor, old_logp: Tensor, mask: Tensor, check_finite: bool = True
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Validate (logp, old_logp, mask); return bool mask, sanitized log-ratio, count, zero.

    With ``check_finite=False`` the caller must call :func:`_check_finite_pair` with a sum over the
    log-ratios that is inf or NaN wherever a log-ratio is.
    """
    keep, _, log_ratio, zero = _pair(logp, old_logp, mask)
    if check_finite:
        _check_finite_pair(log_ratio.detach().sum(), logp, old_logp, keep)
    return keep, log_ratio, torch.count_nonzero(keep), zero


def _pair(logp: Tensor, old_logp: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Validate the shapes and dtypes of (logp, old_logp, mask); return the bool mask, ``logp``
    zeroed off the mask in the compute dtype, the log-ratio (+0 off the mask) and a 0-dim zero.
    No finiteness check: the caller proves the inputs finite with :func:`_check_finite_pair`."""
    keep = check_mask(mask)
    check_float(logp, "logp", shape=keep.shape)
    check_float(old_logp, "old_logp", shape=keep.shape)
    kept_logp = torch.where(keep, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))
    kept_old_logp = torch.where(keep, old_logp, torch.zeros((), dtype=old_logp.dtype, device=old_logp.device))
    dtype = compute_dtype(logp, old_logp)
    zero = torch.zeros((), dtype=dtype, device=keep.device)
    kept_logp = kept_logp.to(dtype)
    return keep, kept_logp, kept_logp - kept_old_logp.to(dtype), zero


def _pair_kl(
    logp: Tensor, old_logp: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """:func:`_pair`, the sum of the k3 terms ``expm1(log_ratio) - log_ratio`` (the approx-KL
    statistic, +0 off the mask), the proof that ``logp`` and ``old_logp`` are finite on the mask
    (:func:`_check_finite_pair` with that sum), and the mask as 0/1 weights in the compute dtype.

    Returns ``(keep, kept_logp, log_ratio, zero, kl_sum, weights)``. The log-ratio is zeroed off
    the mask by multiplying with the weights, ``(logp - old_logp) * weights``: on the mask the same
    numbers as zeroing each input with ``where`` first, off it a zero (of either sign) while the
    inputs are finite there (see :func:`ppo_ref.aggregation.mask_weights`). An inf or NaN anywhere, off
    the mask included, makes the k3 sum non-finite; that redoes :func:`_pair` with ``where`` and
    checks the inputs entry by entry. So on the fast path both inputs are finite everywhere, and
    ``kept_logp`` is ``logp`` in the compute dtype, not zeroed (a caller multiplies it by something
    zeroed off the mask); on the fallback it is :func:`_pair`'s, zeroed.
    """
    keep = check_mask(mask)
    check_float(logp, "logp", shape=keep.shape)
    check_float(old_logp, "old_logp", shape=keep.shape)
    dtype = compute_dtype(logp, old_logp)
    weights = mask_weights(keep, dtype)
    kept_logp = logp.to(dtype)
    log_ratio = (kept_logp - old_logp.to(dtype)) * weights
    with torch.no_grad():
        kl_sum = torch.expm1(log_ratio).sub_(log_ratio).sum()
    if bool(torch.isfinite(kl_sum)):
        return keep, kept_logp, log_ratio, torch.zeros((), dtype=dtype, device=keep.device), kl_sum, weights
    keep, kept_logp, log_ratio, zero = _pair(logp, old_logp, mask)
    with torch.no_grad():
        # k3 terms: an inf or NaN log-ratio gives an inf or NaN term, so their sum checks the inputs.
        kl_sum = torch.expm1(log_ratio).sub_(log_ratio).sum()
    _check_finite_pair(kl_sum, logp, old_logp, keep)
    return keep, kept_logp, log_ratio, zero, kl_sum, weights


def _check_finite_pair(evidence: Tensor, logp: Tensor, old_logp: Tensor, keep: Tensor) -> None:
    """Raise for the first inf or NaN of ``logp``, then ``old_logp``, on the mask.

    ``evidence`` is a sum over the masked-in log-ratios (or a function of each that stays inf or
    NaN): an inf or NaN in either input makes its log-ratio inf or NaN, so a finite ``evidence``
    proves both finite and only a non-finite one needs the entry-by-entry checks.
    """
    if not bool(torch.isfinite(evidence)):
        check_finite_where(logp, keep, "logp")
        check_finite_where(old_logp, keep, "old_logp")


def _checked_advantages(advantages: Tensor, keep: Tensor, dtype: torch.dtype) -> Tensor:
    check_float(advantages, "advantages", shape=keep.shape)
    return _zeroed(advantages, keep, "advantages").to(dtype)


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str = "token-mean",
    *,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    norm_constant: float | None = None,
    token_count: int | Tensor | None = None,
    row_count: int | Tensor | None = None,
) -> PolicyLossResult:
    r"""The PPO-Clip loss (Schulman et al. 2017, eq. 7) and its diagnostics (spec PG-1..6, CLIP-1..3).

    .. math:: \rho_t = e^{\log\pi(a_t) - \log\pi_{old}(a_t)}, \qquad
              o_t = \min\big(\rho_t A_t,\ \operatorname{clip}(\rho_t, 1-\epsilon, 1+\epsilon_h) A_t\big),
              \qquad \text{loss} = -\operatorname{aggregate}(o)

    and with ``dual_clip = c``, for :math:`A_t < 0` only, :math:`o_t = \max(o_t, c A_t)` (Ye et al.
    2020, arXiv 1912.09729): the objective of a bad action stops falling once :math:`\rho_t > c`.

    =================  =======  ==============================================================
    argument           shape    meaning
    =================  =======  ==============================================================
    ``logp``           (B, T)   log-probs of the sampled tokens under the policy being trained
    ``old_logp``       (B, T)   the same under the policy that sampled them (no gradient)
    ``advantages``     (B, T)   advantage estimates (usually whitened GAE)
    ``mask``           (B, T)   1 on action tokens
    ``clip_eps``       > 0      ε, the lower clip offset (and the upper one unless
                                ``clip_eps_high`` is given)
    ``loss_agg``       str      see :func:`ppo_ref.aggregate_loss` (with ``norm_constant``,
                                ``token_count``, ``row_count``)
    ``clip_eps_high``  > 0      ε_h, the upper offset (DAPO's clip-higher, Yu et al. 2025,
                                arXiv 2503.14476); None: ε_h = ε
    ``dual_clip``      > 1      c; None: no dual clip
    =================  =======  ==============================================================

    Sign convention: the objective is maximised, so the loss is its negative. The gradient of
    ``o_t`` with respect to ``logp_t`` is ``ρ_t A_t`` on the unclipped branch and 0 on the flat
    ones (A > 0 and ρ > 1 + ε_h; A < 0 and ρ < 1 - ε; A < 0 and ρ > c under the dual clip).

    Diagnostics (detached, over action tokens): ``clipfrac`` is the share of tokens where the
    clipped term is the smaller, ``clip(ρ)A < ρA`` (the flat branch of the single clip);
    ``dual_clip_frac`` the share where the dual clip binds, ``A < 0`` and ``cA > min(ρA,
    clip(ρ)A)``; ``ratio_outside_frac`` the share with ρ outside ``[1 - ε, 1 + ε_h]`` whatever the
    sign of A; ``approx_kl`` the masked mean of ``(ρ - 1) - log ρ`` (k3 estimate of KL(π_old ‖ π)).

    Example (ε = 0.2: the clip table of spec PG-1)::

        >>> a = torch.tensor([[2.0, 2.0, 2.0, -2.0, -2.0]])
        >>> ratio = torch.tensor([[1.4, 1.6, 0.6, 0.6, 1.4]])
        >>> r = policy_loss(ratio.log(), torch.zeros(1, 5), a, torch.ones(1, 5), 0.2,
        ...                 loss_agg="seq-mean-token-sum")
        >>> r.loss  # -(2.4 + 2.4 + 1.2 - 1.6 - 2.8)
        tensor(-1.6000)
        >>> r = policy_loss(torch.tensor([[4.0]]).log(), torch.zeros(1, 1), torch.tensor([[-2.0]]),
        ...                 torch.ones(1, 1), 0.2, dual_clip=3.0)
        >>> r.loss, r.dual_clip_frac  # max(min(-8, -2.4), 3 * -2) = -6
        (tensor(6.), tensor(1.))
    """
    keep, _, log_ratio, zero, kl_sum, weights = _pair_kl(logp, old_logp, mask)
    eps = check_real(clip_eps, "clip_eps", low=0.0, low_open=True)
    eps_high = (
        eps if clip_eps_high is None else check_real(clip_eps_high, "clip_eps_high", low=0.0, low_open=True)
    )
    dual = None if dual_clip is None else check_real(dual_clip, "dual_clip", low=1.0, low_open=True)
    constant, tokens_total, rows_total = check_aggregation(
        keep, loss_agg, norm_constant, token_count, row_count
    )
    check_float(advantages, "advantages", shape=keep.shape)
    count = _count(keep, weights)
    ratio = torch.exp(log_ratio)
    # The advantages zeroed off the mask by the weights (see _pair_kl), with where if that gives a
    # non-finite sum below.
    adv = advantages.to(log_ratio.dtype) * weights
    unclipped, clipped, objective, dual_binds = _clip_objective(ratio, adv, eps, eps_high, dual)
    # Off the mask log_ratio = 0 and adv = 0 (both zeroed), so ratio = 1 and unclipped = clipped =
    # objective = 0 there (the dual bound c * 0 = 0 does not bind): the token-mean sum and the
    # statistics below need no mask where that holds (the same numbers as masking them, with fewer
    # passes over the batch).
    objective_sum = objective.sum()
    if not bool(torch.isfinite(objective_sum.detach())):
        adv = torch.where(keep, advantages, torch.zeros((), dtype=advantages.dtype, device=advantages.device))
        adv = adv.to(log_ratio.dtype)
        unclipped, clipped, objective, dual_binds = _clip_objective(ratio, adv, eps, eps_high, dual)
        objective_sum = objective.sum()
        # An inf or NaN advantage on the mask makes its objective inf or NaN (ratio >= 0 and the
        # clipped ratio > 0), so a finite sum proves the advantages finite; otherwise check them one
        # by one.
        if not bool(torch.isfinite(objective_sum.detach())):
            check_finite_where(advantages, keep, "advantages")
    if loss_agg == "token-mean":
        denominator = tokens_total if tokens_total is not None else count.clamp(min=1)
        loss = -(objective_sum / denominator)
    else:
        loss = -aggregate(objective, keep, loss_agg, constant, tokens_total, rows_total)
    with torch.no_grad():
        tokens = count.clamp(min=1)
        kept_ratio = ratio * weights  # ratio is exactly 1 off the mask: 1 * 0 = +0, as where gives
        distance = ratio - 1.0  # |ρ - 1| > ε, exactly, when the range is symmetric
        outside = (distance > eps_high) | (distance < -eps)
        return PolicyLossResult(
            loss=loss,
            clipfrac=torch.count_nonzero(clipped < unclipped).to(ratio.dtype) / tokens,
            ratio_outside_frac=torch.count_nonzero(outside).to(ratio.dtype) / tokens,
            approx_kl=kl_sum / tokens,
            ratio_mean=kept_ratio.sum() / tokens,
            ratio_max=kept_ratio.amax() if ratio.numel() else zero,
            dual_clip_frac=(
                torch.count_nonzero(dual_binds).to(ratio.dtype) / tokens if dual_binds is not None else zero
            ),
        )


def _clip_objective(
    ratio: Tensor, adv: Tensor, eps: float, eps_high: float, dual: float | None
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """PPO-Clip's per-token objective: ``(unclipped, clipped, objective, dual_binds)``, the last
    None without a dual clip."""
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps, 1.0 + eps_high) * adv
    objective = torch.minimum(unclipped, clipped)
    if dual is None:
        return unclipped, clipped, objective, None
    dual_bound = dual * adv
    dual_binds = (adv < 0) & (dual_bound > objective)
    return unclipped, clipped, torch.where(dual_binds, dual_bound, objective), dual_binds


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip_eps: float | None = None,
    loss_agg: str = "token-mean",
    *,
    norm_constant: float | None = None,
    token_count: int | Tensor | None = None,
    row_count: int | Tensor | None = None,
    clip_form: str = "max",
) -> Tensor:
    r"""The (optionally clipped) value loss over the action tokens (spec VF-1, VF-2).

    .. math:: V^{clip} = V_{old} + \operatorname{clip}(V - V_{old}, -c, c), \qquad
              \text{loss} = \tfrac12 \operatorname{mean}_m\!\big(\max((V - R)^2, (V^{clip} - R)^2)\big)

    and without clipping (``clip_eps=None``) :math:`\tfrac12 \operatorname{mean}_m((V - R)^2)`.
    ``values`` (differentiable), ``old_values`` (the rollout's values) and ``returns`` (the GAE
    targets) are (B, T); ``mask`` is (B, T); ``c = clip_eps`` is in reward units. Returns 0-dim; a
    batch without action tokens gives 0. ``mean_m`` is the token-mean by default; ``loss_agg`` and
    its keywords (``norm_constant``, ``token_count``, ``row_count``) select another reduction of
    the per-token terms, as in :func:`ppo_ref.aggregate_loss`. ``clip_form="clipped-only"`` takes
    the clipped term alone, :math:`(V^{clip} - R)^2`, instead of the max (as stable-baselines3's
    ``PPO.train``); without ``clip_eps`` it changes nothing.

    Example (V_old = 5, V = 1, R = 10, c = 0.2: the unclipped branch is the larger)::

        >>> value_loss(torch.tensor([[1.0]]), torch.tensor([[5.0]]), torch.tensor([[10.0]]),
        ...            torch.ones(1, 1), clip_eps=0.2)
        tensor(40.5000)
        >>> value_loss(torch.tensor([[1.0]]), torch.tensor([[5.0]]), torch.tensor([[10.0]]),
        ...            torch.ones(1, 1), clip_eps=0.2, clip_form="clipped-only")  # (4.8 - 10)^2 / 2
        tensor(13.5200)
    """
    keep = check_mask(mask)
    if clip_form not in VALUE_CLIP_FORMS:
        raise ValueError(f"clip_form: expected one of {VALUE_CLIP_FORMS}, got {clip_form!r}")
    named = {"values": values, "old_values": old_values, "returns": returns}
    zeroed = []
    for name, tensor in named.items():
        check_float(tensor, name, shape=keep.shape)
        zeroed.append(_zeroed(tensor, keep, name))
    dtype = compute_dtype(*named.values())
    constant, tokens_total, rows_total = check_aggregation(
        keep, loss_agg, norm_constant, token_count, row_count
    )
    v, v_old, target = (t.to(dtype) for t in zeroed)
    squared = (v - target) ** 2
    if clip_eps is not None:
        c = check_real(clip_eps, "clip_eps", low=0.0, low_open=True)
        v_clipped = v_old + torch.clamp(v - v_old, -c, c)
        clipped = (v_clipped - target) ** 2
        squared = clipped if clip_form == "clipped-only" else torch.maximum(squared, clipped)
    if loss_agg == "token-mean" and tokens_total is None:
        return 0.5 * masked_sum(squared, keep) / torch.count_nonzero(keep).clamp(min=1)
    return 0.5 * aggregate(squared, keep, loss_agg, constant, tokens_total, rows_total)


@dataclass(frozen=True)
class PenaltyLossResult:
    """What :func:`ppo_penalty_loss` returns (0-dim tensors; only ``loss`` has a graph).

    Attributes:
        loss: the PPO-Penalty loss, to minimise.
        kl: masked mean of the per-token k3 estimate of KL(π_old ‖ π), detached: feed it to
            :func:`update_penalty_beta`.
    """

    loss: Tensor
    kl: Tensor


def ppo_penalty_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, beta: float
) -> PenaltyLossResult:
    r"""PPO with an adaptive KL penalty instead of clipping (Schulman et al. 2017, eq. 8; PEN-1).

    .. math:: \text{loss} = -\operatorname{mean}_m\!\big(\rho_t A_t - \beta\,k_t\big), \qquad
              k_t = (\rho_t - 1) - \log\rho_t

    :math:`k_t` is the k3 estimate of KL(π_old ‖ π) from tokens sampled from π_old (always >= 0,
    gradient ``β (ρ - 1)`` in ``logp``). Shapes as in :func:`policy_loss`; ``beta`` >= 0;
    token-mean over action tokens; 0 for a batch without action tokens.

    Example (ρ = 2, A = 1, β = 0.5: -(2 - 0.5 (1 - log 2)))::

        >>> ppo_penalty_loss(torch.tensor([[2.0]]).log(), torch.zeros(1, 1), torch.ones(1, 1),
        ...                  torch.ones(1, 1), beta=0.5).loss
        tensor(-1.8466)
    """
    keep, log_ratio, count, _ = _check_pair(logp, old_logp, mask)
    weight = check_real(beta, "beta", low=0.0)
    adv = _checked_advantages(advantages, keep, log_ratio.dtype)
    ratio = torch.exp(log_ratio)
    kl_terms = torch.expm1(log_ratio) - log_ratio
    tokens = count.clamp(min=1)
    loss = -masked_sum(ratio * adv - weight * kl_terms, keep) / tokens
    return PenaltyLossResult(loss=loss, kl=(masked_sum(kl_terms, keep) / tokens).detach())


def update_penalty_beta(beta: float, kl: float, target_kl: float) -> float:
    r"""The adaptive-β rule of PPO-Penalty (Schulman et al. 2017, section 4; spec PEN-2).

    Halve β when the measured KL is below ``target_kl / 1.5``, double it when above
    ``1.5 * target_kl``, keep it otherwise.

    Example::

        >>> update_penalty_beta(1.0, kl=0.001, target_kl=0.01), update_penalty_beta(1.0, 0.02, 0.01)
        (0.5, 2.0)
    """
    value = check_real(beta, "beta", low=0.0)
    measured = check_real(kl, "kl")
    target = check_real(target_kl, "target_kl", low=0.0, low_open=True)
    if measured < target / 1.5:
        return value / 2.0
    if measured > target * 1.5:
        return value * 2.0
    return value
