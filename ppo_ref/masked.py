"""Masked statistics: mean, variance and whitening over the action tokens of a batch.

Spec clauses MASK-1 (mean), MASK-2 (variance), MASK-3 (whitening). Masked-out entries are never
read arithmetically: they are replaced by 0 with ``torch.where`` before any sum, so a NaN or inf in
a padded slot reaches neither the result nor a gradient (``x * mask`` would give ``0 * nan = nan``).
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
from torch import Tensor

from ppo_ref._validate import check_bool, check_finite_where, check_float, check_mask

__all__ = [
    "EPS_PLACEMENTS",
    "WHITEN_EPS",
    "EpsPlacement",
    "masked_mean",
    "masked_mean_var",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]

WHITEN_EPS = 1e-8
"""Added to the variance before the square root in :func:`masked_whiten`."""
EpsPlacement = Literal["inside-sqrt", "outside-sqrt", "clamp"]
EPS_PLACEMENTS: tuple[str, ...] = get_args(EpsPlacement)
"""Where :func:`masked_whiten` adds its epsilon (``eps_placement``)."""


def _checked(x: Tensor, mask: Tensor, x_name: str = "x") -> tuple[Tensor, Tensor, Tensor]:
    """Validate; return ``x`` with its masked-out entries zeroed, the bool mask, and the zeroed sum."""
    keep = check_mask(mask, ndim=None)
    check_float(x, x_name, shape=keep.shape)
    # Zero the masked-out entries before any arithmetic: a product such as (x - mean) * scale would
    # otherwise send 0 * inf = NaN into the gradient of every masked-in entry.
    zeroed = torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))
    total = zeroed.sum()
    if not bool(torch.isfinite(total.detach())):  # a finite sum proves every masked-in entry finite
        check_finite_where(x, keep, x_name)
    return zeroed, keep, total


def masked_sum(x: Tensor, keep: Tensor, dim: int | None = None) -> Tensor:
    """Sum of the entries of ``x`` where the bool tensor ``keep`` is True; the others may hold NaN.

    No validation: an internal building block for the checked functions.
    """
    zeroed = torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return zeroed.sum() if dim is None else zeroed.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    r"""Mean of the masked-in entries of ``x`` (spec MASK-1).

    .. math:: \operatorname{mean}_m(x) = \frac{\sum_i m_i x_i}{\sum_i m_i}
              \quad\text{(0 when } \textstyle\sum_i m_i = 0\text{)}

    ================  ==========  ============================================================
    argument          shape       meaning
    ================  ==========  ============================================================
    ``x``             any         floating-point values; masked-out entries may be NaN or inf
    ``mask``          ``x.shape`` bool or 0/1: 1 keeps the entry
    ``dim``           int or None None: one mean over everything (0-dim result); an int: the
                                  mean along that dimension (that dimension removed)
    ================  ==========  ============================================================

    An empty mask (or an empty slice along ``dim``) gives 0, never NaN.

    Example::

        >>> masked_mean(torch.tensor([[1.0, 2.0, float("nan")]]), torch.tensor([[1, 1, 0]]))
        tensor(1.5000)
    """
    x, keep, full_sum = _checked(x, mask)
    if dim is not None and (
        isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < max(x.dim(), 1)
    ):
        raise ValueError(f"dim: expected an int in [{-x.dim()}, {x.dim() - 1}], got {dim}")
    total = full_sum if dim is None else masked_sum(x, keep, dim)
    count = torch.count_nonzero(keep) if dim is None else torch.count_nonzero(keep, dim)
    return total / count.clamp(min=1).to(total.dtype)


def masked_mean_var(
    x: Tensor, keep: Tensor, unbiased: bool, kept_sum: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Masked mean, masked variance, and ``x - mean`` on the mask (0 off it), as a tuple.

    No validation beyond the count: an internal building block of :func:`masked_var`,
    :func:`masked_whiten` and :func:`ppo_ref.explained_variance`, for callers that have already
    checked their input. ``keep`` is a bool tensor of ``x``'s shape; off it, ``x`` may hold NaN.
    ``unbiased`` divides the sum of squares by ``n - 1`` instead of ``n``; ``kept_sum``, when the
    caller has it, is the sum of ``x`` over ``keep``. Fewer than 2 kept entries is a ``ValueError``.

    Example::

        >>> mean, var, centered = masked_mean_var(
        ...     torch.tensor([1.0, 2.0, 3.0, float("nan")]), torch.tensor([True, True, True, False]), True
        ... )
        >>> mean, var, centered
        (tensor(2.), tensor(1.), tensor([-1.,  0.,  1.,  0.]))
    """
    count = int(torch.count_nonzero(keep))
    if count < 2:
        raise ValueError(f"mask: expected at least 2 masked-in entries for a variance, got {count}")
    mean = (masked_sum(x, keep) if kept_sum is None else kept_sum) / count
    centered = torch.where(keep, x - mean, torch.zeros((), dtype=x.dtype, device=x.device))
    var = (centered * centered).sum() / (count - 1 if unbiased else count)
    return mean, var, centered


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    r"""Variance of the masked-in entries of ``x`` (spec MASK-2).

    .. math:: \operatorname{var}_m(x) = \frac{\sum_i m_i (x_i - \bar x)^2}{n - 1},\qquad
              n = \textstyle\sum_i m_i,\ \bar x = \operatorname{mean}_m(x)

    ``unbiased=False`` divides by ``n`` instead of ``n - 1``. ``x`` and ``mask`` have the same
    shape (any); the result is 0-dim. Fewer than 2 masked-in entries is a ``ValueError``.

    Example::

        >>> masked_var(torch.tensor([1.0, 2.0, 3.0, 100.0]), torch.tensor([1, 1, 1, 0]))
        tensor(1.)
    """
    x, keep, total = _checked(x, mask)
    return masked_mean_var(x, keep, check_bool(unbiased, "unbiased"), total)[1]


def masked_whiten(
    x: Tensor,
    mask: Tensor,
    shift_mean: bool = True,
    unbiased: bool = True,
    *,
    eps: float = WHITEN_EPS,
    eps_placement: str = "inside-sqrt",
) -> Tensor:
    r"""Whiten the masked-in entries of ``x`` with their own mean and variance (MASK-3).

    .. math:: w_i = \frac{x_i - \bar x}{\sqrt{\operatorname{var}_m(x) + 10^{-8}}}
              \quad(\operatorname{var}_m \text{ of :func:`masked_var`, with ``unbiased``})
              \;(+\,\bar x \text{ if } \texttt{shift\_mean=False})

    The statistics are taken over every masked-in entry of the whole tensor (for advantages: all
    action tokens of the batch, never per row). ``shift_mean=False`` adds the mean back, so only
    the scale changes (the convention for reward whitening). ``unbiased=False`` uses the biased
    variance (divided by ``n`` instead of ``n - 1``, as :func:`masked_var` with ``unbiased=False``;
    OpenRLHF's and lm-human-preferences' whitening). Masked-out entries of the result are 0. ``x``
    and ``mask`` have the same shape; fewer than 2 masked-in entries is a ``ValueError``.

    ``eps`` (default ``1e-8``, > 0) and ``eps_placement`` say where the epsilon goes: ``"inside-sqrt"``
    (the default, the formula above), ``"outside-sqrt"`` (divide by ``sqrt(var) + eps``:
    stable-baselines3's ``(A - mean) / (std + 1e-8)``) or ``"clamp"`` (divide by
    ``sqrt(max(var, eps))``: OpenRLHF's ``var.clamp(min=eps).rsqrt()``). They are the declared
    whitening conventions of other libraries; ppo-ref itself always uses the default.

    Example (mean 2; unbiased variance 2/2 = 1, biased 2/3, so the scale is 1/sqrt(2/3 + 1e-8))::

        >>> masked_whiten(torch.tensor([1.0, 2.0, 3.0, 9.0]), torch.tensor([1, 1, 1, 0]))
        tensor([-1.,  0.,  1.,  0.])
        >>> masked_whiten(torch.tensor([1.0, 2.0, 3.0, 9.0]), torch.tensor([1, 1, 1, 0]), unbiased=False)
        tensor([-1.2247,  0.0000,  1.2247,  0.0000])
        >>> masked_whiten(torch.tensor([1.0, 2.0, 3.0, 9.0]), torch.tensor([1, 1, 1, 0]), eps=1.0,
        ...               eps_placement="outside-sqrt")  # (x - 2) / (1 + 1)
        tensor([-0.5000,  0.0000,  0.5000,  0.0000])
    """
    x, keep, total = _checked(x, mask)
    shift_mean = check_bool(shift_mean, "shift_mean")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"eps: expected a finite number > 0, got {eps!r}")
    if eps_placement not in EPS_PLACEMENTS:
        raise ValueError(f"eps_placement: expected one of {list(EPS_PLACEMENTS)}, got {eps_placement!r}")
    mean, var, centered = masked_mean_var(x, keep, check_bool(unbiased, "unbiased"), total)
    if eps_placement == "inside-sqrt":
        scale = torch.rsqrt(var + eps)
    elif eps_placement == "outside-sqrt":
        scale = 1.0 / (torch.sqrt(var) + eps)
    else:
        scale = torch.rsqrt(var.clamp(min=eps))
    if shift_mean:
        return centered * scale  # already 0 off the mask (0 * scale)
    return torch.where(keep, centered * scale + mean, torch.zeros((), dtype=x.dtype, device=x.device))
