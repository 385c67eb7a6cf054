"""Mutants of the PPO-family policy losses: clip-higher and dual clip (CLIP-1..3), GSPO (GSPO-1..3)
and CISPO (CISPO-1, CISPO-2)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import Tensor

import ppo_ref
from ppo_ref import CISPOLossResult, GSPOLossResult, PolicyLossResult
from tests.mutants.base import MutantSpec, bool_mask, ratio_and_advantages

SKYRL_031_CISPO_BOUNDS = (0.0, 5.0)
"""skyrl-train 0.3.1's cispo_eps_clip_low and cispo_eps_clip_high defaults: clamp(r, 1, 6)."""


# --- policy_loss: CLIP-1..3 -------------------------------------------------------------------------


def _policy_reference(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str,
    **kw: Any,
) -> PolicyLossResult:
    """The reference's result on detached log-probs: validation and the statistics a mutant keeps."""
    return ppo_ref.policy_loss(logp.detach(), old_logp, advantages, mask, clip_eps, loss_agg, **kw)


def policy_loss_clip_high_swapped(
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
    counts: dict[str, Any] = {
        "norm_constant": norm_constant,
        "token_count": token_count,
        "row_count": row_count,
    }
    _policy_reference(
        logp,
        old_logp,
        advantages,
        mask,
        clip_eps,
        loss_agg,
        clip_eps_high=clip_eps_high,
        dual_clip=dual_clip,
        **counts,
    )
    if clip_eps_high is None:
        return ppo_ref.policy_loss(
            logp, old_logp, advantages, mask, clip_eps, loss_agg, dual_clip=dual_clip, **counts
        )
    # BUG (CLIP-1): the offsets swapped, clamp(r, 1 - eps_high, 1 + eps): clip-higher widens the
    # lower side and the upper one stays narrow
    return ppo_ref.policy_loss(
        logp,
        old_logp,
        advantages,
        mask,
        clip_eps_high,
        loss_agg,
        clip_eps_high=clip_eps,
        dual_clip=dual_clip,
        **counts,
    )


def policy_loss_dual_clip_any_sign(
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
    counts: dict[str, Any] = {
        "norm_constant": norm_constant,
        "token_count": token_count,
        "row_count": row_count,
    }
    result = _policy_reference(
        logp,
        old_logp,
        advantages,
        mask,
        clip_eps,
        loss_agg,
        clip_eps_high=clip_eps_high,
        dual_clip=dual_clip,
        **counts,
    )
    if dual_clip is None:
        return ppo_ref.policy_loss(
            logp, old_logp, advantages, mask, clip_eps, loss_agg, clip_eps_high=clip_eps_high, **counts
        )
    keep, ratio, adv = ratio_and_advantages(logp, old_logp, advantages, mask)
    high = clip_eps if clip_eps_high is None else clip_eps_high
    objective = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + high) * adv)
    bound = dual_clip * adv
    # BUG (tianshou #433): max(min(rA, clip(r)A), cA) for every token, A >= 0 included: a good
    # action's objective becomes the constant cA (no gradient)
    binds = keep & (bound > objective)
    objective = torch.where(binds, bound, objective)
    loss = -ppo_ref.aggregate_loss(objective, keep, loss_agg, **counts)
    frac = torch.count_nonzero(binds).to(ratio.dtype) / torch.count_nonzero(keep).clamp(min=1)
    return dataclasses.replace(result, loss=loss, dual_clip_frac=frac)


def policy_loss_dual_clip_frac_any_sign(
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
    result = ppo_ref.policy_loss(
        logp,
        old_logp,
        advantages,
        mask,
        clip_eps,
        loss_agg,
        clip_eps_high=clip_eps_high,
        dual_clip=dual_clip,
        norm_constant=norm_constant,
        token_count=token_count,
        row_count=row_count,
    )
    if dual_clip is None:
        return result
    keep, ratio, _ = ratio_and_advantages(logp.detach(), old_logp, advantages, mask)
    # BUG (CLIP-3): the dual-clip share counts every token with r > c, whatever the sign of A
    # (the dual clip binds only for A < 0)
    above = keep & (ratio > dual_clip)
    frac = torch.count_nonzero(above).to(ratio.dtype) / torch.count_nonzero(keep).clamp(min=1)
    return dataclasses.replace(result, dual_clip_frac=frac)


def policy_loss_statistics_with_symmetric_range(
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
    counts: dict[str, Any] = {
        "norm_constant": norm_constant,
        "token_count": token_count,
        "row_count": row_count,
    }
    result = ppo_ref.policy_loss(
        logp,
        old_logp,
        advantages,
        mask,
        clip_eps,
        loss_agg,
        clip_eps_high=clip_eps_high,
        dual_clip=dual_clip,
        **counts,
    )
    # BUG (CLIP-3): clipfrac and ratio_outside_frac measured against [1 - eps, 1 + eps], the
    # symmetric range, while the loss clips at 1 + eps_high (clip-higher's extra room counted as clipped)
    symmetric = _policy_reference(
        logp, old_logp, advantages, mask, clip_eps, loss_agg, dual_clip=dual_clip, **counts
    )
    return dataclasses.replace(
        result, clipfrac=symmetric.clipfrac, ratio_outside_frac=symmetric.ratio_outside_frac
    )


# --- gspo_loss: GSPO-1..3 ---------------------------------------------------------------------------


def _gspo_with(
    result: GSPOLossResult,
    seq_log_ratio: Tensor,
    advantages: Tensor,
    nonempty: Tensor,
    clip_eps: float,
    clip_eps_high: float | None,
    row_count: int | Tensor | None,
) -> GSPOLossResult:
    """The GSPO loss and sequence statistics computed from a mutant's sequence log-ratios."""
    high = clip_eps if clip_eps_high is None else clip_eps_high
    seq_ratio = torch.exp(seq_log_ratio)
    adv = advantages.to(seq_ratio.dtype)
    unclipped = seq_ratio * adv
    clipped = seq_ratio.clamp(1 - clip_eps, 1 + high) * adv
    objective = torch.where(nonempty, torch.minimum(unclipped, clipped), torch.zeros((), dtype=adv.dtype))
    rows = row_count if row_count is not None else nonempty.sum().clamp(min=1)
    seqs = nonempty.sum().clamp(min=1)
    kept = torch.where(nonempty, seq_ratio, torch.zeros((), dtype=adv.dtype)).detach()
    return dataclasses.replace(
        result,
        loss=-objective.sum() / rows,
        clipfrac=torch.count_nonzero(nonempty & (clipped < unclipped)).to(adv.dtype) / seqs,
        ratio_mean=kept.sum() / seqs,
        ratio_max=kept.amax() if kept.numel() else kept.sum(),
    )


def _token_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(bool mask, log-ratio zeroed off the mask, row token counts)."""
    keep = bool_mask(mask)
    zero = torch.zeros((), dtype=logp.dtype)
    log_ratio = torch.where(keep, logp, zero) - torch.where(keep, old_logp.to(logp.dtype), zero)
    return keep, log_ratio, keep.sum(dim=1)


def gspo_loss_product_ratio(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    *,
    clip_eps_high: float | None = None,
    row_count: int | Tensor | None = None,
) -> GSPOLossResult:
    result = ppo_ref.gspo_loss(
        logp.detach(), old_logp, advantages, mask, clip_eps, clip_eps_high=clip_eps_high, row_count=row_count
    )
    _, log_ratio, tokens = _token_log_ratio(logp, old_logp, mask)
    # BUG (GSPO-1): the sequence ratio is the product of the token ratios, exp(sum log r), not
    # their geometric mean: its scale grows with the length and long rows are always clipped
    seq_log_ratio = log_ratio.sum(dim=1)
    return _gspo_with(result, seq_log_ratio, advantages, tokens > 0, clip_eps, clip_eps_high, row_count)


def gspo_loss_ratio_over_padding(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    *,
    clip_eps_high: float | None = None,
    row_count: int | Tensor | None = None,
) -> GSPOLossResult:
    result = ppo_ref.gspo_loss(
        logp.detach(), old_logp, advantages, mask, clip_eps, clip_eps_high=clip_eps_high, row_count=row_count
    )
    _, log_ratio, tokens = _token_log_ratio(logp, old_logp, mask)
    # BUG (labs-molt PR #53): the log-ratio averaged over the padded width, padding counting as a
    # token with log-ratio 0, so a short row's ratio is pulled towards 1
    seq_log_ratio = log_ratio.mean(dim=1) if log_ratio.shape[1] else log_ratio.sum(dim=1)
    return _gspo_with(result, seq_log_ratio, advantages, tokens > 0, clip_eps, clip_eps_high, row_count)


def gspo_loss_token_mean(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    *,
    clip_eps_high: float | None = None,
    row_count: int | Tensor | None = None,
) -> GSPOLossResult:
    result = ppo_ref.gspo_loss(
        logp.detach(), old_logp, advantages, mask, clip_eps, clip_eps_high=clip_eps_high, row_count=row_count
    )
    keep, log_ratio, tokens = _token_log_ratio(logp, old_logp, mask)
    high = clip_eps if clip_eps_high is None else clip_eps_high
    seq_log_ratio = log_ratio.sum(dim=1) / tokens.clamp(min=1)
    # GSPO-token: log s_it = sg[log s_i] + logp_t - sg[logp_t], one objective per token
    token_log_ratio = seq_log_ratio.detach().unsqueeze(1) + logp - logp.detach()
    s = torch.exp(torch.where(keep, token_log_ratio, torch.zeros((), dtype=logp.dtype)))
    adv = advantages.to(s.dtype).unsqueeze(1)
    objective = torch.minimum(s * adv, s.clamp(1 - clip_eps, 1 + high) * adv)
    # BUG (TRL #3823): the GSPO-token objective aggregated with token-mean (TRL's default
    # loss_type="dapo" only warns), so each sequence weighs by its length
    loss = -ppo_ref.aggregate_loss(objective, keep, "token-mean")
    return dataclasses.replace(result, loss=loss)


def gspo_loss_gradient_without_length(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    *,
    clip_eps_high: float | None = None,
    row_count: int | Tensor | None = None,
) -> GSPOLossResult:
    result = ppo_ref.gspo_loss(
        logp.detach(), old_logp, advantages, mask, clip_eps, clip_eps_high=clip_eps_high, row_count=row_count
    )
    _, log_ratio, tokens = _token_log_ratio(logp, old_logp, mask)
    row_sum = log_ratio.sum(dim=1)
    mean = row_sum / tokens.clamp(min=1)
    # BUG (ROLL #165): the right value, but the gradient of log s_i is that of the sum of the token
    # log-ratios: the 1/|y_i| factor is lost, so a long sequence's gradient is |y_i| times too large
    seq_log_ratio = mean.detach() + (row_sum - row_sum.detach())
    return _gspo_with(result, seq_log_ratio, advantages, tokens > 0, clip_eps, clip_eps_high, row_count)


def gspo_loss_clipfrac_over_tokens(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    *,
    clip_eps_high: float | None = None,
    row_count: int | Tensor | None = None,
) -> GSPOLossResult:
    result = ppo_ref.gspo_loss(
        logp, old_logp, advantages, mask, clip_eps, clip_eps_high=clip_eps_high, row_count=row_count
    )
    keep, log_ratio, tokens = _token_log_ratio(logp.detach(), old_logp, mask)
    high = clip_eps if clip_eps_high is None else clip_eps_high
    s = torch.exp(log_ratio.sum(dim=1) / tokens.clamp(min=1))
    adv = advantages.to(s.dtype)
    clipped_rows = s.clamp(1 - clip_eps, 1 + high) * adv < s * adv
    # BUG (GSPO-3): the clip fraction counted over tokens (each token of a clipped sequence), the
    # token-level statistic of PPO: long sequences weigh more. Undeclared, it is the convention
    # gspo_clipfrac='tokens' (the GSPO paper's statistic; verl, OpenRLHF), which the suite infers
    clipped_tokens = keep & clipped_rows.unsqueeze(1)
    frac = torch.count_nonzero(clipped_tokens).to(s.dtype) / torch.count_nonzero(keep).clamp(min=1)
    return dataclasses.replace(result, clipfrac=frac)


def gspo_loss_token_ratio_statistics(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    *,
    clip_eps_high: float | None = None,
    row_count: int | Tensor | None = None,
) -> GSPOLossResult:
    result = ppo_ref.gspo_loss(
        logp, old_logp, advantages, mask, clip_eps, clip_eps_high=clip_eps_high, row_count=row_count
    )
    keep, log_ratio, _ = _token_log_ratio(logp.detach(), old_logp, mask)
    ratio = torch.where(keep, torch.exp(log_ratio), torch.zeros((), dtype=log_ratio.dtype))
    if not ratio.numel():
        return result
    # BUG (GSPO-3): ratio_mean and ratio_max of the token ratios (PPO's statistics) reported for
    # GSPO, whose ratio is the sequence's
    tokens = torch.count_nonzero(keep).clamp(min=1)
    return dataclasses.replace(result, ratio_mean=ratio.sum() / tokens, ratio_max=ratio.amax())


# --- cispo_loss: CISPO-1, CISPO-2 -------------------------------------------------------------------


def _cispo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    loss_agg: str,
    counts: dict[str, Any],
    low: float | None,
    high: float,
    detach_weight: bool = True,
    clipped_keep_gradient: bool = True,
) -> CISPOLossResult:
    """CISPO with the weight clamp(r, low, high) (``low=None``: no lower bound), the reference's
    validation and statistics, and the clip fraction of these bounds."""
    keep, ratio, adv = ratio_and_advantages(logp, old_logp, advantages, mask)
    weight = ratio.clamp(min=low, max=high)
    per_token_logp = torch.where(keep, logp, torch.zeros((), dtype=logp.dtype)).to(adv.dtype)
    changed = keep & (weight.detach() != ratio.detach())
    if not clipped_keep_gradient:
        per_token_logp = torch.where(changed, per_token_logp.detach(), per_token_logp)
    if detach_weight:
        weight = weight.detach()
    loss = ppo_ref.aggregate_loss(-weight * adv * per_token_logp, keep, loss_agg, **counts)
    tokens = torch.count_nonzero(keep).clamp(min=1)
    reference = ppo_ref.cispo_loss(logp.detach(), old_logp, advantages, mask, 0.2, 0.2, loss_agg, **counts)
    return dataclasses.replace(
        reference, loss=loss, clipfrac=torch.count_nonzero(changed).to(adv.dtype) / tokens
    )


def cispo_loss_weight_not_detached(
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
) -> CISPOLossResult:
    counts: dict[str, Any] = {
        "norm_constant": norm_constant,
        "token_count": token_count,
        "row_count": row_count,
    }
    ppo_ref.cispo_loss(logp.detach(), old_logp, advantages, mask, clip_low, clip_high, loss_agg, **counts)
    # BUG (CISPO-1): the clipped weight is not detached: the value is right, but inside the bounds
    # the gradient is -A * r * (1 + log p) instead of -A * r (a REINFORCE term and a PPO term mixed)
    return _cispo(
        logp, old_logp, advantages, mask, loss_agg, counts, 1 - clip_low, 1 + clip_high, detach_weight=False
    )


def cispo_loss_clipped_tokens_masked(
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
) -> CISPOLossResult:
    counts: dict[str, Any] = {
        "norm_constant": norm_constant,
        "token_count": token_count,
        "row_count": row_count,
    }
    ppo_ref.cispo_loss(logp.detach(), old_logp, advantages, mask, clip_low, clip_high, loss_agg, **counts)
    # BUG (CISPO-1): PPO's habit kept: tokens whose weight was clipped lose their gradient, which is
    # what CISPO exists to avoid (MiniMax-M1 section 3.1: every token keeps -w A)
    return _cispo(
        logp,
        old_logp,
        advantages,
        mask,
        loss_agg,
        counts,
        1 - clip_low,
        1 + clip_high,
        clipped_keep_gradient=False,
    )


def cispo_loss_skyrl_default_bounds(
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
) -> CISPOLossResult:
    counts: dict[str, Any] = {
        "norm_constant": norm_constant,
        "token_count": token_count,
        "row_count": row_count,
    }
    ppo_ref.cispo_loss(logp.detach(), old_logp, advantages, mask, clip_low, clip_high, loss_agg, **counts)
    low, high = SKYRL_031_CISPO_BOUNDS
    # BUG (SkyRL PR #1928): the bounds come from skyrl-train 0.3.1's config defaults
    # (cispo_eps_clip_low=0, cispo_eps_clip_high=5), clamp(r, 1, 6): every r < 1 is raised to 1
    return _cispo(logp, old_logp, advantages, mask, loss_agg, counts, 1 - low, 1 + high)


def cispo_loss_absolute_cap(
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
) -> CISPOLossResult:
    counts: dict[str, Any] = {
        "norm_constant": norm_constant,
        "token_count": token_count,
        "row_count": row_count,
    }
    ppo_ref.cispo_loss(logp.detach(), old_logp, advantages, mask, clip_low, clip_high, loss_agg, **counts)
    # BUG (CISPO-2): TRL's parametrisation, min(r, epsilon_high), an absolute cap with no lower
    # bound, used without declaring it: clip_high read as the cap and clip_low ignored
    return _cispo(logp, old_logp, advantages, mask, loss_agg, counts, None, clip_high)


# --- inputs -----------------------------------------------------------------------------------------


def _ratios(
    ratios: list[list[float]], mask: list[list[int]] | None, grad: bool = True
) -> tuple[Tensor, Tensor, Tensor]:
    """(logp, old_logp, mask) with the given ratios on the mask (old_logp = -1.5, 1 elsewhere)."""
    ratio = torch.tensor(ratios, dtype=torch.float64)
    keep = torch.ones_like(ratio, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool)
    old_logp = torch.full_like(ratio, -1.5)
    logp = torch.where(keep, old_logp + ratio.log(), old_logp)
    return logp.requires_grad_(grad), old_logp, keep.long()


def policy(
    ratios: list[list[float]], advantages: list[list[float]], mask: list[list[int]] | None = None, **kw: Any
) -> dict[str, Any]:
    logp, old_logp, keep = _ratios(ratios, mask)
    adv = torch.where(
        keep.bool(), torch.tensor(advantages, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)
    )
    return {"logp": logp, "old_logp": old_logp, "advantages": adv, "mask": keep, "clip_eps": 0.2, **kw}


def gspo(
    ratios: list[list[float]], advantages: list[float], mask: list[list[int]] | None = None, **kw: Any
) -> dict[str, Any]:
    logp, old_logp, keep = _ratios(ratios, mask)
    return {
        "logp": logp,
        "old_logp": old_logp,
        "advantages": torch.tensor(advantages, dtype=torch.float64),
        "mask": keep,
        "clip_eps": 0.2,
        **kw,
    }


def cispo(
    ratios: list[list[float]],
    advantages: list[list[float]],
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    mask: list[list[int]] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    logp, old_logp, keep = _ratios(ratios, mask)
    return {
        "logp": logp,
        "old_logp": old_logp,
        "advantages": torch.tensor(advantages, dtype=torch.float64),
        "mask": keep,
        "clip_low": clip_low,
        "clip_high": clip_high,
        **kw,
    }


E = math.e
UNEQUAL = [[1, 1, 1], [1, 0, 0]]
"""Rows of 3 and 1 action tokens."""

SPECS: tuple[MutantSpec, ...] = (
    MutantSpec(
        "CLIP1-clip-high-swapped",
        "CLIP-1",
        "policy_loss",
        "clamp(r, 1 - eps_high, 1 + eps): the clip-higher offset put on the lower side",
        "clip_eps_high other than clip_eps with a ratio between the two upper (or lower) bounds",
        policy_loss_clip_high_swapped,
        shows_on=lambda: policy([[1.25, 0.75, 1.0]], [[2.0, -1.0, 2.0]], clip_eps_high=0.28),
        hides_on=lambda: policy([[1.25, 0.75, 1.0]], [[2.0, -1.0, 2.0]], clip_eps_high=0.2),
        clause="CLIP-1",
    ),
    MutantSpec(
        "tianshou433-dual-clip-on-positive-advantages",
        "tianshou#433",
        "policy_loss",
        "max(min(rA, clip(r)A), cA) for every token: the dual clip also binds for A > 0",
        "dual_clip with a positive advantage",
        policy_loss_dual_clip_any_sign,
        shows_on=lambda: policy([[4.0, 1.1, 0.9]], [[-1.0, 2.0, -0.5]], dual_clip=3.0),
        hides_on=lambda: policy([[4.0, 1.1, 0.9]], [[-1.0, -2.0, -0.5]], dual_clip=3.0),
        clause="CLIP-2",
    ),
    MutantSpec(
        "CLIP3-dual-clip-frac-any-sign",
        "CLIP-3",
        "policy_loss",
        "dual_clip_frac = share of tokens with r > c, whatever the sign of A",
        "dual_clip with a ratio above c on a token with A >= 0",
        policy_loss_dual_clip_frac_any_sign,
        shows_on=lambda: policy([[4.0, 3.5, 0.9]], [[-1.0, 2.0, -0.5]], dual_clip=3.0),
        hides_on=lambda: policy([[4.0, 1.1, 0.9]], [[-1.0, 2.0, -0.5]], dual_clip=3.0),
        clause="CLIP-3",
    ),
    MutantSpec(
        "CLIP3-statistics-with-symmetric-range",
        "CLIP-3",
        "policy_loss",
        "clipfrac and ratio_outside_frac against [1 - eps, 1 + eps] while the loss clips at 1 + eps_high",
        "clip_eps_high > clip_eps with a ratio between 1 + eps and 1 + eps_high",
        policy_loss_statistics_with_symmetric_range,
        shows_on=lambda: policy([[1.25, 0.75, 1.0]], [[1.0, -1.0, 2.0]], clip_eps_high=0.28),
        hides_on=lambda: policy([[1.3, 0.75, 1.0]], [[1.0, -1.0, 2.0]], clip_eps_high=0.28),
        clause="CLIP-3",
    ),
    MutantSpec(
        "GSPO1-product-ratio",
        "GSPO-1",
        "gspo_loss",
        "s_i = exp(sum of the token log-ratios), the product, not the geometric mean",
        "a row with two or more action tokens whose log-ratios do not sum to 0",
        gspo_loss_product_ratio,
        shows_on=lambda: gspo([[1.1, 1.1, 1.05], [0.9, 1.0, 1.0]], [1.0, -1.0], UNEQUAL),
        hides_on=lambda: gspo([[1.1, 1.0, 1.0], [0.9, 1.0, 1.0]], [1.0, -1.0], [[1, 0, 0], [1, 0, 0]]),
        clause="GSPO-1",
    ),
    MutantSpec(
        "labs-molt-PR53-gspo-ratio-over-padding",
        "labs-molt-PR#53",
        "gspo_loss",
        "the sequence log-ratio averaged over the padded width (padding counts as log-ratio 0)",
        "a row shorter than the padded width",
        gspo_loss_ratio_over_padding,
        shows_on=lambda: gspo([[1.1, 1.1, 1.05], [0.9, 1.0, 1.0]], [1.0, -1.0], UNEQUAL),
        hides_on=lambda: gspo([[1.1, 1.1, 1.05], [0.9, 1.2, 0.95]], [1.0, -1.0]),
        clause="GSPO-1",
    ),
    MutantSpec(
        "TRL3823-gspo-token-mean",
        "TRL#3823",
        "gspo_loss",
        "the GSPO-token objective aggregated with token-mean: each sequence weighs by its length",
        "rows of unequal length",
        gspo_loss_token_mean,
        shows_on=lambda: gspo([[1.1, 1.1, 1.05], [0.9, 1.0, 1.0]], [1.0, -1.0], UNEQUAL),
        hides_on=lambda: gspo([[1.1, 1.1, 1.05], [0.9, 1.2, 0.95]], [1.0, -1.0]),
        clause="GSPO-2",
    ),
    MutantSpec(
        "ROLL165-gspo-gradient-without-length",
        "ROLL#165",
        "gspo_loss",
        "log s_i has the value of the mean but the gradient of the sum: the 1/|y_i| factor lost",
        "a row with two or more action tokens, on the unclipped branch (gradient only)",
        gspo_loss_gradient_without_length,
        shows_on=lambda: gspo([[1.1, 0.95, 1.05], [0.9, 1.0, 1.0]], [1.0, -1.0], UNEQUAL),
        hides_on=lambda: gspo([[1.1, 0.95, 1.05], [0.9, 1.0, 1.0]], [1.0, -1.0], [[1, 0, 0], [1, 0, 0]]),
        clause="GSPO-2",
    ),
    MutantSpec(
        "GSPO3-clipfrac-over-tokens",
        "GSPO-3",
        "gspo_loss",
        "clipfrac = share of action tokens in clipped sequences, not the share of sequences, not declared",
        "a clipped and an unclipped row of unequal lengths",
        gspo_loss_clipfrac_over_tokens,
        shows_on=lambda: gspo([[1.3, 1.3, 1.3], [1.0, 1.0, 1.0]], [1.0, -1.0], UNEQUAL),
        hides_on=lambda: gspo([[1.3, 1.3, 1.3], [1.0, 1.0, 1.0]], [1.0, -1.0]),
        clause="GSPO-3",
        convention={"gspo_clipfrac": "tokens"},
    ),
    MutantSpec(
        "GSPO3-token-ratio-statistics",
        "GSPO-3",
        "gspo_loss",
        "ratio_mean and ratio_max of the token ratios, not of the sequence ratios",
        "token ratios that differ within a row",
        gspo_loss_token_ratio_statistics,
        shows_on=lambda: gspo([[1.3, 0.8, 1.0], [1.1, 0.9, 1.0]], [1.0, -1.0]),
        hides_on=lambda: gspo([[1.3, 1.3, 1.3], [1.1, 1.1, 1.1]], [1.0, -1.0]),
        clause="GSPO-3",
    ),
    MutantSpec(
        "CISPO1-weight-not-detached",
        "CISPO-1",
        "cispo_loss",
        "-clip(r) * A * logp with the weight not detached: gradient -A r (1 + logp) inside the bounds",
        "a ratio inside the clip bounds (gradient only)",
        cispo_loss_weight_not_detached,
        shows_on=lambda: cispo([[1.1, 0.9, 2.0]], [[1.0, -1.0, 0.5]]),
        hides_on=lambda: cispo([[1.5, 0.5, 2.0]], [[1.0, -1.0, 0.5]]),
        clause="CISPO-1",
    ),
    MutantSpec(
        "CISPO1-clipped-tokens-lose-gradient",
        "CISPO-1",
        "cispo_loss",
        "tokens whose weight was clipped get no gradient (PPO's clip mask kept)",
        "a ratio outside the clip bounds (gradient only)",
        cispo_loss_clipped_tokens_masked,
        shows_on=lambda: cispo([[1.1, 0.9, 2.0]], [[1.0, -1.0, 0.5]]),
        hides_on=lambda: cispo([[1.1, 0.9, 1.15]], [[1.0, -1.0, 0.5]]),
        clause="CISPO-1",
    ),
    MutantSpec(
        "SkyRL-PR1928-cispo-bounds-1-to-6",
        "SkyRL-PR#1928",
        "cispo_loss",
        "clamp(r, 1, 6) whatever the bounds passed (skyrl-train 0.3.1's defaults 0 and 5)",
        "bounds other than clip_low=0, clip_high=5 with a ratio they clip differently",
        cispo_loss_skyrl_default_bounds,
        shows_on=lambda: cispo([[0.5, 1.5, 7.0]], [[1.0, -1.0, 0.5]], 0.2, 0.28),
        hides_on=lambda: cispo([[0.5, 1.5, 7.0]], [[1.0, -1.0, 0.5]], 0.0, 5.0),
        clause="CISPO-2",
    ),
    MutantSpec(
        "CISPO2-absolute-cap-undeclared",
        "CISPO-2",
        "cispo_loss",
        "min(r, clip_high): TRL's absolute cap with no lower bound, not declared",
        "a ratio below 1 - clip_low or between clip_high and 1 + clip_high",
        cispo_loss_absolute_cap,
        shows_on=lambda: cispo([[0.5, 1.5, 4.5]], [[1.0, -1.0, 0.5]], 0.2, 4.0),
        hides_on=lambda: cispo([[0.85, 1.5, 3.5]], [[1.0, -1.0, 0.5]], 0.2, 4.0),
        clause="CISPO-2",
        convention={"cispo_bounds": "absolute-cap"},
    ),
)
