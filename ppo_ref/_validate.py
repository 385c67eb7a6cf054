"""Input validation shared by the reference functions.

Every public function checks its arguments here and raises ``ValueError`` naming the argument and
the shape or range it expected. Masked-out entries are never checked: they may hold anything.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "check_bool",
    "check_finite_where",
    "check_float",
    "check_mask",
    "check_real",
    "check_rows",
    "compute_dtype",
]


def _shape(t: Tensor | tuple[int, ...] | torch.Size) -> tuple[int, ...]:
    return tuple(t.shape) if isinstance(t, Tensor) else tuple(t)


def check_mask(mask: object, name: str = "mask", ndim: int | None = 2) -> Tensor:
    """Return ``mask`` as a bool tensor after checking its rank and that it holds only 0 and 1."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(mask).__name__}")
    if ndim is not None and mask.dim() != ndim:
        want = "(B, T)" if ndim == 2 else f"{ndim} dimensions"
        raise ValueError(f"{name}: expected shape {want}, got {_shape(mask)}")
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex():
        raise ValueError(f"{name}: expected bool or 0/1 values, got dtype {mask.dtype}")
    if mask.numel() and not bool(((mask == 0) | (mask == 1)).all()):
        bad = mask[(mask != 0) & (mask != 1)].flatten()[0].item()
        raise ValueError(f"{name}: expected bool or 0/1 values only, found {bad!r}")
    return mask != 0


def check_float(
    x: object,
    name: str,
    shape: tuple[int, ...] | torch.Size | None = None,
    ndim: int | None = None,
    like: str = "mask",
) -> Tensor:
    """Check that ``x`` is a floating-point tensor of the given shape (or rank).

    ``like`` names what the expected shape comes from, for the error message.
    """
    if not isinstance(x, Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)} (same as {like}), got {_shape(x)}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {_shape(x)}")
    return x


def check_finite_where(x: Tensor, mask: Tensor | None, name: str) -> None:
    """Raise if an entry of ``x`` that ``mask`` keeps (every entry if ``mask`` is None) is NaN or inf."""
    with torch.no_grad():
        # Fast path: a finite sum of the kept entries proves every one of them finite (a NaN or an
        # inf among them makes the sum NaN or inf). Only a non-finite sum, which finite entries
        # can also give by overflowing, needs the entry-by-entry look below.
        kept = x.detach()
        if mask is not None:
            kept = torch.where(mask, kept, torch.zeros((), dtype=x.dtype, device=x.device))
        if bool(torch.isfinite(kept.sum())):
            return
        finite = torch.isfinite(x)
        bad = ~finite if mask is None else mask & ~finite
        if bool(bad.any()):
            index = tuple(int(i) for i in bad.nonzero()[0].tolist())
            where = "" if mask is None else "masked-in "
            raise ValueError(f"{name}: {where}entry {index} is {x[index].item()}, expected a finite value")


def check_real(
    value: object,
    name: str,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
) -> float:
    """Check that ``value`` is a finite real number in [low, high] (or (low, high] if ``low_open``)."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name}: expected a number, got a tensor of shape {_shape(value)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: expected a number, got {type(value).__name__}")
    number = float(value)
    too_low = number <= low if low_open else number < low
    if not math.isfinite(number) or too_low or number > high:
        left = "(" if low_open else "["
        raise ValueError(f"{name}: expected a finite number in {left}{low}, {high}], got {number}")
    return number


def check_bool(value: object, name: str) -> bool:
    """Check that ``value`` is exactly True or False (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected True or False, got {value!r}")
    return value


def check_rows(x: object, name: str, rows: int) -> Tensor:
    """Check a per-row vector: floating point, shape (B,), all finite."""
    tensor = check_float(x, name, shape=(rows,), like="one value per row of mask")
    check_finite_where(tensor, None, name)
    return tensor


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """float32, or wider if an input is wider: half-precision inputs are computed in float32."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype
