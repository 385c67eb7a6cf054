"""Helpers shared by the conformance tests: the session context, tolerances, comparisons, and
copy-pasteable reproductions of a failing call.

The suite judges an implementation only through its adapter's ops and attributes. Each check calls
an op of the adapter and the same op of :class:`conformance.variant.ReferenceVariant` (the reference
with the adapter's declared conventions applied) on the same inputs and compares the results.

Three declared conventions change how results are compared rather than what they must be:

- ``compute_dtype`` (precision): a test that calls an op declared computed in float32 compares its
  float64 results at :data:`FLOAT32_COMPUTE_TOLERANCE` instead of the float64 tolerance
  (:func:`tolerance`; hand cases: :func:`precision_case`); where such an op raises on float64
  inputs, it is called again on them cast to float32, the inputs its pipeline gives it.
- ``off_mask_outputs`` unspecified: the suite sees the adapter through :class:`ComparedAdapter`,
  which sets the op's per-token outputs to 0 off the mask, so they are compared on the action
  tokens only (gradients too).
- unreported statistics, one rule for the hand cases and the properties (:func:`checked_outputs`,
  :func:`statistic`): a statistic is *unreported* when the result lacks it or holds ``None``. A
  statistic declared not reported (``clipfrac: None``, ``approx_kl: None``) is never checked, even
  when the result has it; an optional one (:data:`OPTIONAL_STATISTICS`) is checked when reported and
  skipped when not; a required one (the rest: ``loss``, ``clipfrac``, ``approx_kl`` of
  ``policy_loss``, ``loss`` and ``clipfrac`` of ``gspo_loss`` and ``cispo_loss``) fails when
  unreported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import Phase, currently_in_test_context, note, reject, settings
from torch import Tensor

import ppo_ref
from ppo_ref.adapters import OP_NAMES, Adapter, ConventionSet
from ppo_ref.adapters.conventions import MASKED_OUTPUT_OPS, with_value_slot

from .cases import Case, decode_inputs
from .strategies import tensor_code
from .variant import ReferenceVariant

__all__ = [
    "FLOAT32_COMPUTE_TOLERANCE",
    "OPTIONAL_STATISTICS",
    "TOLERANCES",
    "ComparedAdapter",
    "Context",
    "as_tensor",
    "assert_close",
    "begin_test",
    "call_both",
    "call_impl",
    "checked_outputs",
    "compared_adapter",
    "computed_dtype",
    "configure_examples",
    "configure_precision",
    "examples",
    "grad_of",
    "note_repro",
    "precision_case",
    "refused_float64",
    "repro_code",
    "sign_lost",
    "statistic",
    "tolerance",
    "unsupported_call",
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


def begin_test() -> None:
    """Forget the ops called by the previous test (called before each test by the hooks)."""
    _CALLED.clear()
    _REFUSED_FLOAT64.clear()


def refused_float64() -> frozenset[str]:
    """The ops declared computed in float32 that raised on float64 inputs in the current test and
    returned when given them in float32 (:class:`ComparedAdapter`)."""
    return frozenset(_REFUSED_FLOAT64)


def _mark_called(op: str) -> None:
    _CALLED.add(op)


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


CONTRACT = "CONTRACT"
EDGE_CLAUSES: Mapping[str, str] = {
    "GAE-2": "holes",
    "EDGE-1": "holes",
    "RWD-3": "empty_rows",
    "PG-6": "empty_rows",
    "EDGE-2": "empty_rows",
    "EDGE-3": "inf_logits",
}
"""The edge clauses (spec section 21) and the edge input each is about (``EDGE_INPUTS``)."""
KINDS = ("contract", "value", "edge", "robustness")
"""Kinds of clause (spec introduction): ``value`` (the numbers, on the inputs the library's pipeline
produces as its adapter declares them), ``edge`` (the same numbers on edge inputs the adapter does not
declare: holes, rows and batches without action tokens, ``-inf`` logits), ``robustness`` (ROB-*:
garbage in masked-out slots, checked whatever the adapter declares), ``contract`` (the adapter's own
attributes)."""


def clause_kind(clause: str, edge_inputs: Iterable[str] = ()) -> str:
    """``contract`` for ``CONTRACT``, ``robustness`` for ``ROB-*``, ``edge`` for an edge clause whose
    edge input is not in ``edge_inputs`` (declared, it is a value clause), else ``value``.

    >>> clause_kind("GAE-2"), clause_kind("GAE-2", {"holes"}), clause_kind("ROB-2"), clause_kind("PG-1")
    ('edge', 'value', 'robustness', 'value')
    """
    if clause == CONTRACT:
        return "contract"
    if clause.startswith("ROB-"):
        return "robustness"
    edge = EDGE_CLAUSES.get(clause)
    return "edge" if edge is not None and edge not in set(edge_inputs) else "value"


def drawn_inputs(conventions: ConventionSet, ops: Iterable[str], clauses: Iterable[str]) -> dict[str, Any]:
    """The keyword arguments of :func:`.strategies.declared_inputs` for a test of ``clauses`` calling
    ``ops``: the declared ``masked_fill``; each edge input drawn where it is declared or where one of
    the test's clauses is about it (an edge clause); holes never for ops declared in ``prefix_masks``.

    >>> from ppo_ref.adapters import ConventionSet
    >>> drawn_inputs(ConventionSet(), ["gae"], ["GAE-2"])
    {'masked_fill': 'finite', 'holes': True, 'empty_rows': False, 'inf_logits': False}
    """
    ops, clauses = list(ops), list(clauses)
    wanted = set(conventions.edge_inputs) | {EDGE_CLAUSES[c] for c in clauses if c in EDGE_CLAUSES}
    prefix = bool(ops) and all(op in conventions.prefix_masks for op in ops)
    return {
        "masked_fill": conventions.masked_fill,
        "holes": "holes" in wanted and not prefix,
        "empty_rows": "empty_rows" in wanted,
        "inf_logits": "inf_logits" in wanted,
    }


def masked_out_inputs(case: Case) -> tuple[Tensor, dict[str, Tensor]] | None:
    """(bool mask, the float inputs of the mask's shape) of a case with a (B, T) mask, else None."""
    if case.raises is not None or not isinstance(case.inputs.get("mask"), list):
        return None
    inputs = decode_inputs(case)
    mask = inputs["mask"]
    if not isinstance(mask, Tensor) or mask.dim() != 2:
        return None
    per_token = {
        name: value
        for name, value in inputs.items()
        if name != "mask"
        and isinstance(value, Tensor)
        and value.is_floating_point()
        and tuple(value.shape) == tuple(mask.shape)
    }
    return mask != 0, per_token


def has_holes(case: Case) -> bool:
    """Whether the case's mask has a hole (a 0 before a row's last 1)."""
    found = masked_out_inputs(case)
    if found is None:
        return False
    keep = found[0]
    return bool((keep.flip(1).cummax(dim=1).values.flip(1) & ~keep).any())


def case_edge_inputs(case: Case) -> tuple[str, ...]:
    """The edge inputs in a case (``EDGE_INPUTS`` order): ``holes`` (a 0 before a row's last 1),
    ``empty_rows`` (a row without an action token, or a batch with no row or no position),
    ``inf_logits`` (a ``-inf`` logit)."""
    if case.raises is not None:
        return ()
    found: list[str] = []
    if has_holes(case):
        found.append("holes")
    inputs = decode_inputs(case)
    mask = inputs.get("mask")
    if isinstance(mask, Tensor) and mask.dim() == 2 and (mask.numel() == 0 or bool((mask.sum(1) == 0).any())):
        found.append("empty_rows")
    logits = inputs.get("logits")
    if isinstance(logits, Tensor) and logits.is_floating_point() and bool((logits == -math.inf).any()):
        found.append("inf_logits")
    return tuple(found)


def edge_clause(case: Case, declared: frozenset[str]) -> str | None:
    """The edge clause a case is checked under when it has an edge input the adapter does not declare
    (EDGE-1 holes, EDGE-2 rows without action tokens, EDGE-3 ``-inf`` logits); None when it has none,
    or when its own clause is already the edge clause of that input (GAE-2, RWD-3, PG-6)."""
    missing = [edge for edge in case_edge_inputs(case) if edge not in declared]
    if not missing or EDGE_CLAUSES.get(case.clause) in missing:
        return None
    return next(c for c, edge in EDGE_CLAUSES.items() if edge == missing[0] and c.startswith("EDGE-"))


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
        _mark_called(name)
        function: Callable[..., Any] = getattr(self.adapter, name)
        return function


_REFERENCE_SIGNATURES: dict[str, inspect.Signature] = {}


def _bound(op: str, args: tuple[object, ...], kwargs: Mapping[str, object]) -> dict[str, object]:
    """The arguments of a call of ``op`` by the reference's parameter names (defaults filled)."""
    if op not in _REFERENCE_SIGNATURES:
        _REFERENCE_SIGNATURES[op] = inspect.signature(getattr(ppo_ref, op))
    bound = _REFERENCE_SIGNATURES[op].bind_partial(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _has_float64(value: object) -> bool:
    if isinstance(value, Tensor):
        return value.dtype == torch.float64
    if isinstance(value, (tuple, list)):
        return any(_has_float64(item) for item in value)
    return False


def _as_float32(value: object) -> object:
    """``value`` with its float64 tensors cast to float32 (differentiably: gradients reach the
    float64 leaves), through tuples and lists."""
    if isinstance(value, Tensor):
        return value.to(torch.float32) if value.dtype == torch.float64 else value
    if isinstance(value, (tuple, list)):
        return type(value)(_as_float32(item) for item in value)
    return value


def _float32_when_float64_refused(op: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (an op declared computed in float32) called again with its float64 tensors cast
    to float32 when it raises on them: a library whose pipeline gives the op float32 may refuse
    float64 (ms-swift's ``compute_advantages_dynamic`` allocates its group means in float32 and
    index-puts the scores into them). A call without float64 tensors, or one that raises again, raises
    the first exception."""

    def called(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as refused:
            if not _has_float64(args) and not _has_float64(list(kwargs.values())):
                raise
            cast_args, cast_kwargs = _as_float32(args), {k: _as_float32(v) for k, v in kwargs.items()}
            try:
                result = function(*cast_args, **cast_kwargs)  # type: ignore[misc]
            except Exception:
                raise refused from None
            _REFUSED_FLOAT64.add(op)
            return result

    called.__name__ = op
    called.__doc__ = f"{op}, given float32 inputs where it refuses float64 ones"
    return called


def _on_mask(value: object, keep: Tensor) -> object:
    if isinstance(value, Tensor) and value.shape == keep.shape:
        return torch.where(keep, value, torch.zeros((), dtype=value.dtype))
    if isinstance(value, tuple):
        return tuple(_on_mask(item, keep) for item in value)
    return value


class ComparedAdapter:
    """The adapter as the suite compares it: every attribute is the adapter's, except that an op the
    adapter declares computed in float32 (``compute_dtype``) marks the current test for the float32
    tolerance when it is looked up and is given float32 inputs where it raises on float64 ones
    (:func:`refused_float64`), and an op whose off-mask outputs are declared unspecified
    (``off_mask_outputs``) returns its per-token outputs set to 0 off the mask (0 is what the
    reference returns there), so they are compared on the action tokens only. Where ``token_rewards``
    puts the score after the last action token (``score_placement``), and where GAE trains the
    value after it (``value_after_last_action_token``), that slot counts as on the mask."""

    def __init__(self, adapter: Adapter, conventions: ConventionSet) -> None:
        self._adapter = adapter
        self._conventions = conventions
        for attribute in ("name", "version", "provenance", "ops", "conventions"):  # for isinstance
            if hasattr(adapter, attribute):
                setattr(self, attribute, getattr(adapter, attribute))

    def __repr__(self) -> str:
        return f"ComparedAdapter({self._adapter!r})"

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._adapter, name)
        if name not in OP_NAMES or not callable(value):
            return value
        if name in self._conventions.float32_ops:
            _mark_called(name)
            value = _float32_when_float64_refused(name, value)
        if name not in self._conventions.off_mask_outputs:
            return value
        return self._compared(name, value)

    def _compared(self, op: str, function: Callable[..., Any]) -> Callable[..., Any]:
        conventions = self._conventions

        def compared(*args: Any, **kwargs: Any) -> Any:
            result = function(*args, **kwargs)
            mask = _bound(op, args, kwargs).get("mask")
            if not isinstance(mask, Tensor):
                return result  # kl_penalty without a mask: every position is an output
            keep = mask if mask.dtype == torch.bool else mask != 0
            slot = (op == "token_rewards" and conventions.score_placement == "after-last-action-token") or (
                op == "gae" and getattr(conventions, "value_after_last_action_token", "") == "trained"
            )
            return _on_mask(result, with_value_slot(keep) if slot else keep)

        compared.__name__ = op
        compared.__doc__ = f"{op} of {self._adapter!r}, compared on the action tokens only"
        return compared


def compared_adapter(adapter: Adapter, conventions: ConventionSet) -> Adapter:
    """The adapter itself when no declared convention changes how it is compared, else
    :class:`ComparedAdapter` around it."""
    if not conventions.float32_ops and not (conventions.off_mask_outputs & set(MASKED_OUTPUT_OPS)):
        return adapter
    wrapped: Adapter = ComparedAdapter(adapter, conventions)
    return wrapped


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
