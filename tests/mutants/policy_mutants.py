"""Mutants of the clipped policy loss (PG-1..6): objective, aggregation and statistics."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import Tensor

import ppo_ref
from ppo_ref import PolicyLossResult
from tests.mutants.base import MutantSpec, bool_mask, ratio_and_advantages

NAN = math.nan
DUAL_CLIP = 3.0
LOG_RATIO_CLAMP = 20.0


def _with_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str,
    loss: Tensor,
) -> PolicyLossResult:
    """The reference's statistics with a mutant's loss."""
    result = ppo_ref.policy_loss(logp.detach(), old_logp, advantages, mask, clip_eps, loss_agg=loss_agg)
    return dataclasses.replace(result, loss=loss)


# --- policy_loss: the objective ---------------------------------------------------------------------


def policy_loss_min_before_advantage(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str = "token-mean",
) -> PolicyLossResult:
    keep, ratio, adv = ratio_and_advantages(logp, old_logp, advantages, mask)
    # BUG (B1, takuseno/ppo #3): the min is taken over the ratios, before multiplying by A
    objective = torch.minimum(ratio, ratio.clamp(1 - clip_eps, 1 + clip_eps)) * adv
    loss = -ppo_ref.aggregate_loss(objective, keep, loss_agg)
    return _with_loss(logp, old_logp, advantages, mask, clip_eps, loss_agg, loss)


def policy_loss_without_min(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str = "token-mean",
) -> PolicyLossResult:
    keep, ratio, adv = ratio_and_advantages(logp, old_logp, advantages, mask)
    objective = ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv  # BUG (B1, tensorforce #106): no min
    loss = -ppo_ref.aggregate_loss(objective, keep, loss_agg)
    return _with_loss(logp, old_logp, advantages, mask, clip_eps, loss_agg, loss)


def policy_loss_clamped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str = "token-mean",
) -> PolicyLossResult:
    keep, ratio, adv = ratio_and_advantages(logp, old_logp, advantages, mask)
    surrogate = ratio * adv
    # BUG (B1, Pytorch-DPPO #3): the clamp is applied to the surrogate r*A instead of the ratio
    objective = torch.minimum(surrogate, surrogate.clamp(1 - clip_eps, 1 + clip_eps))
    loss = -ppo_ref.aggregate_loss(objective, keep, loss_agg)
    return _with_loss(logp, old_logp, advantages, mask, clip_eps, loss_agg, loss)


def policy_loss_advantage_normalised_between_branches(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str = "token-mean",
) -> PolicyLossResult:
    keep, ratio, adv = ratio_and_advantages(logp, old_logp, advantages, mask)
    gain1 = ratio * adv
    if int(keep.sum()) >= 2:
        adv = ppo_ref.masked_whiten(adv, keep)  # BUG (B2, torchrl PR #1033): normalised after gain1
    gain2 = ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv
    loss = -ppo_ref.aggregate_loss(torch.minimum(gain1, gain2), keep, loss_agg)
    return _with_loss(logp, old_logp, advantages, mask, clip_eps, loss_agg, loss)


def policy_loss_dual_clip(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str = "token-mean",
) -> PolicyLossResult:
    keep, ratio, adv = ratio_and_advantages(logp, old_logp, advantages, mask)
    objective = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    # BUG (B3): verl's dual clip (c = 3 for A < 0) always on, and dual_clip not declared
    objective = torch.where(adv < 0, torch.maximum(objective, DUAL_CLIP * adv), objective)
    loss = -ppo_ref.aggregate_loss(objective, keep, loss_agg)
    # its statistics are those of the same dual clip (dual_clip_frac counts it): the convention exactly
    result = ppo_ref.policy_loss(
        logp.detach(), old_logp, advantages, mask, clip_eps, loss_agg, dual_clip=DUAL_CLIP
    )
    return dataclasses.replace(result, loss=loss)


def policy_loss_log_ratio_clamped(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str = "token-mean",
) -> PolicyLossResult:
    keep = bool_mask(mask)
    log_ratio = torch.where(keep, logp - old_logp, torch.zeros((), dtype=logp.dtype))
    # BUG (B6): verl's numerical guard, the log-ratio clamped to [-20, 20] before exp (and before
    # every statistic), without declaring log_ratio_clamp
    logp = old_logp + log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return ppo_ref.policy_loss(logp, old_logp, advantages, mask, clip_eps, loss_agg=loss_agg)


# --- policy_loss: aggregation -----------------------------------------------------------------------


def policy_loss_token_mean_as_seq_mean(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str = "token-mean",
) -> PolicyLossResult:
    # BUG (E3, verl #1233): the token-mean branch computes the seq-mean-token-mean aggregate
    mode = "seq-mean-token-mean" if loss_agg == "token-mean" else loss_agg
    return ppo_ref.policy_loss(logp, old_logp, advantages, mask, clip_eps, loss_agg=mode)


def policy_loss_seq_mean_over_every_row(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str = "token-mean",
) -> PolicyLossResult:
    keep, ratio, adv = ratio_and_advantages(logp, old_logp, advantages, mask)
    objective = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    if loss_agg == "token-mean":
        loss = -ppo_ref.aggregate_loss(objective, keep, loss_agg)
    else:
        row_sums = torch.where(keep, objective, torch.zeros((), dtype=objective.dtype)).sum(dim=1)
        if loss_agg == "seq-mean-token-mean":
            row_sums = row_sums / keep.sum(dim=1).clamp(min=1)
        # BUG (D6b): rows without an action token are counted in the mean over rows
        loss = -row_sums.mean() if row_sums.numel() else -row_sums.sum()
    return _with_loss(logp, old_logp, advantages, mask, clip_eps, loss_agg, loss)


def policy_loss_multiplying_mask(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str = "token-mean",
) -> PolicyLossResult:
    ratio = torch.exp(logp - old_logp)
    objective = torch.minimum(ratio * advantages, ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages)
    weights = mask.to(objective.dtype)
    weighted = objective * weights  # BUG (E2, OpenRLHF #1240): 0 * nan = nan from a padded slot
    if loss_agg == "token-mean":
        loss = -weighted.sum() / weights.sum().clamp(min=1)
    else:
        row_values = weighted.sum(dim=1)
        if loss_agg == "seq-mean-token-mean":
            row_values = row_values / weights.sum(dim=1).clamp(min=1)
        rows = (weights.sum(dim=1) > 0).to(objective.dtype)
        loss = -(row_values * rows).sum() / rows.sum().clamp(min=1)
    return _with_loss(logp, old_logp, advantages, mask, clip_eps, loss_agg, loss)


def policy_loss_token_mean_without_guard(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str = "token-mean",
) -> PolicyLossResult:
    keep, ratio, adv = ratio_and_advantages(logp, old_logp, advantages, mask)
    if loss_agg != "token-mean":
        return ppo_ref.policy_loss(logp, old_logp, advantages, mask, clip_eps, loss_agg=loss_agg)
    objective = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    loss = -objective.sum() / keep.sum()  # BUG (E2, verl PR #782): no guard, 0 / 0 = nan without tokens
    return _with_loss(logp, old_logp, advantages, mask, clip_eps, loss_agg, loss)


# --- policy_loss: statistics ------------------------------------------------------------------------


def policy_loss_clipfrac_ratio_outside(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str = "token-mean",
) -> PolicyLossResult:
    result = ppo_ref.policy_loss(logp, old_logp, advantages, mask, clip_eps, loss_agg=loss_agg)
    # BUG (B4): CleanRL's clip fraction |r - 1| > eps reported as clipfrac, convention not declared
    return dataclasses.replace(result, clipfrac=result.ratio_outside_frac)


def policy_loss_approx_kl_over_all_positions(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str = "token-mean",
) -> PolicyLossResult:
    result = ppo_ref.policy_loss(logp, old_logp, advantages, mask, clip_eps, loss_agg=loss_agg)
    _, ratio, _ = ratio_and_advantages(logp.detach(), old_logp, advantages, mask)
    terms = (ratio - 1) - ratio.log()
    # BUG (B5, TRL #6809): .mean() over every position, padding included
    approx_kl = terms.mean() if terms.numel() else terms.sum()
    return dataclasses.replace(result, approx_kl=approx_kl)


def policy_loss_kl_of_negative_ratio(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str = "token-mean",
) -> PolicyLossResult:
    result = ppo_ref.policy_loss(logp, old_logp, advantages, mask, clip_eps, loss_agg=loss_agg)
    keep, ratio, _ = ratio_and_advantages(logp.detach(), old_logp, advantages, mask)
    # BUG (B5, OpenRLHF feeb0283): masked_mean(-ratio) instead of the log-ratio: -1 at step 0
    return dataclasses.replace(result, approx_kl=ppo_ref.masked_mean(-ratio, keep))


def policy_loss_ratio_statistics_over_all_positions(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str = "token-mean",
) -> PolicyLossResult:
    result = ppo_ref.policy_loss(logp, old_logp, advantages, mask, clip_eps, loss_agg=loss_agg)
    _, ratio, _ = ratio_and_advantages(logp.detach(), old_logp, advantages, mask)
    if not ratio.numel():
        return result
    # BUG (B5, TRL #6809): ratio.mean() and ratio.max() over every position (padding has ratio 1)
    return dataclasses.replace(result, ratio_mean=ratio.mean(), ratio_max=ratio.max())


# --- specs ------------------------------------------------------------------------------------------


def _policy(
    ratios: list[list[float]],
    advantages: list[list[float]],
    mask: list[list[int]] | None = None,
    loss_agg: str = "token-mean",
    fill: float = 0.0,
) -> dict[str, Any]:
    """policy_loss inputs with the given ratios (old_logp = -1); masked-out slots hold ``fill``."""
    ratio = torch.tensor(ratios, dtype=torch.float64)
    keep = torch.ones_like(ratio, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool)
    old_logp = torch.full_like(ratio, -1.0)
    return {
        "logp": torch.where(keep, old_logp + ratio.log(), torch.tensor(fill, dtype=torch.float64)),
        "old_logp": torch.where(keep, old_logp, torch.tensor(fill, dtype=torch.float64)),
        "advantages": torch.where(
            keep, torch.tensor(advantages, dtype=torch.float64), torch.tensor(fill, dtype=torch.float64)
        ),
        "mask": keep.long(),
        "clip_eps": 0.2,
        "loss_agg": loss_agg,
    }


CLIP_TABLE = ([[1.4, 1.6, 0.6, 0.6, 1.4, 4.0]], [[2.0, 2.0, 2.0, -2.0, -2.0, -2.0]])
PADDED = [[1, 1, 0], [1, 0, 0]]

SPECS: tuple[MutantSpec, ...] = (
    MutantSpec(
        "B1-min-before-advantage",
        "B1",
        "policy_loss",
        "min(r, clip(r)) * A: the min taken over the ratios before multiplying by A",
        "A < 0 with the ratio outside [1 - eps, 1 + eps] (large ratios)",
        policy_loss_min_before_advantage,
        shows_on=lambda: _policy([[1.4, 0.6]], [[-2.0, -2.0]]),
        hides_on=lambda: _policy([[1.4, 0.6, 1.1, 0.9]], [[2.0, 2.0, -1.0, -3.0]]),
    ),
    MutantSpec(
        "B1-no-min",
        "B1",
        "policy_loss",
        "objective clip(r) * A with no min against r * A",
        "ratios outside [1 - eps, 1 + eps] on the unclipped side (large ratios)",
        policy_loss_without_min,
        shows_on=lambda: _policy(*CLIP_TABLE),
        hides_on=lambda: _policy([[1.1, 0.9, 1.6, 0.6]], [[2.0, -1.0, 2.0, -2.0]]),
    ),
    MutantSpec(
        "B1-clamp-on-surrogate",
        "B1",
        "policy_loss",
        "min(rA, clamp(rA, 1 - eps, 1 + eps)): the clamp applied to the surrogate, not the ratio",
        None,
        policy_loss_clamped_surrogate,
        shows_on=lambda: _policy(*CLIP_TABLE),
    ),
    MutantSpec(
        "B2-advantage-normalised-between-branches",
        "B2",
        "policy_loss",
        "A normalised after the unclipped term and before the clipped one (torchrl PR #1033)",
        None,
        policy_loss_advantage_normalised_between_branches,
        shows_on=lambda: _policy([[1.0, 1.0]], [[1.0, 3.0]]),
    ),
    MutantSpec(
        "B3-dual-clip-undeclared",
        "B3",
        "policy_loss",
        "max(min(rA, clip(r)A), 3A) for A < 0 (verl's default dual clip), not declared",
        "A < 0 with ratio > 3 (large ratios)",
        policy_loss_dual_clip,
        shows_on=lambda: _policy(*CLIP_TABLE),
        hides_on=lambda: _policy([[4.0, 1.4, 0.6, 2.5]], [[2.0, -2.0, 2.0, -1.0]]),
        convention={"dual_clip": 3.0},
    ),
    MutantSpec(
        "B6-log-ratio-clamped-undeclared",
        "B6",
        "policy_loss",
        "logp - old_logp clamped to [-20, 20] before exp (verl), log_ratio_clamp not declared",
        "|logp - old_logp| > 20 (a token the old policy found very unlikely)",
        policy_loss_log_ratio_clamped,
        shows_on=lambda: _policy([[math.exp(25.0), 1.4]], [[-1.0, 2.0]]),
        hides_on=lambda: _policy(*CLIP_TABLE),
        convention={"log_ratio_clamp": 20.0},
    ),
    MutantSpec(
        "B4-clipfrac-ratio-outside-undeclared",
        "B4",
        "policy_loss",
        "clipfrac = mean(|r - 1| > eps) (CleanRL) without declaring clipfrac='ratio-outside'",
        "a ratio outside the range on the unclipped side (r < 1 - eps with A > 0, or r > 1 + eps with A < 0)",
        policy_loss_clipfrac_ratio_outside,
        shows_on=lambda: _policy([[0.5, 1.5]], [[1.0, 1.0]]),
        hides_on=lambda: _policy([[1.5, 0.5, 1.1]], [[1.0, -1.0, 1.0]]),
        convention={"clipfrac": "ratio-outside"},
    ),
    MutantSpec(
        "B5-approx-kl-over-all-positions",
        "B5",
        "policy_loss",
        "approx_kl = k3.mean() over every position (TRL #6809), padding diluting it",
        "a mask with padding or holes",
        policy_loss_approx_kl_over_all_positions,
        shows_on=lambda: _policy([[2.0, 0.5, 1.0], [1.3, 1.0, 1.0]], [[1.0, -1.0, 0.0], [1.0, 0, 0]], PADDED),
        hides_on=lambda: _policy([[2.0, 0.5, 1.7], [1.3, 0.8, 1.0]], [[1.0, -1.0, 2.0], [1.0, 0.5, -1.0]]),
        convention={"unmasked_statistics": ["approx_kl"]},
    ),
    MutantSpec(
        "B5-approx-kl-of-negative-ratio",
        "B5",
        "policy_loss",
        "approx_kl = masked_mean(-ratio) (OpenRLHF feeb0283): -1 at step 0",
        None,
        policy_loss_kl_of_negative_ratio,
        shows_on=lambda: _policy([[1.0, 1.0]], [[1.0, 3.0]]),
    ),
    MutantSpec(
        "B5-ratio-statistics-over-all-positions",
        "B5",
        "policy_loss",
        "ratio_mean = ratio.mean() and ratio_max = ratio.max() over every position (TRL #6809)",
        "a mask with padding or holes",
        policy_loss_ratio_statistics_over_all_positions,
        shows_on=lambda: _policy([[2.0, 0.5, 1.0], [0.7, 1.0, 1.0]], [[1.0, -1.0, 0.0], [1.0, 0, 0]], PADDED),
        hides_on=lambda: _policy([[2.0, 0.5, 1.7], [0.7, 0.8, 1.0]], [[1.0, -1.0, 2.0], [1.0, 0.5, -1.0]]),
    ),
    MutantSpec(
        "E3-token-mean-is-seq-mean",
        "E3",
        "policy_loss",
        "the token-mean branch computes the seq-mean-token-mean aggregate (verl #1233)",
        "rows of unequal length under token-mean",
        policy_loss_token_mean_as_seq_mean,
        shows_on=lambda: _policy([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], [[1.0, 3.0, 0.0], [1.0, 0, 0]], PADDED),
        hides_on=lambda: _policy(
            [[1.3, 1.0, 1.0], [0.7, 1.1, 1.0]], [[1.0, 3.0, 0.0], [1.0, 2.0, 0]], [[1, 1, 0], [1, 1, 0]]
        ),
    ),
    MutantSpec(
        "D6b-seq-mean-counts-empty-rows",
        "D6b",
        "policy_loss",
        "the seq-mean aggregates average over every row, rows without action tokens included",
        "rows without action tokens under a seq-mean aggregation",
        policy_loss_seq_mean_over_every_row,
        shows_on=lambda: _policy(
            [[1.3, 1.0], [1.0, 1.0]], [[1.0, 3.0], [0.0, 0.0]], [[1, 1], [0, 0]], "seq-mean-token-mean"
        ),
        hides_on=lambda: _policy(
            [[1.3, 1.0], [0.9, 1.0]], [[1.0, 3.0], [2.0, 0.0]], [[1, 1], [1, 0]], "seq-mean-token-mean"
        ),
    ),
    MutantSpec(
        "E2-policy-loss-multiplies-mask",
        "E2",
        "policy_loss",
        "(objective * mask).sum() / mask.sum() on unsanitised inputs: NaN in padding gives a NaN loss",
        "NaN, inf or huge values in masked-out entries",
        policy_loss_multiplying_mask,
        shows_on=lambda: _policy([[1.3, 0.6, 1.0]], [[1.0, -2.0, 0.0]], [[1, 1, 0]], fill=NAN),
        hides_on=lambda: _policy([[1.3, 0.6, 1.0]], [[1.0, -2.0, 0.0]], [[1, 1, 0]], fill=0.5),
    ),
    MutantSpec(
        "E2-empty-batch-nan-loss",
        "E2",
        "policy_loss",
        "token-mean divides by mask.sum() with no guard: a batch without action tokens gives NaN",
        "a batch without action tokens",
        policy_loss_token_mean_without_guard,
        shows_on=lambda: _policy([[1.0, 1.0]], [[1.0, 1.0]], [[0, 0]]),
        hides_on=lambda: _policy([[1.3, 1.0]], [[1.0, 1.0]], [[1, 0]]),
    ),
)
