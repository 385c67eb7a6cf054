"""Helpers shared by the conformance tests: the session context, tolerances, comparisons, and
copy-pasteable reproductions of a failing call.

The suite judges an implementation only through its adapter's ops and attributes. Each check calls
an op of the adapter and the same op of :class:`ppo_ref.adapters.ReferenceVariant` (the reference
with the adapter's declared conventions applied) on the same inputs and compares the results.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import Phase, note, settings
from torch import Tensor

from ppo_ref.adapters import Adapter, ConventionSet, ReferenceVariant

from .strategies import tensor_code

__all__ = [
    "TOLERANCES",
    "Context",
    "as_tensor",
    "assert_close",
    "call_both",
    "call_impl",
    "configure_examples",
    "examples",
    "grad_of",
    "note_repro",
    "repro_code",
    "statistic",
    "tolerance",
    "whitening_scale",
]

TOLERANCES: Mapping[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
}
"""(rtol, atol) per dtype of the inputs: float32 1e-5, float64 1e-7 (a pass needs
``|actual - expected| <= atol + rtol * |expected|``). Half-precision logits are compared with the
float32 tolerance against the float32 reference computed from the same half-precision values."""


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for results computed from inputs of ``dtype`` (float32 for half precision)."""
    return TOLERANCES.get(dtype, TOLERANCES[torch.float32])


@dataclass(frozen=True)
class Context:
    """Everything a check needs: the adapter, how it was named, and the variant of the reference."""

    adapter: Adapter
    impl: str
    conventions: ConventionSet
    variant: ReferenceVariant

    def __repr__(self) -> str:
        return f"Context(impl={self.impl!r})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))

    def provides(self, op: str) -> bool:
        return op in self.adapter.ops

    def op(self, name: str) -> Callable[..., Any]:
        """The adapter's op ``name`` (the test is skipped as not provided if it is not listed)."""
        if name not in self.adapter.ops:
            pytest.skip(f"not provided: op {name!r} is not in the adapter's ops")
        function: Callable[..., Any] = getattr(self.adapter, name)
        return function


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


def statistic(result: object, name: str, what: str) -> object:
    """Attribute ``name`` of an op's result object, failing clearly when it is missing."""
    if not hasattr(result, name):
        raise AssertionError(f"{what}: the result {type(result).__name__} has no attribute {name!r}")
    return getattr(result, name)


def grad_of(output: object, wrt: Tensor, what: str) -> Tensor:
    """d output / d wrt (zeros where the graph does not reach); fails if output has no graph."""
    value = as_tensor(output, what)
    if not value.requires_grad:
        raise AssertionError(f"{what}: the result is not differentiable in the input (no autograd graph)")
    (grad,) = torch.autograd.grad(value, wrt, allow_unused=True)
    return torch.zeros_like(wrt) if grad is None else grad


def _code(value: object) -> str:
    if isinstance(value, Tensor):
        return tensor_code(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    return repr(value)


def repro_code(impl: str, op: str, args: tuple[object, ...], kwargs: Mapping[str, object]) -> str:
    """Python code that calls ``op`` of the adapter and of the reference variant on these inputs."""
    lines = [
        "# --- reproduction (paste into python in the repository root) ---",
        "import torch",
        "from ppo_ref.adapters import ReferenceVariant, get_adapter, parse_conventions",
        f"impl = get_adapter({impl!r})",
        "reference = ReferenceVariant(parse_conventions(impl.conventions))",
    ]
    call = "**kwargs"
    if args:
        lines.append(f"args = ({', '.join(_code(a) for a in args)},)")
        call = "*args, **kwargs"
    lines.append(f"kwargs = {{{', '.join(f'{k!r}: {_code(v)}' for k, v in kwargs.items())}}}")
    lines.append(f"print('implementation:', impl.{op}({call}))")
    lines.append(f"print('reference:     ', reference.{op}({call}))")
    return "\n".join(lines)


class _Reproduction:
    """The reproduction code, built only if Hypothesis prints it (the failing example)."""

    def __init__(self, impl: str, op: str, args: tuple[object, ...], kwargs: Mapping[str, object]) -> None:
        self.impl, self.op, self.args, self.kwargs = impl, op, args, dict(kwargs)

    def __repr__(self) -> str:
        return repro_code(self.impl, self.op, self.args, self.kwargs)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


def note_repro(ctx: Context, op: str, *args: object, **kwargs: object) -> None:
    """Attach the reproduction of this call to the current Hypothesis example (printed on failure)."""
    note(_Reproduction(ctx.impl, op, args, kwargs))


_EXAMPLES: list[int] = []
_SHRINK: list[bool] = []


def configure_examples(count: int | None, shrink: bool = False) -> None:
    """Set the number of Hypothesis examples per conformance property (None: from the profile),
    and whether a failing example is shrunk (``--conformance-shrink``; off by default)."""
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ValueError(f"count: expected an int >= 1 or None, got {count!r}")
    if not isinstance(shrink, bool):
        raise ValueError(f"shrink: expected a bool, got {type(shrink).__name__}")
    _EXAMPLES.clear()
    _SHRINK.clear()
    if count is not None:
        _EXAMPLES.append(count)
    _SHRINK.append(shrink)


def examples() -> settings:
    """Settings for one conformance property: ``--conformance-examples`` if given, else a third of
    the loaded profile's ``max_examples`` (20 under ``default``, 333 under ``thorough``), at least 5.

    A failing example is reported as found, without Hypothesis' shrink and explain phases, which
    made a failing run 10-25x slower than a passing one; ``--conformance-shrink`` turns them back
    on (smaller examples, slower failures). The ``@reproduce_failure`` blob is not printed: the
    suite's own reproduction reruns the failing call. Applied when a test module is imported,
    which happens after the profile is loaded.
    """
    count = _EXAMPLES[0] if _EXAMPLES else max(5, settings().max_examples // 3)
    if _SHRINK and _SHRINK[0]:
        return settings(max_examples=count)
    phases = [phase for phase in settings().phases if phase not in (Phase.shrink, Phase.explain)]
    return settings(max_examples=count, phases=phases, print_blob=False)


def _fresh(value: object) -> object:
    return value.detach().clone() if isinstance(value, Tensor) else value


def call_both(ctx: Context, op: str, **kwargs: object) -> tuple[Any, Any]:
    """(implementation, reference variant) results of ``op`` on fresh copies of the same inputs.

    Notes the reproduction for Hypothesis, so a failing example prints code that reruns the call.
    """
    note_repro(ctx, op, **kwargs)
    actual = ctx.op(op)(**{k: _fresh(v) for k, v in kwargs.items()})
    expected = getattr(ctx.variant, op)(**{k: _fresh(v) for k, v in kwargs.items()})
    return actual, expected


def call_impl(ctx: Context, op: str, **kwargs: object) -> Any:
    """The implementation's result of ``op`` on fresh copies of the inputs (reproduction noted)."""
    note_repro(ctx, op, **kwargs)
    return ctx.op(op)(**{k: _fresh(v) for k, v in kwargs.items()})


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
