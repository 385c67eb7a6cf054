"""Mutants of the value loss (VF-1, VF-2) and the PPO-Penalty loss (PEN-1)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

import ppo_ref
from ppo_ref import PenaltyLossResult
from tests.mutants.base import MutantSpec, bool_mask, ratio_and_advantages, work_dtype

NAN = math.nan


# --- value_loss -------------------------------------------------------------------------------------


def _value_errors(
    values: Tensor, old_values: Tensor, returns: Tensor, keep: Tensor, clip_eps: float | None
) -> tuple[Tensor, Tensor | None]:
    """Per-token (V - R)^2 and (V_clip - R)^2 (None without clipping), masked-out entries zeroed."""
    dtype = work_dtype(values, old_values, returns)
    zero = torch.zeros((), dtype=dtype)
    v, v_old, target = (torch.where(keep, t.to(dtype), zero) for t in (values, old_values, returns))
    if clip_eps is None:
        return (v - target) ** 2, None
    return (v - target) ** 2, (v_old + (v - v_old).clamp(-clip_eps, clip_eps) - target) ** 2


def value_loss_clip_with_min(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip_eps: float | None = None
) -> Tensor:
    keep = bool_mask(mask)
    unclipped, clipped = _value_errors(values, old_values, returns, keep, clip_eps)
    # BUG (F1): min of the two errors instead of the max (openai/baselines #765 debate)
    squared = unclipped if clipped is None else torch.minimum(unclipped, clipped)
    return 0.5 * ppo_ref.masked_mean(squared, keep)


def value_loss_without_half(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip_eps: float | None = None
) -> Tensor:
    keep = bool_mask(mask)
    unclipped, clipped = _value_errors(values, old_values, returns, keep, clip_eps)
    squared = unclipped if clipped is None else torch.maximum(unclipped, clipped)
    return ppo_ref.masked_mean(squared, keep)  # BUG (F2): no 1/2, value_loss_scale not declared


def value_loss_clipped_only(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip_eps: float | None = None
) -> Tensor:
    keep = bool_mask(mask)
    unclipped, clipped = _value_errors(values, old_values, returns, keep, clip_eps)
    # BUG (F1): stable-baselines3's clipped error alone, value_clip_form not declared
    squared = unclipped if clipped is None else clipped
    return 0.5 * ppo_ref.masked_mean(squared, keep)


def value_loss_one_token_past_eos(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip_eps: float | None = None
) -> Tensor:
    keep = bool_mask(mask)
    # BUG (C2, DS-Chat PR #672): the critic's slice ends at start + mask.sum() + 1, one position too far
    ends = keep.sum(dim=1, keepdim=True) + 1
    value_mask = torch.arange(keep.shape[1]) < ends
    unclipped, clipped = _value_errors(values, old_values, returns, value_mask, clip_eps)
    squared = unclipped if clipped is None else torch.maximum(unclipped, clipped)
    return 0.5 * ppo_ref.masked_mean(squared, value_mask)


def value_loss_multiplying_mask(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip_eps: float | None = None
) -> Tensor:
    squared = (values - returns) ** 2
    if clip_eps is not None:
        clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
        squared = torch.maximum(squared, (clipped - returns) ** 2)
    weights = mask.to(squared.dtype)
    # BUG (E2): (loss * mask).sum() / mask.sum(): 0 * nan = nan from a padded slot
    return 0.5 * (squared * weights).sum() / weights.sum().clamp(min=1)


# --- ppo_penalty_loss -------------------------------------------------------------------------------


def ppo_penalty_loss_inverted_k3(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, beta: float
) -> PenaltyLossResult:
    keep, ratio, adv = ratio_and_advantages(logp, old_logp, advantages, mask)
    log_ratio = ratio.log()
    # BUG (D1): k3 with the inverted ratio pi_old/pi, i.e. it estimates KL(pi || pi_old)
    kl_terms = torch.expm1(-log_ratio) + log_ratio
    loss = -ppo_ref.masked_mean(ratio * adv - beta * kl_terms, keep)
    return PenaltyLossResult(loss=loss, kl=ppo_ref.masked_mean(kl_terms, keep).detach())


# --- specs ------------------------------------------------------------------------------------------


def _value(
    values: list[list[float]],
    clip_eps: float | None = 0.2,
    mask: list[list[int]] | None = None,
    fill: float = 0.0,
) -> dict[str, Any]:
    """value_loss inputs with old values 5 and returns 10; masked-out slots hold ``fill``."""
    v = torch.tensor(values)
    keep = torch.ones_like(v, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool)
    return {
        "values": torch.where(keep, v, torch.tensor(fill)),
        "old_values": torch.where(keep, torch.full_like(v, 5.0), torch.tensor(fill)),
        "returns": torch.where(keep, torch.full_like(v, 10.0), torch.tensor(fill)),
        "mask": keep.long(),
        "clip_eps": clip_eps,
    }


def _penalty() -> dict[str, Any]:
    """ppo_penalty_loss inputs: ratios [2, 0.7] (old_logp = -1), A = [1, -1], beta 0.5, one pad."""
    return {
        "logp": torch.tensor([[-1.0 + math.log(2.0), -1.0 + math.log(0.7), NAN]]),
        "old_logp": torch.tensor([[-1.0, -1.0, NAN]]),
        "advantages": torch.tensor([[1.0, -1.0, NAN]]),
        "mask": torch.tensor([[1, 1, 0]]),
        "beta": 0.5,
    }


SPECS: tuple[MutantSpec, ...] = (
    MutantSpec(
        "F1-value-clip-with-min",
        "F1",
        "value_loss",
        "0.5 * mean(min((V - R)^2, (V_clip - R)^2)): min instead of max",
        "the clipped value loss (clip_eps given) where the two errors differ",
        value_loss_clip_with_min,
        shows_on=lambda: _value([[1.0, 9.0]]),
        hides_on=lambda: _value([[1.0, 9.0]], clip_eps=None),
    ),
    MutantSpec(
        "F2-value-loss-without-half",
        "F2",
        "value_loss",
        "mean((V - R)^2) without the 1/2, value_loss_scale not declared",
        None,
        value_loss_without_half,
        shows_on=lambda: _value([[1.0, 9.0]]),
        convention={"value_loss_scale": 1.0},
    ),
    MutantSpec(
        "F1-value-clipped-error-only",
        "F1",
        "value_loss",
        "0.5 * mean((V_clip - R)^2) (stable-baselines3), value_clip_form not declared",
        "the clipped value loss where the unclipped error is the larger",
        value_loss_clipped_only,
        shows_on=lambda: _value([[1.0]]),
        hides_on=lambda: _value([[9.0, 5.1]]),
        convention={"value_clip_form": "clipped-only"},
    ),
    MutantSpec(
        "C2-value-loss-one-token-past-eos",
        "C2",
        "value_loss",
        "the value loss covers positions [0, mask.sum() + 1): one past the last token (DS-Chat #672)",
        "a mask with padding or holes",
        value_loss_one_token_past_eos,
        shows_on=lambda: _value([[1.0, 9.0, 3.0]], mask=[[1, 1, 0]], fill=7.0),
        hides_on=lambda: _value([[1.0, 9.0, 3.0]], mask=[[1, 1, 1]]),
    ),
    MutantSpec(
        "E2-value-loss-multiplies-mask",
        "E2",
        "value_loss",
        "(loss * mask).sum() / mask.sum() on unsanitised inputs: NaN in padding gives a NaN loss",
        "NaN or inf in masked-out entries",
        value_loss_multiplying_mask,
        shows_on=lambda: _value([[1.0, 9.0, 3.0]], mask=[[1, 1, 0]], fill=NAN),
        hides_on=lambda: _value([[1.0, 9.0, 3.0]], mask=[[1, 1, 0]], fill=7.0),
    ),
    MutantSpec(
        "D1-penalty-k3-inverted",
        "D1",
        "ppo_penalty_loss",
        "the penalty's k3 uses the ratio pi_old/pi, i.e. estimates KL(pi || pi_old)",
        None,
        ppo_penalty_loss_inverted_k3,
        shows_on=_penalty,
    ),
)
