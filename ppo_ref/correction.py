"""Importance weights that correct for a rollout engine's log-probs (spec IS-1..3)."""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from ppo_ref._validate import check_finite_where, check_float, check_mask, check_real, compute_dtype
from ppo_ref.masked import masked_sum

__all__ = [
    "CORRECTION_LEVELS",
    "CORRECTION_MODES",
    "CorrectionLevel",
    "CorrectionMode",
    "rollout_correction",
]

CorrectionLevel = Literal["token", "sequence", "sequence-geometric"]
CORRECTION_LEVELS: tuple[str, ...] = get_args(CorrectionLevel)
"""Where :func:`rollout_correction` forms its importance weight (``level``)."""
CorrectionMode = Literal["truncate", "mask"]
CORRECTION_MODES: tuple[str, ...] = get_args(CorrectionMode)
"""What :func:`rollout_correction` does with a weight outside its bounds (``mode``)."""


def rollout_correction(
    logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    high: float,
    low: float | None = None,
) -> Tensor:
    r"""Detached (B, T) weights for tokens sampled by an engine whose log-probs differ (IS-1..3).

    The sampler (vLLM, SGLang, another precision) gave ``rollout_logp``; the trainer's own
    recomputation of the sampling policy gives ``logp`` (usually the old log-probs). With
    :math:`\log w_t = \mathrm{logp}_t - \mathrm{rollout\_logp}_t` on the action tokens:

    ======================  ====================================================================
    ``level``               the ratio each action token of row b gets
    ======================  ====================================================================
    ``token``               :math:`w_t`
    ``sequence``            :math:`W_b = \exp\sum_{t \in b} \log w_t` (the product: its spread
                            grows with the length, so long rows are truncated or rejected more)
    ``sequence-geometric``  :math:`\exp(\frac{1}{n_b}\sum_{t \in b} \log w_t)` (length-free)
    ======================  ====================================================================

    ``mode="truncate"`` gives :math:`\min(w, \mathrm{high})` (TIS, Yao et al. 2025), and
    :math:`\max(\cdot, \mathrm{low})` too when ``low`` is given; ``mode="mask"`` keeps :math:`w`
    inside ``[low, high]`` and gives 0 outside (MIS / IcePop), so at a sequence level a rejected
    row loses every token. ``low`` (None: 0) and ``high`` are > 0 with ``low <= high``. The weights
    carry no gradient; they are 0 off the mask and exactly 1 where the two log-probs agree.
    Multiply the per-token policy loss by them (verl PR #2953, TRL #4493).

    ``logp``, ``rollout_logp``, ``mask`` are (B, T). Returns (B, T), float32 or wider.

    Example (log w = [ln 2, ln 0.5, ln 4]; TIS at 3 and IcePop in [0.5, 3])::

        >>> logp, mask = torch.tensor([[2.0, 0.5, 4.0]]).log(), torch.ones(1, 3)
        >>> rollout_correction(logp, torch.zeros(1, 3), mask, high=3.0)
        tensor([[2.0000, 0.5000, 3.0000]])
        >>> rollout_correction(logp, torch.zeros(1, 3), mask, mode="mask", low=0.5, high=3.0)
        tensor([[2.0000, 0.5000, 0.0000]])
    """
    keep = check_mask(mask)
    check_float(logp, "logp", shape=keep.shape)
    check_float(rollout_logp, "rollout_logp", shape=keep.shape)
    if level not in CORRECTION_LEVELS:
        raise ValueError(f"level: expected one of {CORRECTION_LEVELS}, got {level!r}")
    if mode not in CORRECTION_MODES:
        raise ValueError(f"mode: expected one of {CORRECTION_MODES}, got {mode!r}")
    upper = check_real(high, "high", low=0.0, low_open=True)
    lower = None if low is None else check_real(low, "low", low=0.0, low_open=True, high=upper)
    check_finite_where(logp, keep, "logp")
    check_finite_where(rollout_logp, keep, "rollout_logp")
    with torch.no_grad():
        dtype = compute_dtype(logp, rollout_logp)
        zero = torch.zeros((), dtype=dtype, device=keep.device)
        log_w = torch.where(keep, logp.detach().to(dtype), zero) - torch.where(
            keep, rollout_logp.detach().to(dtype), zero
        )
        if level != "token":
            row_sum = masked_sum(log_w, keep, dim=1)
            if level == "sequence-geometric":
                row_sum = row_sum / keep.sum(dim=1).clamp(min=1)
            log_w = row_sum.unsqueeze(1).expand_as(log_w)
        w = torch.exp(log_w)
        if mode == "truncate":
            w = w.clamp(min=lower, max=upper)
        else:
            inside = w <= upper if lower is None else (w >= lower) & (w <= upper)
            w = torch.where(inside, w, zero)
        return torch.where(keep, w, zero)
