"""Loss aggregation: how a (B, T) per-token loss becomes one number (spec PG-2, AGG-1..3).

Every loss of ppo-ref (``policy_loss``, ``value_loss``, ``cispo_loss``, ``kl_loss``) reduces its
per-token terms with :func:`aggregate_loss`'s rule, and takes its keywords. The keywords
``token_count`` and ``row_count`` carry the *whole batch's* counts into a call that sees only a part
of it (one micro-batch of a gradient-accumulation step, one data-parallel shard): with them, the sum
of the calls over any split of the batch equals one call on the whole batch, in value and gradient
(AGG-2). Without them every call normalises by its own counts, and the sum over micro-batches of
per-micro-batch means weighs a token of a short micro-batch more than a token of a long one (verl
#7321, SkyRL PR #925).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from ppo_ref._validate import check_finite_where, check_float, check_mask, check_real
from ppo_ref.masked import masked_sum

__all__ = [
    "COUNT_AGGREGATIONS",
    "LOSS_AGGREGATIONS",
    "NORM_AGGREGATION",
    "LossAggregation",
    "aggregate_loss",
    "check_aggregation",
]

LossAggregation = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
LOSS_AGGREGATIONS: tuple[str, ...] = get_args(LossAggregation)
"""Every ``loss_agg`` mode, in the order of :func:`aggregate_loss`'s table."""
NORM_AGGREGATION = "seq-mean-token-sum-norm"
"""The one mode that divides by a constant (``norm_constant``, Dr. GRPO) instead of the batch's counts."""
COUNT_AGGREGATIONS: tuple[str, ...] = tuple(m for m in LOSS_AGGREGATIONS if m != NORM_AGGREGATION)
"""The modes that normalise by the batch's own token or row counts (every mode but the norm mode)."""


def _check_count(value: object, name: str, at_least: int) -> float | None:
    """A whole-batch count: None, or a whole number (int or 1-element tensor) >= max(1, at_least)."""
    if value is None:
        return None
    number = check_real(value, name, low=0.0, low_open=True)
    if number != int(number):
        raise ValueError(f"{name}: expected a whole number, got {number}")
    if number < at_least:
        raise ValueError(
            f"{name}: expected the whole batch's count, at least the {at_least} counted in this call, "
            f"got {int(number)}"
        )
    return number


def check_aggregation(
    keep: Tensor,
    loss_agg: str,
    norm_constant: float | None,
    token_count: object,
    row_count: object,
) -> tuple[float | None, float | None, float | None]:
    """Validate the aggregation arguments against the bool mask ``keep``.

    Returns ``(norm_constant, token_count, row_count)`` as floats (None where not given). Each
    count must be at least what this call counts itself: a whole batch cannot have fewer action
    tokens (or rows) than one of its micro-batches.
    """
    if loss_agg not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss_agg: expected one of {LOSS_AGGREGATIONS}, got {loss_agg!r}")
    if loss_agg == "seq-mean-token-sum-norm":
        if norm_constant is None:
            raise ValueError(
                "norm_constant: required with loss_agg='seq-mean-token-sum-norm' (Dr. GRPO divides by "
                "the maximum response length, never by this batch's padded width)"
            )
        constant: float | None = check_real(norm_constant, "norm_constant", low=0.0, low_open=True)
    elif norm_constant is not None:
        raise ValueError(
            f"norm_constant: only used with loss_agg='seq-mean-token-sum-norm', got {norm_constant!r} "
            f"with loss_agg={loss_agg!r}"
        )
    else:
        constant = None
    # This call's own counts are computed only for a count that was passed (each is a pass over the
    # mask and a device sync).
    tokens = (
        None
        if token_count is None
        else _check_count(token_count, "token_count", int(torch.count_nonzero(keep)))
    )
    if tokens is not None and loss_agg != "token-mean":
        raise ValueError(f"token_count: only used with loss_agg='token-mean', got loss_agg={loss_agg!r}")
    if row_count is None:
        return constant, tokens, None
    if loss_agg == "token-mean":
        raise ValueError("row_count: not used with loss_agg='token-mean' (use token_count)")
    local_rows = keep.shape[0] if loss_agg == "seq-mean-token-sum-norm" else int(keep.any(dim=1).sum())
    rows = _check_count(row_count, "row_count", local_rows)
    return constant, tokens, rows


def aggregate_loss(
    per_token: Tensor,
    mask: Tensor,
    loss_agg: str = "token-mean",
    *,
    norm_constant: float | None = None,
    token_count: int | Tensor | None = None,
    row_count: int | Tensor | None = None,
) -> Tensor:
    r"""Reduce a (B, T) per-token loss to a scalar over the action tokens (spec PG-2, AGG-1..3).

    ============================  ========================================================  =========
    ``loss_agg``                  result                                                    counts
    ============================  ========================================================  =========
    ``token-mean``                :math:`\sum_{b,t} m\,\ell / N` (every action token of     N
                                  the batch weighs the same)
    ``seq-mean-token-mean``       :math:`\sum_b (\sum_t m\,\ell / n_b) / R`                 R
    ``seq-mean-token-sum``        :math:`\sum_b \sum_t m\,\ell / R`                         R
    ``seq-mean-token-sum-norm``   :math:`\sum_{b,t} m\,\ell / (B \cdot C)` (Dr. GRPO)        B
    ============================  ========================================================  =========

    ``N`` is the number of action tokens (``token_count`` if given), ``n_b`` those of row ``b``,
    ``R`` the number of rows with at least one action token (``row_count`` if given), ``B`` the
    number of rows passed, empty ones included (``row_count`` if given), and ``C`` the
    ``norm_constant`` (required for ``seq-mean-token-sum-norm`` and only there; Dr. GRPO uses the
    maximum response length, never the padded width of one batch).

    ``token_count`` and ``row_count`` are the *whole batch's* counts for a call that sees one
    micro-batch (or one process's shard): summing such calls over any split of the batch gives one
    call on the whole batch, value and gradient (AGG-2). Each must be a whole number at least this
    call's own count, and is accepted only by the modes that use it.

    Rows without an action token are left out of ``R``; a batch without any action token gives 0
    (still differentiable, with zero gradient). Masked-out entries are ignored.

    Example (row a: 1 token with loss 1; row b: 9 tokens with loss 0)::

        >>> loss = torch.zeros(2, 9); loss[0, 0] = 1.0
        >>> mask = torch.ones(2, 9); mask[0, 1:] = 0
        >>> aggregate_loss(loss, mask), aggregate_loss(loss, mask, "seq-mean-token-mean")
        (tensor(0.1000), tensor(0.5000))
        >>> aggregate_loss(loss, mask, "seq-mean-token-sum-norm", norm_constant=10)  # 1 / (2 * 10)
        tensor(0.0500)
        >>> aggregate_loss(loss[:1], mask[:1], token_count=10)  # row a's share of the batch's mean
        tensor(0.1000)
    """
    keep = check_mask(mask)
    check_float(per_token, "per_token", shape=keep.shape)
    # One zeroing pass serves the finiteness check and the reduction: a finite sum of the kept
    # entries (the row sums' sum in the per-row modes) proves them finite; only a non-finite one
    # needs the entry-by-entry look of check_finite_where.
    weights = mask_weights(keep, per_token.dtype)
    # where(keep, per_token, 0) while per_token is finite (see mask_weights)
    row_sums, total = _sums(per_token * weights, loss_agg)
    if not bool(torch.isfinite(total.detach())):
        # An inf or NaN somewhere (allowed off the mask, where 0 * inf = NaN): zero with where.
        zero = torch.zeros((), dtype=per_token.dtype, device=per_token.device)
        row_sums, total = _sums(torch.where(keep, per_token, zero), loss_agg)
        if not bool(torch.isfinite(total.detach())):
            check_finite_where(per_token, keep, "per_token")
    constant, tokens, rows = check_aggregation(keep, loss_agg, norm_constant, token_count, row_count)
    return _reduce(keep, loss_agg, constant, tokens, rows, total, row_sums, weights)


def aggregate(
    per_token: Tensor,
    keep: Tensor,
    loss_agg: str,
    norm_constant: float | None = None,
    token_count: float | None = None,
    row_count: float | None = None,
) -> Tensor:
    """:func:`aggregate_loss` without validation, for arguments :func:`check_aggregation` returned."""
    if loss_agg in _PER_ROW:
        return _reduce(
            keep, loss_agg, norm_constant, token_count, row_count, None, masked_sum(per_token, keep, dim=1)
        )
    return _reduce(keep, loss_agg, norm_constant, token_count, row_count, masked_sum(per_token, keep), None)


_PER_ROW = ("seq-mean-token-mean", "seq-mean-token-sum")
"""The modes that reduce each row first (they need the per-row sums, not the total)."""


def mask_weights(keep: Tensor, dtype: torch.dtype) -> Tensor:
    """The bool mask ``keep`` as 0/1 in ``dtype``, through uint8: the same numbers as
    ``keep.to(dtype)``, whose bool-to-float cast took 5-7x longer on the CPU (torch 2.13).

    Multiplying by these weights zeroes a tensor off the mask as ``where(keep, x, 0)`` does while
    every entry of ``x`` is finite (``x * 1 = x``; ``x * 0`` is a zero, ``-0.0`` for negative ``x``,
    and torch's sums give +0 for zeros of either sign), at a third to a quarter of the cost of a
    ``where`` on a bool mask; the gradient ``g * weights`` equals ``where(keep, g, 0)`` up to the
    sign of its zeros. An inf or NaN anywhere, off the mask included (``0 * inf = NaN``), makes the
    sum non-finite, and the callers then redo the zeroing with ``where``.
    """
    return keep.view(torch.uint8).to(dtype)


def _sums(per_token: Tensor, loss_agg: str) -> tuple[Tensor | None, Tensor]:
    """The row sums of ``per_token`` (the per-row modes, else None) and its total, the row sums'
    sum in the per-row modes (what :func:`_reduce` takes)."""
    row_sums = per_token.sum(dim=1) if loss_agg in _PER_ROW else None
    return row_sums, per_token.sum() if row_sums is None else row_sums.sum()


_EXACT_COUNT = {torch.float32: 2**24, torch.float64: 2**53}
"""Up to how many entries a float sum of 0/1 weights is exact (every partial sum a whole number
the dtype represents)."""


def _count(keep: Tensor, weights: Tensor | None, dim: int | None = None) -> Tensor:
    """``keep.sum(dim)``, from the float ``weights`` where their sum is exact (float32 or float64
    and a mask of at most 2**24 or 2**53 entries, so that any sum of these counts is exact too): the
    same numbers, and a division of a float of ``weights``' dtype by them gives what a division by
    the int64 count gives."""
    if weights is not None and keep.numel() <= _EXACT_COUNT.get(weights.dtype, 0):
        return weights.sum() if dim is None else weights.sum(dim)
    return keep.sum() if dim is None else keep.sum(dim)


def _reduce(
    keep: Tensor,
    loss_agg: str,
    norm_constant: float | None,
    token_count: float | None,
    row_count: float | None,
    total: Tensor | None,
    row_sums: Tensor | None,
    weights: Tensor | None = None,
) -> Tensor:
    """The reduction of :func:`aggregate` from the masked sum ``total`` (token-mean,
    seq-mean-token-sum-norm) or the masked per-row sums ``row_sums`` (the per-row modes).
    ``weights`` (optional) is :func:`mask_weights` of ``keep`` in the dtype of ``total`` or
    ``row_sums``, for faster counts."""
    reduced = total if total is not None else row_sums
    if weights is not None and (reduced is None or weights.dtype != reduced.dtype):
        weights = None
    if loss_agg == "token-mean":
        assert total is not None
        return total / (token_count if token_count is not None else _count(keep, weights).clamp(min=1))
    if loss_agg == "seq-mean-token-sum-norm":
        assert norm_constant is not None and total is not None
        rows = row_count if row_count is not None else max(keep.shape[0], 1)
        return total / (rows * norm_constant)
    assert row_sums is not None
    row_tokens = _count(keep, weights, dim=1)
    row_values = row_sums / row_tokens.clamp(min=1) if loss_agg == "seq-mean-token-mean" else row_sums
    nonempty = row_tokens > 0
    denominator = row_count if row_count is not None else nonempty.sum().clamp(min=1)
    return masked_sum(row_values, nonempty) / denominator
