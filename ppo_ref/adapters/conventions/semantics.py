"""What declared conventions mean on tensors: the helpers the expected side and the checks share.

The suite's expected values (``conformance.variant.ReferenceVariant``: the reference functions
with the declared conventions applied) and its checks both read these: which rows are groups of one
and what ``group_singleton`` does to them, how far a constant group may round under
``constant_groups='rounding'``, the mask with the value slot of
``value_after_last_action_token='trained'``, and the result types of the variant's loss ops (a
statistic declared not reported is ``None``). They sit beside the catalogue whose values they
interpret, importable from :mod:`ppo_ref.adapters.conventions`; the suite imports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from ppo_ref.kl import last_action_index

__all__ = [
    "VariantGSPOLoss",
    "VariantPolicyLoss",
    "bool_mask",
    "constant_group_bound",
    "singleton_rows",
    "singleton_rule",
    "with_value_slot",
]


def singleton_rule(group_singleton: object, method: str) -> str:
    """The declared ``group_singleton`` rule for ``method``'s groups of one: the value itself, or for
    a per-method mapping the method's entry (``'zero'``, the reference, for a method it leaves out).

    >>> singleton_rule({"grpo": "raw-score"}, "rloo"), singleton_rule("unguarded", "rloo")
    ('zero', 'unguarded')
    """
    if isinstance(group_singleton, Mapping):
        return str(group_singleton.get(method, "zero"))
    return str(group_singleton)


def constant_group_bound(scores: Tensor, group_size: int, std_eps: float | None = None) -> float:
    """The largest |advantage| a constant group of ``group_size`` ``scores`` may get under
    ``constant_groups='rounding'``: ``4 * n * eps * max|r|`` (eps the machine epsilon of the scores'
    dtype), the rounding of the group's float mean or leave-one-out sum. With ``std_eps`` (GRPO
    dividing by ``std + std_eps``) that rounding is divided by the group's std, itself rounding
    (>= 0), plus ``std_eps``: the bound is multiplied by ``max(1, 1 / std_eps)`` (three scores of
    -0.2 in float64: ``-0.2 - mean = 2.8e-17``, over ``std + 1e-6`` gives 2.8e-11: verl and RLinf).

    >>> constant_group_bound(torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64), 3) > 1.39e-17
    True
    >>> constant_group_bound(torch.tensor([-0.2, -0.2, -0.2], dtype=torch.float64), 3, std_eps=1e-6) > 2.8e-11
    True
    """
    if group_size < 1:
        raise ValueError(f"group_size: expected >= 1, got {group_size}")
    if std_eps is not None and not std_eps > 0:
        raise ValueError(f"std_eps: expected > 0 or None, got {std_eps}")
    dtype = scores.dtype if scores.dtype.is_floating_point else torch.float64
    largest = float(scores.detach().abs().max()) if scores.numel() else 0.0
    amplification = 1.0 if std_eps is None else max(1.0, 1.0 / std_eps)
    return 4.0 * group_size * torch.finfo(dtype).eps * largest * amplification


def singleton_rows(group_ids: Tensor) -> Tensor:
    """Bool (B,): the rows whose group (equal ``group_ids``) has a single member (GRP-3)."""
    unique: tuple[Tensor, Tensor, Tensor] = torch.unique(group_ids, return_inverse=True, return_counts=True)
    _, inverse, counts = unique
    alone: Tensor = counts[inverse] == 1
    return alone


def bool_mask(mask: Tensor) -> Tensor:
    """``mask`` as bool (itself when it already is)."""
    return mask if mask.dtype == torch.bool else mask != 0


def with_value_slot(mask: Tensor) -> Tensor:
    """Bool (B, T): ``mask`` plus the slot after each row's last action token, where it exists
    (``value_after_last_action_token='trained'``; a row without action tokens gets none).

    >>> with_value_slot(torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])).int().tolist()
    [[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    """
    keep = bool_mask(mask).clone()
    last = last_action_index(keep)
    rows = torch.nonzero((last >= 0) & (last + 1 < keep.shape[1])).squeeze(-1)
    keep[rows, last[rows] + 1] = True
    return keep


@dataclass(frozen=True)
class VariantPolicyLoss:
    """What ``conformance.variant.ReferenceVariant.policy_loss`` returns (``None``: statistic
    declared not reported)."""

    loss: Tensor
    clipfrac: Tensor | None
    approx_kl: Tensor | None
    ratio_outside_frac: Tensor
    ratio_mean: Tensor
    ratio_max: Tensor
    dual_clip_frac: Tensor


@dataclass(frozen=True)
class VariantGSPOLoss:
    """What ``ReferenceVariant.gspo_loss`` returns (``approx_kl`` None: declared not reported)."""

    loss: Tensor
    clipfrac: Tensor
    ratio_mean: Tensor
    ratio_max: Tensor
    approx_kl: Tensor | None
