"""Mutants of the rollout corrections (IS-1..3): TIS, MIS/IcePop and their sequence levels."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import ppo_ref
from tests.mutants.base import MutantSpec, bool_mask, work_dtype


def _row_log_w(log_w: Tensor, keep: Tensor, level: str) -> Tensor:
    """Each token's log-ratio at ``level`` (the row's sum or mean broadcast for the sequence levels)."""
    if level == "token":
        return log_w
    row = torch.where(keep, log_w, torch.zeros((), dtype=log_w.dtype)).sum(dim=1)
    if level == "sequence-geometric":
        row = row / keep.sum(dim=1).clamp(min=1)
    return row.unsqueeze(1).expand_as(log_w)


def _validated(
    logp: Tensor, rollout_logp: Tensor, mask: Tensor, level: str, mode: str, high: float, low: float | None
) -> Tensor:
    """The reference's weights (which validates the arguments)."""
    return ppo_ref.rollout_correction(logp, rollout_logp, mask, level=level, mode=mode, high=high, low=low)


# --- IS-1: token-level truncate and mask ------------------------------------------------------------


def rollout_correction_truncate_as_mask(
    logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    high: float,
    low: float | None = None,
) -> Tensor:
    _validated(logp, rollout_logp, mask, level, mode, high, low)
    # BUG (IS-1): mode="truncate" rejects instead of truncating (TRL's docstring calls token_truncate
    # the default while the code runs sequence_mask): a token with w > high gets 0, not high
    return ppo_ref.rollout_correction(logp, rollout_logp, mask, level=level, mode="mask", high=high, low=low)


def rollout_correction_truncate_ignores_low(
    logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    high: float,
    low: float | None = None,
) -> Tensor:
    _validated(logp, rollout_logp, mask, level, mode, high, low)
    # BUG (IS-1): TIS as min(w, high) only: a lower bound given for truncation is dropped
    lower = None if mode == "truncate" else low
    return ppo_ref.rollout_correction(logp, rollout_logp, mask, level=level, mode=mode, high=high, low=lower)


# --- IS-2: sequence levels --------------------------------------------------------------------------


def rollout_correction_geometric_is_product(
    logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    high: float,
    low: float | None = None,
) -> Tensor:
    _validated(logp, rollout_logp, mask, level, mode, high, low)
    # BUG (TRL #4772): sequence-geometric computed as the product exp(sum log w): the length-free
    # ratio replaced by one whose spread grows with the length
    actual = "sequence" if level == "sequence-geometric" else level
    return ppo_ref.rollout_correction(logp, rollout_logp, mask, level=actual, mode=mode, high=high, low=low)


def rollout_correction_rejected_row_keeps_tokens(
    logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    high: float,
    low: float | None = None,
) -> Tensor:
    weights = _validated(logp, rollout_logp, mask, level, mode, high, low)
    if level == "token" or mode != "mask":
        return weights
    token = ppo_ref.rollout_correction(
        logp, rollout_logp, mask, level="token", mode="mask", high=high, low=low
    )
    rejected = bool_mask(mask) & (weights == 0)
    # BUG (IS-2): a rejected row falls back to the token-level mask: its tokens whose own ratio is
    # inside [low, high] keep their token weight, instead of the whole row losing every token
    return torch.where(rejected, token, weights)


def rollout_correction_padding_in_sequence_ratio(
    logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    high: float,
    low: float | None = None,
) -> Tensor:
    weights = _validated(logp, rollout_logp, mask, level, mode, high, low)
    if level == "token":
        return weights
    keep = bool_mask(mask)
    dtype = work_dtype(logp, rollout_logp)
    log_w = logp.detach().to(dtype) - rollout_logp.detach().to(dtype)
    # BUG (IS-2): the row's log-ratio summed over every position, padding included (the sampler's
    # and the trainer's log-probs of padded slots are not masked before the sum)
    row = log_w.sum(dim=1)
    if level == "sequence-geometric":
        row = row / keep.sum(dim=1).clamp(min=1)
    return _finish(row.unsqueeze(1).expand_as(log_w), keep, mode, high, low)


def _finish(log_w: Tensor, keep: Tensor, mode: str, high: float, low: float | None) -> Tensor:
    """Truncate or mask exp(log_w) as the reference does, 0 off the mask."""
    zero = torch.zeros((), dtype=log_w.dtype)
    w = torch.exp(log_w)
    if mode == "truncate":
        w = w.clamp(min=low, max=high)
    else:
        inside = w <= high if low is None else (w >= low) & (w <= high)
        w = torch.where(inside, w, zero)
    return torch.where(keep, w, zero)


# --- IS-3: no gradient, 0 off the mask, 1 on-policy -------------------------------------------------


def rollout_correction_not_detached(
    logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    high: float,
    low: float | None = None,
) -> Tensor:
    _validated(logp, rollout_logp, mask, level, mode, high, low)
    keep = bool_mask(mask)
    dtype = work_dtype(logp, rollout_logp)
    zero = torch.zeros((), dtype=dtype)
    # BUG (IS-3): the weights keep the graph of logp (no .detach()): multiplying the loss by them
    # adds a gradient through the correction itself
    log_w = torch.where(keep, logp.to(dtype), zero) - torch.where(keep, rollout_logp.to(dtype), zero)
    return _finish(_row_log_w(log_w, keep, level), keep, mode, high, low)


def rollout_correction_one_off_mask(
    logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    high: float,
    low: float | None = None,
) -> Tensor:
    weights = _validated(logp, rollout_logp, mask, level, mode, high, low)
    # BUG (IS-3): exp(0) = 1 left in the masked-out slots (the log-ratio was zeroed there, the
    # weight was never masked): padding gets weight 1
    return torch.where(bool_mask(mask), weights, torch.ones((), dtype=weights.dtype))


def rollout_correction_probability_ratio(
    logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    high: float,
    low: float | None = None,
) -> Tensor:
    weights = _validated(logp, rollout_logp, mask, level, mode, high, low)
    if level != "token":
        return weights
    keep = bool_mask(mask)
    # BUG (IS-3): w = exp(logp) / exp(rollout_logp), a ratio of probabilities in the inputs' dtype:
    # below log-prob -104 float32 underflows to 0 and 0 / 0 = NaN where the log-probs agree
    ratio = torch.exp(logp.detach()) / torch.exp(rollout_logp.detach())
    log_w = torch.where(keep, ratio.log().to(weights.dtype), torch.zeros((), dtype=weights.dtype))
    return _finish(log_w, keep, mode, high, low)


# --- specs ------------------------------------------------------------------------------------------


def _is(
    ratios: list[list[float]],
    mask: list[list[int]] | None = None,
    dtype: torch.dtype = torch.float64,
    base: float = -1.0,
    grad: bool = False,
    **kw: Any,
) -> dict[str, Any]:
    """rollout_correction inputs with the given ratios w on the mask (rollout_logp = ``base``);
    masked-out slots hold differing log-probs (-0.5 against -3)."""
    w = torch.tensor(ratios, dtype=torch.float64)
    keep = torch.ones_like(w, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool)
    rollout = torch.where(keep, torch.full_like(w, base), torch.full_like(w, -3.0))
    logp = torch.where(keep, rollout + w.log(), torch.full_like(w, -0.5))
    return {
        "logp": logp.to(dtype).requires_grad_(grad),
        "rollout_logp": rollout.to(dtype),
        "mask": keep.long(),
        "high": 2.0,
        **kw,
    }


PADDED = [[1, 1, 0], [1, 0, 0]]

SPECS: tuple[MutantSpec, ...] = (
    MutantSpec(
        "IS1-truncate-as-mask",
        "IS-1",
        "rollout_correction",
        "mode='truncate' zeroes a weight above high instead of truncating it to high",
        "mode='truncate' with a weight above high",
        rollout_correction_truncate_as_mask,
        shows_on=lambda: _is([[3.0, 0.5, 1.2]]),
        hides_on=lambda: _is([[1.8, 0.5, 1.2]]),
        clause="IS-1",
    ),
    MutantSpec(
        "IS1-truncate-ignores-low",
        "IS-1",
        "rollout_correction",
        "mode='truncate' with low: only min(w, high), the lower bound dropped",
        "mode='truncate' with low given and a weight below it",
        rollout_correction_truncate_ignores_low,
        shows_on=lambda: _is([[3.0, 0.2, 1.2]], low=0.5),
        hides_on=lambda: _is([[3.0, 0.6, 1.2]], low=0.5),
        clause="IS-1",
    ),
    MutantSpec(
        "TRL4772-geometric-is-product",
        "TRL#4772",
        "rollout_correction",
        "level='sequence-geometric' computes the product exp(sum log w), not exp(mean log w)",
        "level='sequence-geometric' with a row of two or more action tokens",
        rollout_correction_geometric_is_product,
        shows_on=lambda: _is([[1.5, 1.2, 1.0], [0.8, 1.0, 1.0]], PADDED, level="sequence-geometric"),
        hides_on=lambda: _is(
            [[1.5, 1.2, 1.0], [0.8, 1.0, 1.0]], [[1, 0, 0], [1, 0, 0]], level="sequence-geometric"
        ),
        clause="IS-2",
    ),
    MutantSpec(
        "IS2-rejected-row-keeps-tokens",
        "IS-2",
        "rollout_correction",
        "a row rejected at a sequence level keeps its tokens whose own ratio is inside the bounds",
        "mode='mask' at a sequence level with a rejected row",
        rollout_correction_rejected_row_keeps_tokens,
        shows_on=lambda: _is(
            [[1.5, 1.5, 1.0], [0.8, 1.0, 1.0]], PADDED, level="sequence", mode="mask", low=0.5
        ),
        hides_on=lambda: _is(
            [[1.2, 1.5, 1.0], [0.8, 1.0, 1.0]], PADDED, level="sequence", mode="mask", low=0.5
        ),
        clause="IS-2",
    ),
    MutantSpec(
        "IS2-padding-in-sequence-ratio",
        "IS-2",
        "rollout_correction",
        "the row's log-ratio summed over every position, padding included",
        "a sequence level with masked-out slots whose log-probs differ",
        rollout_correction_padding_in_sequence_ratio,
        shows_on=lambda: _is([[1.5, 1.2, 1.0], [0.8, 1.0, 1.0]], PADDED, level="sequence"),
        hides_on=lambda: _is([[1.5, 1.2, 1.1], [0.8, 1.3, 0.9]], level="sequence"),
        clause="IS-2",
    ),
    MutantSpec(
        "IS3-weights-not-detached",
        "IS-3",
        "rollout_correction",
        "the weights keep logp's graph (no .detach())",
        None,
        rollout_correction_not_detached,
        shows_on=lambda: _is([[1.5, 0.5, 1.2]], grad=True),
        clause="IS-3",
    ),
    MutantSpec(
        "IS3-weight-one-off-mask",
        "IS-3",
        "rollout_correction",
        "masked-out slots keep exp(0) = 1 instead of 0",
        "a mask with padding or holes",
        rollout_correction_one_off_mask,
        shows_on=lambda: _is([[1.5, 0.5, 1.0], [1.2, 1.0, 1.0]], PADDED),
        hides_on=lambda: _is([[1.5, 0.5, 1.1], [1.2, 0.9, 1.3]]),
        clause="IS-3",
    ),
    MutantSpec(
        "IS3-probability-ratio-underflows",
        "IS-3",
        "rollout_correction",
        "w = exp(logp) / exp(rollout_logp) in the inputs' dtype: 0 / 0 = NaN below log-prob -104 in float32",
        "float32 log-probs below about -104 (a very unlikely sampled token)",
        rollout_correction_probability_ratio,
        shows_on=lambda: _is([[1.0, 1.5, 0.5]], dtype=torch.float32, base=-120.0),
        hides_on=lambda: _is([[1.0, 1.5, 0.5]], dtype=torch.float32, base=-20.0),
        clause="IS-3",
    ),
)
