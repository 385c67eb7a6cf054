"""What a conformance test calls: the session's :class:`Context`, an op of the implementation and
of the reference variant called on the same inputs (:func:`call_both`, with a copy-pasteable
reproduction of the call noted for Hypothesis), the rule for unreported statistics, and the
Hypothesis settings of each property (:func:`examples`).

The suite judges an implementation only through its adapter's ops and attributes. Each check calls
an op of the adapter and the same op of :class:`conformance.variant.ReferenceVariant` (the reference
with the adapter's declared conventions applied) on the same inputs and compares the results.

Three declared conventions change how results are compared rather than what they must be:

- ``compute_dtype`` (precision): float64 results of an op declared computed in float32 are compared
  at :data:`FLOAT32_COMPUTE_TOLERANCE` (:mod:`.precision`; hand cases: :func:`precision_case`).
- ``off_mask_outputs`` unspecified: the suite sees the adapter through :class:`ComparedAdapter`
  (:mod:`.compared`), so the op's per-token outputs are compared on the action tokens only.
- unreported statistics, one rule for the hand cases and the properties (:func:`checked_outputs`,
  :func:`statistic`): a statistic is *unreported* when the result lacks it or holds ``None``. A
  statistic declared not reported (``clipfrac: None``, ``approx_kl: None``) is never checked, even
  when the result has it; an optional one (:data:`OPTIONAL_STATISTICS`) is checked when reported and
  skipped when not; a required one (the rest: ``loss``, ``clipfrac``, ``approx_kl`` of
  ``policy_loss``, ``loss`` and ``clipfrac`` of ``gspo_loss`` and ``cispo_loss``) fails when
  unreported.

The tolerances and comparisons (:mod:`.precision`), the clause kinds and edge inputs
(:mod:`.kinds`) and :class:`ComparedAdapter` (:mod:`.compared`) are re-exported here, so a test
module imports what it needs from one place.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import Phase, currently_in_test_context, note, reject, settings
from torch import Tensor

from ppo_ref.adapters import Adapter, ConventionSet

from .compared import ComparedAdapter, compared_adapter
from .kinds import (
    CONTRACT,
    EDGE_CLAUSES,
    KINDS,
    case_edge_inputs,
    clause_kind,
    drawn_inputs,
    edge_clause,
    has_holes,
    masked_out_inputs,
)
from .precision import (
    FLOAT32_COMPUTE_TOLERANCE,
    TOLERANCES,
    as_tensor,
    assert_close,
    begin_test,
    computed_dtype,
    configure_precision,
    mark_called,
    precision_case,
    refused_float64,
    sign_lost,
    tolerance,
    whitened_variance,
    whitening_scale,
)
from .strategies import tensor_code
from .variant import ReferenceVariant

__all__ = [
    "CONTRACT",
    "EDGE_CLAUSES",
    "FLOAT32_COMPUTE_TOLERANCE",
    "KINDS",
    "OPTIONAL_STATISTICS",
    "TOLERANCES",
    "ComparedAdapter",
    "Context",
    "as_tensor",
    "assert_close",
    "begin_test",
    "call_both",
    "call_impl",
    "case_edge_inputs",
    "checked_outputs",
    "clause_kind",
    "compared_adapter",
    "computed_dtype",
    "configure_examples",
    "configure_precision",
    "drawn_inputs",
    "edge_clause",
    "examples",
    "grad_of",
    "has_holes",
    "inference_rerun",
    "masked_out_inputs",
    "note_repro",
    "precision_case",
    "refused_float64",
    "repro_code",
    "rerunning",
    "sign_lost",
    "statistic",
    "tolerance",
    "unsupported_call",
    "whitened_variance",
    "whitening_scale",
]


_RERUN: list[bool] = [False]


@contextlib.contextmanager
def inference_rerun() -> Iterator[None]:
    """Within the block a test runs as the convention inference re-runs it (:func:`rerunning`)."""
    saved = _RERUN[0]
    _RERUN[0] = True
    try:
        yield
    finally:
        _RERUN[0] = saved


def rerunning() -> bool:
    """Whether the current test is a re-run of the convention inference under an alternative: the
    edge properties then fail where the op differs from the alternative without the edge input too
    (an alternative must explain both), instead of leaving that difference to a value clause."""
    return _RERUN[0]


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
        mark_called(name)
        function: Callable[..., Any] = getattr(self.adapter, name)
        return function


OPTIONAL_STATISTICS: Mapping[str, frozenset[str]] = {
    "policy_loss": frozenset({"ratio_outside_frac", "ratio_mean", "ratio_max", "dual_clip_frac"}),
    "ppo_penalty_loss": frozenset({"kl"}),
    "gspo_loss": frozenset({"approx_kl", "ratio_mean", "ratio_max"}),
    "cispo_loss": frozenset({"approx_kl", "ratio_mean", "ratio_max"}),
}
"""Per op, the statistics of the reference's result that the contract does not require: checked
when the adapter's result reports them, skipped when it does not."""


def _declared_unreported(conventions: ConventionSet, op: str) -> frozenset[str]:
    if op != "policy_loss":
        return frozenset()
    return frozenset(name for name in ("clipfrac", "approx_kl") if getattr(conventions, name) is None)


def _reported(result: object, name: str) -> bool:
    if isinstance(result, Mapping):
        return result.get(name) is not None
    return getattr(result, name, None) is not None


def checked_outputs(ctx: Context, op: str, result: object, names: Iterable[str]) -> list[str]:
    """Which of the outputs ``names`` of an ``op`` result are compared, by the rule for unreported
    statistics (module docstring): declared not reported, never; optional, when reported; the
    others always (an unreported one then fails). The hand cases and the properties both use it.

    A result that is a tensor or a tuple (one output, or GAE's pair) reports every output."""
    if isinstance(result, (Tensor, tuple, list, float, int)):
        return list(names)
    never = _declared_unreported(ctx.conventions, op)
    optional = OPTIONAL_STATISTICS.get(op, frozenset())
    return [name for name in names if name not in never and (name not in optional or _reported(result, name))]


def statistic(result: object, name: str, what: str) -> object:
    """Attribute ``name`` of an op's result object, failing clearly when it is unreported (missing
    or ``None``): a test asks for a statistic only where the rule for unreported statistics
    (module docstring) requires it."""
    if getattr(result, name, None) is None:
        found = "has no attribute" if not hasattr(result, name) else "holds None for"
        raise AssertionError(
            f"{what}: the result {type(result).__name__} {found} {name!r}, which the contract requires; "
            f"an implementation that does not compute it declares the convention {name}: None"
            if name in ("clipfrac", "approx_kl")
            else f"{what}: the result {type(result).__name__} {found} {name!r}, which the contract requires"
        )
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
        "from ppo_ref.adapters import get_adapter, parse_conventions",
        f"from {__package__}.variant import ReferenceVariant",
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
    on (smaller examples, slower failures). The first failing example ends the property
    (``report_multiple_bugs=False``), so its failure is reported whole, not as one of several
    sub-exceptions. The ``@reproduce_failure`` blob is not printed: the suite's own reproduction
    reruns the failing call. Applied when a test module is imported,
    which happens after the profile is loaded.
    """
    count = _EXAMPLES[0] if _EXAMPLES else max(5, settings().max_examples // 3)
    if _SHRINK and _SHRINK[0]:
        return settings(max_examples=count)
    phases = [phase for phase in settings().phases if phase not in (Phase.shrink, Phase.explain)]
    return settings(max_examples=count, phases=phases, print_blob=False, report_multiple_bugs=False)


def _fresh(value: object) -> object:
    return value.detach().clone() if isinstance(value, Tensor) else value


def unsupported_call(ctx: Context, op: str, kwargs: Mapping[str, object]) -> str | None:
    """Why the adapter's declared capabilities exclude this call of ``op`` (None if they do not):
    for now ``masked_whiten(shift_mean=False)`` when ``whiten_modes`` lacks ``keep-mean`` (or
    ``shift_mean=True`` without ``shift-mean``)."""
    if op == "masked_whiten":
        mode = "shift-mean" if kwargs.get("shift_mean", True) else "keep-mean"
        if mode not in ctx.conventions.whiten_modes:
            return f"masked_whiten with {mode} (declared whiten_modes excludes it)"
    return None


def _skip_unsupported(ctx: Context, op: str, kwargs: Mapping[str, object]) -> None:
    """Leave out a call the adapter declares it cannot make: the example is rejected inside a
    Hypothesis property (the others still run), the test skipped as not provided otherwise."""
    reason = unsupported_call(ctx, op, kwargs)
    if reason is None:
        return
    if currently_in_test_context():
        reject()
    pytest.skip(f"not provided: {reason}")


def batch_kwargs(
    batch: object, names: Iterable[str], optional: Iterable[str] = (), **overrides: object
) -> dict[str, Any]:
    """An op's keyword arguments from the drawn ``batch``'s fields of the same names: each of
    ``names``, then each of ``optional`` whose field is not None, then ``overrides`` (which win)."""
    kwargs: dict[str, Any] = {name: getattr(batch, name) for name in names}
    kwargs.update((name, getattr(batch, name)) for name in optional if getattr(batch, name) is not None)
    return {**kwargs, **overrides}


def call_both(ctx: Context, op: str, **kwargs: object) -> tuple[Any, Any]:
    """(implementation, reference variant) results of ``op`` on fresh copies of the same inputs.

    Notes the reproduction for Hypothesis, so a failing example prints code that reruns the call.
    A call the adapter declares it cannot make is left out (:func:`unsupported_call`).
    """
    _skip_unsupported(ctx, op, kwargs)
    note_repro(ctx, op, **kwargs)
    actual = ctx.op(op)(**{k: _fresh(v) for k, v in kwargs.items()})
    expected = getattr(ctx.variant, op)(**{k: _fresh(v) for k, v in kwargs.items()})
    return actual, expected


def call_impl(ctx: Context, op: str, **kwargs: object) -> Any:
    """The implementation's result of ``op`` on fresh copies of the inputs (reproduction noted)."""
    _skip_unsupported(ctx, op, kwargs)
    note_repro(ctx, op, **kwargs)
    return ctx.op(op)(**{k: _fresh(v) for k, v in kwargs.items()})
