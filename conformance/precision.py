"""The precision a conformance comparison is made at: the tolerance per dtype, the float32
tolerance for the ops an adapter declares computed in float32, and the comparison itself.

``compute_dtype`` (a declared convention) changes how results are compared rather than what they
must be: a test that calls an op declared computed in float32 compares its float64 results at
:data:`FLOAT32_COMPUTE_TOLERANCE` instead of the float64 tolerance (:func:`tolerance`; hand cases:
:func:`precision_case`); where such an op raises on float64 inputs, it is called again on them cast
to float32, the inputs its pipeline gives it (:class:`.compared.ComparedAdapter`, which notes it:
:func:`refused_float64`). Which ops the current test called is per-test state: the hooks call
:func:`begin_test` before each test.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ppo_ref.adapters import OP_NAMES

from .cases import Case

if TYPE_CHECKING:
    from .support import Context

__all__ = [
    "FLOAT32_COMPUTE_TOLERANCE",
    "TOLERANCES",
    "as_tensor",
    "assert_close",
    "begin_test",
    "computed_dtype",
    "configure_precision",
    "mark_called",
    "mark_refused_float64",
    "precision_case",
    "refused_float64",
    "sign_lost",
    "tolerance",
    "whitened_variance",
    "whitening_scale",
]

TOLERANCES: Mapping[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
}
"""(rtol, atol) per dtype of the inputs: float32 1e-5, float64 1e-7 (a pass needs
``|actual - expected| <= atol + rtol * |expected|``). Half-precision logits are compared with the
float32 tolerance against the float32 reference computed from the same half-precision values."""


FLOAT32_COMPUTE_TOLERANCE: tuple[float, float] = (1e-5, 1e-5)
"""(rtol, atol) for float64 inputs of an op the adapter declares computed in float32
(``compute_dtype``): the float32 tolerance, ``|actual - expected| <= 1e-5 + 1e-5 * |expected|``
(about 170 float32 ulps of the expected value), times :func:`whitening_scale` where whitening
amplifies rounding."""

_FLOAT32_OPS: set[str] = set()
_CALLED: set[str] = set()
_REFUSED_FLOAT64: set[str] = set()


def configure_precision(float32_ops: frozenset[str]) -> None:
    """Declare which ops compute in float32 (the adapter's ``compute_dtype``, once per session)."""
    unknown = sorted(set(float32_ops) - set(OP_NAMES))
    if unknown:
        raise ValueError(f"float32_ops: unknown op names {unknown}")
    _FLOAT32_OPS.clear()
    _FLOAT32_OPS.update(float32_ops)
    _CALLED.clear()


def begin_test() -> None:
    """Forget the ops called by the previous test (called before each test by the hooks)."""
    _CALLED.clear()
    _REFUSED_FLOAT64.clear()


def refused_float64() -> frozenset[str]:
    """The ops declared computed in float32 that raised on float64 inputs in the current test and
    returned when given them in float32 (:class:`ComparedAdapter`)."""
    return frozenset(_REFUSED_FLOAT64)


def mark_called(op: str) -> None:
    """Note that the current test called ``op`` (its tolerance follows from then on)."""
    _CALLED.add(op)


def mark_refused_float64(op: str) -> None:
    """Note that ``op`` raised on float64 inputs in the current test and returned on them in
    float32 (:func:`refused_float64`)."""
    _REFUSED_FLOAT64.add(op)


def computed_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision results from ``dtype`` inputs were computed in: float32 for float64 inputs once
    the current test has called an op the adapter declares computed in float32, else ``dtype``
    (for tests that size a rounding band from the precision)."""
    if dtype == torch.float64 and _CALLED & _FLOAT32_OPS:
        return torch.float32
    return dtype


def sign_lost(advantages: Tensor, mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Bool: action tokens whose nonzero advantage rounds to 0 in the precision the op computes in
    (:func:`computed_dtype`): both branches of the clipped objective are then 0, so which one a
    clip statistic counts is rounding, not a rule (a float64 advantage of -1e-108 is -0.0 in
    float32).

    >>> a = torch.tensor([[-1e-108, 1.5]], dtype=torch.float64)
    >>> sign_lost(a, torch.ones(1, 2, dtype=torch.bool), torch.float32).tolist()
    [[True, False]]
    """
    low = dtype if dtype != torch.float64 else computed_dtype(dtype)
    return (advantages != 0) & (advantages.to(low) == 0) & (mask != 0)


def whitened_variance(variance: float, eps: float, placement: str) -> float:
    """The variance of ``(x - mean) * s`` for inputs of variance ``variance``, where ``s`` is the
    whitening scale of the declared ``whiten_eps`` and ``whiten_eps_placement`` (MASK-2):
    ``1/sqrt(var + eps)`` (inside-sqrt), ``1/(sqrt(var) + eps)`` (outside-sqrt),
    ``1/sqrt(max(var, eps))`` (clamp).

    >>> whitened_variance(4.0, 1e-8, "inside-sqrt") == 4.0 / (4.0 + 1e-8)
    True
    >>> whitened_variance(4.0, 1e-5, "outside-sqrt") == 4.0 / (2.0 + 1e-5) ** 2
    True
    >>> whitened_variance(4.0, 1e-8, "clamp")
    1.0
    """
    if variance < 0 or eps <= 0:
        raise ValueError(f"variance, eps: expected variance >= 0 and eps > 0, got {variance}, {eps}")
    if placement == "inside-sqrt":
        return variance / (variance + eps)
    if placement == "outside-sqrt":
        return variance / (math.sqrt(variance) + eps) ** 2
    if placement == "clamp":
        return variance / max(variance, eps)
    raise ValueError(f"placement: expected inside-sqrt, outside-sqrt or clamp, got {placement!r}")


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for results computed from inputs of ``dtype`` (float32 for half precision);
    :data:`FLOAT32_COMPUTE_TOLERANCE` for float64 inputs once the current test has called an op the
    adapter declares computed in float32."""
    if dtype == torch.float64 and _CALLED & _FLOAT32_OPS:
        return FLOAT32_COMPUTE_TOLERANCE
    return TOLERANCES.get(dtype, TOLERANCES[torch.float32])


def whitening_scale(x: Tensor, mask: Tensor) -> float:
    """How much whitening ``x`` over ``mask`` amplifies rounding: max |x| / sqrt(var + 1e-8).

    Whitening divides by the standard deviation, so an absolute rounding error of the mean grows by
    this factor; comparisons of whitened values scale their absolute tolerance by it (>= 1).
    """
    keep = mask != 0
    values = x.detach().to(torch.float64)[keep]
    if values.numel() < 2:
        return 1.0
    spread = float(values.var(unbiased=True)) + 1e-8
    return max(1.0, float(values.abs().max()) / math.sqrt(spread))


def as_tensor(value: object, what: str) -> Tensor:
    """A tensor from an op's output (tensor, float, numpy array); fails clearly on anything else."""
    if isinstance(value, Tensor):
        return value
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise AssertionError(f"{what}: expected a tensor or a number, got {type(value).__name__}") from error


def assert_close(actual: object, expected: Tensor, dtype: torch.dtype, what: str, scale: float = 1.0) -> None:
    """``actual`` equals ``expected`` within the tolerance of ``dtype``, shape included.

    NaN must match NaN and an infinity the same infinity. ``scale`` (>= 1) multiplies the absolute
    tolerance where the computation amplifies rounding (whitening: :func:`whitening_scale`).
    """
    got = as_tensor(actual, what).detach()
    want = expected.detach()
    if tuple(got.shape) != tuple(want.shape):
        raise AssertionError(f"{what}: expected shape {tuple(want.shape)}, got {tuple(got.shape)}")
    rtol, atol = tolerance(dtype)
    atol *= max(1.0, scale)
    got64, want64 = got.to(torch.float64), want.to(torch.float64)
    both_nan = torch.isnan(got64) & torch.isnan(want64)
    same_inf = torch.isinf(want64) & (got64 == want64)
    close = (got64 - want64).abs() <= atol + rtol * want64.abs()
    good = both_nan | same_inf | close
    if not bool(good.all()):
        bad = (~good).nonzero()
        first = tuple(int(i) for i in bad[0].tolist())
        worst = float(torch.where(good, 0.0, (got64 - want64).abs().nan_to_num(math.inf)).max())
        raise AssertionError(
            f"{what}: {len(bad)} of {want.numel()} entries differ (rtol {rtol:g}, atol {atol:g}); "
            f"first at index {first}: got {got64[first].item()!r}, expected {want64[first].item()!r}; "
            f"largest difference {worst:.3g}"
        )


def precision_case(ctx: Context, case: Case) -> Case:
    """The hand case with the float32 tolerance when the adapter declares its op computed in
    float32 and the case is float64: ``atol = max(case atol, 1e-5 + 1e-5 * m)``, m the largest
    finite magnitude among the case's expected values (:data:`FLOAT32_COMPUTE_TOLERANCE` as an
    absolute bound, because the case runner compares with an absolute tolerance). A group_advantages
    case under a declared ``constant_groups='rounding'`` gets at least ``4 n eps max|r|`` (n the
    number of scores), the rounding a constant group may keep."""
    if case.op == "group_advantages" and ctx.conventions.constant_groups == "rounding":
        # declared: a constant group is 0 up to the rounding of its mean (constant_group_bound)
        scores = [abs(v) for v in _flat(case.inputs.get("scores", [])) if math.isfinite(v)]
        eps = torch.finfo(torch.float32 if case.dtype == "float32" else torch.float64).eps
        bound = 4.0 * len(scores) * eps * max(scores, default=0.0)
        case = dataclasses.replace(case, atol=max(case.atol, bound))
    if case.op not in ctx.conventions.float32_ops or case.dtype != "float64":
        return case
    magnitudes = [abs(v) for v in _flat(list(case.expected.values())) if math.isfinite(v)]
    rtol, atol = FLOAT32_COMPUTE_TOLERANCE
    return dataclasses.replace(case, atol=max(case.atol, atol + rtol * max(magnitudes, default=0.0)))


def _flat(value: object) -> list[float]:
    if isinstance(value, (list, tuple)):
        return [item for part in value for item in _flat(part)]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    return []  # "nan", "inf", None
