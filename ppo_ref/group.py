"""Group-relative advantages of critic-free trainers: GRPO, Dr. GRPO, RLOO (spec GRP-1..4)."""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from ppo_ref._validate import check_finite_where, check_float, check_real, compute_dtype

__all__ = [
    "GROUP_METHODS",
    "SINGLETON_RULES",
    "STD_SCOPES",
    "GroupMethod",
    "SingletonRule",
    "StdScope",
    "group_advantages",
]

GroupMethod = Literal["grpo", "dr_grpo", "rloo"]
GROUP_METHODS: tuple[str, ...] = get_args(GroupMethod)
"""The group methods of :func:`group_advantages` (its ``method``)."""
StdScope = Literal["group", "batch", "none"]
STD_SCOPES: tuple[str, ...] = get_args(StdScope)
"""Whose standard deviation scales a GRPO advantage (``std_scope``)."""
SingletonRule = Literal["zero", "error"]
SINGLETON_RULES: tuple[str, ...] = get_args(SingletonRule)
"""What :func:`group_advantages` does with a group of one (``singleton``)."""


def _check_group_ids(group_ids: object, rows: int) -> Tensor:
    if not isinstance(group_ids, Tensor):
        raise ValueError(f"group_ids: expected a torch.Tensor, got {type(group_ids).__name__}")
    if group_ids.dtype == torch.bool or group_ids.is_floating_point() or group_ids.is_complex():
        raise ValueError(f"group_ids: expected an integer tensor, got dtype {group_ids.dtype}")
    if tuple(group_ids.shape) != (rows,):
        raise ValueError(
            f"group_ids: expected shape ({rows},) (one id per score), got {tuple(group_ids.shape)}"
        )
    return group_ids


def _groups(ids: Tensor) -> tuple[Tensor, Tensor]:
    """``torch.unique(ids, return_inverse=True, return_counts=True)[1:]``: each row's group index
    (groups in increasing id order) and each group's size. Ids already in non-decreasing order
    (the usual layout: a prompt's samples side by side) take ``unique_consecutive``, which gives the
    same two tensors without sorting."""
    if ids.numel() < 2 or bool((ids[1:] >= ids[:-1]).all()):
        _, inverse, counts = torch.unique_consecutive(ids, return_inverse=True, return_counts=True)
    else:
        _, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
    return inverse, counts


def _sqrt(var: Tensor) -> Tensor:
    """sqrt(var) with a zero (not NaN) gradient where var == 0 (singleton and constant groups,
    whose advantages are then replaced by 0, must not send NaN into the scores' gradient)."""
    positive = var > 0
    return torch.where(
        positive, torch.where(positive, var, torch.ones_like(var)).sqrt(), torch.zeros_like(var)
    )


def group_advantages(
    scores: Tensor,
    group_ids: Tensor,
    method: str = "grpo",
    *,
    std_scope: str = "group",
    eps: float = 1e-6,
    singleton: str = "zero",
) -> Tensor:
    r"""One advantage per sequence from its group of samples of the same prompt (spec GRP-1..4).

    With :math:`r_i` the score of sequence :math:`i`, :math:`g` its group (all rows with the same
    ``group_ids`` entry), :math:`n_g` the group's size, :math:`\mu_g` its mean and :math:`\sigma_g`
    its standard deviation with Bessel's correction (:math:`n_g - 1`):

    ================  ==================================================  ==========================
    ``method``        :math:`A_i`                                         source
    ================  ==================================================  ==========================
    ``grpo``          :math:`(r_i - \mu_g) / (\sigma + \epsilon)`         arXiv 2402.03300, §4.1.2
    ``dr_grpo``       :math:`r_i - \mu_g`                                 arXiv 2503.20783, §3
    ``rloo``          :math:`r_i - \frac{1}{n_g - 1}\sum_{j \ne i} r_j`   arXiv 2402.14740
    ================  ==================================================  ==========================

    ``std_scope`` (``grpo`` only) chooses :math:`\sigma`: ``group`` (default) :math:`\sigma_g`;
    ``batch`` the standard deviation of all B scores (group mean, batch scale: TRL's
    ``scale_rewards="batch"``); ``none`` no division (then ``grpo`` equals ``dr_grpo``). ``eps``
    (>= 0) is added to :math:`\sigma`, after the square root.

    ===============  =====  =================================================================
    argument         shape  meaning
    ===============  =====  =================================================================
    ``scores``       (B,)   one finite outcome score per sequence
    ``group_ids``    (B,)   integers; equal ids share a prompt (any order, any group sizes)
    ``singleton``    str    a group of one sample: ``zero`` gives it A = 0 (there is no
                            baseline to compare with); ``error`` raises ``ValueError``
    returns          (B,)   float32, or float64 for float64 scores
    ===============  =====  =================================================================

    Identities: within a group the advantages sum to 0 (every method); ``rloo`` equals
    :math:`n_g / (n_g - 1)` times ``dr_grpo``; a group whose scores are all equal gives exactly 0
    (also with ``eps=0``).

    Example (one group of four: mean 0.5, σ = 0.57735)::

        >>> scores, ids = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([7, 7, 7, 7])
        >>> group_advantages(scores, ids), group_advantages(scores, ids, "rloo")
        (tensor([ 0.8660, -0.8660,  0.8660, -0.8660]), tensor([ 0.6667, -0.6667,  0.6667, -0.6667]))
    """
    check_float(scores, "scores", ndim=1)
    check_finite_where(scores, None, "scores")
    ids = _check_group_ids(group_ids, scores.shape[0])
    if method not in GROUP_METHODS:
        raise ValueError(f"method: expected one of {GROUP_METHODS}, got {method!r}")
    if std_scope not in STD_SCOPES:
        raise ValueError(f"std_scope: expected one of {STD_SCOPES}, got {std_scope!r}")
    if method != "grpo" and std_scope != "group":
        raise ValueError(
            f"std_scope: only method='grpo' divides by a standard deviation, got {std_scope!r} "
            f"with method={method!r}"
        )
    epsilon = check_real(eps, "eps", low=0.0)
    if singleton not in SINGLETON_RULES:
        raise ValueError(f"singleton: expected one of {SINGLETON_RULES}, got {singleton!r}")

    dtype = compute_dtype(scores)
    r = scores.to(dtype)
    if r.numel() == 0:
        return r.clone()
    size = _equal_runs(ids)
    if size is not None:
        return _equal_groups(r, size, method, std_scope, epsilon)
    inverse, counts = _groups(ids)
    # Per-group quantities are computed on the G groups and gathered to the B rows once
    # (index_select): elementwise ops commute with the gather, so the results are those of computing
    # them row by row.
    alone_g = counts < 2
    has_singletons = bool(alone_g.any())
    if singleton == "error" and has_singletons:
        alone = alone_g.index_select(0, inverse)
        row = int(alone.nonzero()[0])
        raise ValueError(
            f"group_ids: group {ids[row].item()} (row {row}) has a single sample, so it has no baseline "
            "(pass singleton='zero' to give such rows A = 0)"
        )
    count_g = counts.to(dtype)
    sums = torch.zeros(counts.shape[0], dtype=dtype, device=r.device).index_add(0, inverse, r)
    centered = r - (sums / count_g).index_select(0, inverse)
    zero = torch.zeros((), dtype=dtype, device=r.device)
    if method == "dr_grpo" or (method == "grpo" and std_scope == "none"):
        advantages = centered
    elif method == "rloo":
        advantages = (
            centered * count_g.index_select(0, inverse) / (count_g - 1).clamp(min=1).index_select(0, inverse)
        )
    elif std_scope == "group":
        squares = torch.zeros(counts.shape[0], dtype=dtype, device=r.device).index_add(
            0, inverse, centered**2
        )
        var = squares / (count_g - 1).clamp(min=1)
        advantages = centered / (_sqrt(var) + epsilon).index_select(0, inverse)
    else:  # grpo with the batch's standard deviation
        batch_std = _sqrt(r.var(unbiased=True)) if r.numel() > 1 else zero
        advantages = centered / (batch_std + epsilon)
    # A constant group gives exactly 0 (its mean, a rounded sum over n, may differ from its members
    # in the last bit, and with eps = 0 its 0 / 0 would be NaN).
    group_max = torch.full_like(sums, -torch.inf).scatter_reduce(0, inverse, r, "amax")
    group_min = torch.full_like(sums, torch.inf).scatter_reduce(0, inverse, r, "amin")
    zeroed_g = group_max == group_min
    if has_singletons:
        zeroed_g |= alone_g
    return torch.where(zeroed_g.index_select(0, inverse), zero, advantages)


def _equal_runs(ids: Tensor) -> int | None:
    """The group size n when the ids form groups of n >= 2 consecutive rows in increasing id order
    (the usual layout: a prompt's n samples side by side), else None.

    n is read from the first rows (at most 1,024 are looked at; a longer first group takes the
    general path), then checked on every row: each block of n rows holds one id, and the blocks'
    ids increase.
    """
    rows = ids.shape[0]
    head = ids[: min(rows, 1025)]
    change = (head != head[0]).nonzero()
    if change.numel() == 0:
        return None
    size = int(change[0, 0])
    if size < 2 or rows % size:
        return None
    blocks = ids.reshape(rows // size, size)
    first = blocks[:, 0]
    if not bool((blocks == first[:, None]).all()) or not bool((first[1:] > first[:-1]).all()):
        return None
    return size


def _equal_groups(r: Tensor, size: int, method: str, std_scope: str, epsilon: float) -> Tensor:
    """:func:`group_advantages` for groups of ``size`` >= 2 consecutive rows (:func:`_equal_runs`).

    The same numbers as the general path, which sums each group with ``index_add`` (in row order,
    starting from 0): the scores are laid out as (size, G), one group per column, and each group's
    sums are added row by row, ``0 + r_0 + r_1 + ...``, in that order (a row-wise ``sum(dim)``
    would round differently). Every other step is elementwise, or a max / min, which do not
    depend on the order.
    """
    groups = r.shape[0] // size
    columns = r.view(groups, size).t().contiguous()  # (size, G): column g is group g
    count = float(size)
    sums = _row_by_row_sum(columns)
    centered = columns - sums / count
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    if method == "dr_grpo" or (method == "grpo" and std_scope == "none"):
        advantages = centered
    elif method == "rloo":
        advantages = centered * count / (count - 1)
    elif std_scope == "group":
        var = _row_by_row_sum(centered**2) / (count - 1)
        advantages = centered / (_sqrt(var) + epsilon)
    else:  # grpo with the batch's standard deviation
        advantages = centered / (_sqrt(r.var(unbiased=True)) + epsilon)
    # A constant group gives exactly 0 (see group_advantages).
    constant = columns.amax(dim=0) == columns.amin(dim=0)
    return torch.where(constant, zero, advantages).t().reshape(-1)


def _row_by_row_sum(columns: Tensor) -> Tensor:
    """``0 + columns[0] + columns[1] + ...``, one addition at a time (index_add's order)."""
    total = columns[0] + 0.0
    for row in columns[1:]:
        total = total + row
    return total
