"""Hypothesis strategies for ppo-ref: the one helper module that draws PPO inputs.

Used by ppo-ref's own property tests (``tests/``) and by the conformance suite (``conformance/``).
Everything is drawn on the CPU and depends only on torch and Hypothesis, so the module also works in
the separate environments of third-party libraries.

Conventions (spec ``SPEC.md``): B rows, T response positions, L full sequence length, V vocabulary;
a ``mask`` is (B, T), bool or 0/1, 1 marking an action token. Masks drawn here have right padding,
holes (tool or observation tokens inside a response), single-token rows and rows of unequal length,
and optionally empty rows.

Composite strategies return small frozen dataclass *bundles* (:class:`PolicyBatch`,
:class:`GAEBatch`, ...). Their ``repr`` is Python code that rebuilds them exactly (tensor values as
``torch.tensor(..., dtype=...)``), so a Hypothesis failure can be pasted into a shell after
``import torch`` and ``from conformance.strategies import *``.

Helpers for invariance tests: :func:`fill_masked` (write arbitrary values, NaN and inf included,
into the masked-out slots), :func:`append_padding` (add trailing columns) and :func:`insert_holes`
(insert columns inside the rows).

Input conventions (issues 11 and 20): :func:`declared_inputs` sets, for the draws inside it, what
the masked-out slots hold (``masked_fill``: ``"any"``, the default outside the suite, draws NaN,
+-inf and arbitrary floats there half of the time; ``"finite"`` leaves finite values of the same
kind as the action tokens'; ``"zero"`` or a number fills them) and which *edge inputs* are drawn:
masks with holes (``holes``), rows without an action token and batches without any
(``empty_rows``), ``-inf`` logits (``inf_logits``). Outside a ``declared_inputs`` block every edge
input is drawn (ppo-ref's own property tests). The conformance suite enters it around every test
with the adapter's declared ``masked_fill`` and ``edge_inputs`` (value clauses: what the library's
own pipeline produces) or with the edge input forced on (the edge clauses); ``junk=True`` (the
robustness clauses) writes junk whatever is declared.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from torch import Tensor

from ppo_ref.aggregation import COUNT_AGGREGATIONS, LOSS_AGGREGATIONS
from ppo_ref.correction import CORRECTION_LEVELS, CORRECTION_MODES
from ppo_ref.group import GROUP_METHODS, STD_SCOPES
from ppo_ref.kl import KL_ESTIMATORS
from ppo_ref.kl_loss import KL_LOSS_ESTIMATORS

__all__ = [
    "CORRECTION_LEVELS",
    "CORRECTION_MODES",
    "COUNT_AGGREGATIONS",
    "FLOAT_DTYPES",
    "GROUP_ID_POOL",
    "GROUP_METHODS",
    "HALF_DTYPES",
    "JUNK_VALUES",
    "KL_ESTIMATORS",
    "KL_LOSS_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "MASK_DTYPES",
    "STD_SCOPES",
    "AggregationBatch",
    "CISPOBatch",
    "ClipBatch",
    "CorrectionBatch",
    "EVBatch",
    "GAEBatch",
    "GSPOBatch",
    "GroupBatch",
    "KLBatch",
    "KLControllerCase",
    "KLLossBatch",
    "LogitsBatch",
    "MaskedBatch",
    "PenaltyBatch",
    "PolicyBatch",
    "RewardBatch",
    "ValueBatch",
    "aggregation_batches",
    "append_padding",
    "batch_shapes",
    "cispo_batches",
    "clip_batches",
    "clip_eps",
    "clip_eps_highs",
    "correction_batches",
    "declared_inputs",
    "dual_clips",
    "ev_batches",
    "fill_masked",
    "float_dtypes",
    "float_tensors",
    "gae_batches",
    "gammas",
    "group_batches",
    "gspo_batches",
    "hole_positions",
    "insert_holes",
    "junk_floats",
    "junk_tensors",
    "kl_batches",
    "kl_coefs",
    "kl_controller_cases",
    "kl_estimators",
    "kl_loss_batches",
    "lams",
    "logits_batches",
    "loss_aggregations",
    "masked_batches",
    "masked_fills",
    "masks",
    "micro_batches",
    "norm_constants",
    "penalty_batches",
    "policy_batches",
    "register_profiles",
    "reward_batches",
    "temperatures",
    "tensor_code",
    "token_ids",
    "value_batches",
    "value_clips",
    "whole_batch_counts",
]

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64)
"""Dtypes the reference functions are checked in."""
HALF_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
"""Half-precision logits dtypes (LOGP-3: computed in float32)."""
MASK_DTYPES: tuple[torch.dtype, ...] = (torch.bool, torch.int64, torch.float32)
"""A mask may be bool or 0/1 of any numeric dtype."""
JUNK_VALUES: tuple[float, ...] = (math.nan, math.inf, -math.inf, 1e6, -1e6)
"""Values written into masked-out slots: they must never reach a result or a gradient."""

MAX_ROWS = 6
MAX_STEPS = 12
LOGP_MIN = -12.0
"""Realistic log-probabilities of sampled tokens lie in [LOGP_MIN, 0]."""
LOG_RATIO_MAX = 3.0
"""Log-ratios between two policies are drawn in [-LOG_RATIO_MAX, LOG_RATIO_MAX]."""


# --------------------------------------------------------------------------------------------------
# Input conventions: what the masked-out slots hold, whether masks have holes (issue 11)

_INPUTS: dict[str, Any] = {"masked_fill": "any", "holes": True, "empty_rows": True, "inf_logits": True}


@contextlib.contextmanager
def declared_inputs(
    masked_fill: str | float = "any", holes: bool = True, empty_rows: bool = True, inf_logits: bool = True
) -> Iterator[None]:
    """Within the block, draws obey an implementation's declared input conventions.

    ``masked_fill``: ``"any"`` (default: junk, NaN and +-inf included, in the masked-out slots of
    half the bundles), ``"finite"`` (the drawn finite values stay there), ``"zero"`` or a finite
    number (the slots hold it). ``holes`` False draws masks without holes (a prefix of action tokens
    per row). ``empty_rows`` False draws at least one action token in every row of every mask, even
    where a strategy is asked for empty rows. ``inf_logits`` False draws finite logits only (no
    banned tokens). ``junk=True`` in a bundle strategy still writes junk (robustness checks).

    >>> with declared_inputs("zero"):
    ...     batch = policy_batches(junk=False).example()
    >>> bool((batch.logp[batch.mask == 0] == 0).all())
    True
    """
    if isinstance(masked_fill, str):
        if masked_fill not in ("any", "finite", "zero"):
            raise ValueError(
                f"masked_fill: expected 'any', 'finite', 'zero' or a number, got {masked_fill!r}"
            )
    elif (
        isinstance(masked_fill, bool)
        or not isinstance(masked_fill, (int, float))
        or not math.isfinite(masked_fill)
    ):
        raise ValueError(
            f"masked_fill: expected 'any', 'finite', 'zero' or a finite number, got {masked_fill!r}"
        )
    for name, flag in (("holes", holes), ("empty_rows", empty_rows), ("inf_logits", inf_logits)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name}: expected a bool, got {type(flag).__name__}")
    saved = dict(_INPUTS)
    _INPUTS.update(masked_fill=masked_fill, holes=holes, empty_rows=empty_rows, inf_logits=inf_logits)
    try:
        yield
    finally:
        _INPUTS.clear()
        _INPUTS.update(saved)


# --------------------------------------------------------------------------------------------------
# Hypothesis profiles


def register_profiles() -> str:
    """Register the ``default`` and ``thorough`` Hypothesis profiles and load one; return its name.

    ``default``: derandomized (the same examples on every run and machine), no example database,
    no deadline, 60 examples. ``thorough``: 1000 random examples per test. The profile is chosen by
    the environment variable ``HYPOTHESIS_PROFILE`` (default ``default``).
    """
    settings.register_profile(
        "default",
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=True,
        max_examples=60,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile(
        "thorough",
        derandomize=False,
        deadline=None,
        print_blob=True,
        max_examples=1000,
        suppress_health_check=[HealthCheck.too_slow],
    )
    name = os.environ.get("HYPOTHESIS_PROFILE", "default")
    settings.load_profile(name)
    return name


# --------------------------------------------------------------------------------------------------
# Copy-pasteable reprs


def _number_code(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "-float('inf')"
    return repr(value)


def _nested_code(values: object) -> str:
    if isinstance(values, list):
        return "[" + ", ".join(_nested_code(v) for v in values) + "]"
    return _number_code(values)


def tensor_code(tensor: Tensor) -> str:
    """Python code that rebuilds ``tensor`` exactly: ``torch.tensor([...], dtype=torch.float32)``."""
    values = tensor.detach().cpu().tolist()
    return f"torch.tensor({_nested_code(values)}, dtype={tensor.dtype})"


def _value_code(value: object) -> str:
    if isinstance(value, Tensor):
        return tensor_code(value)
    if isinstance(value, tuple):
        inner = ", ".join(_value_code(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return _number_code(value)


class _Bundle:
    """Base of the dataclass bundles: a ``repr`` that is code rebuilding the bundle."""

    def __repr__(self) -> str:
        parts = [f"{f.name}={_value_code(getattr(self, f.name))}" for f in fields(self)]  # type: ignore[arg-type]
        return f"{type(self).__name__}({', '.join(parts)})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Make Hypothesis' pretty printer (falsifying examples) use the code repr too."""
        printer.text(repr(self))


@dataclass(frozen=True, repr=False)
class PolicyBatch(_Bundle):
    """Arguments of ``policy_loss`` (and of ``aggregate_loss`` via the objective)."""

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    clip_eps: float
    loss_agg: str


@dataclass(frozen=True, repr=False)
class PenaltyBatch(_Bundle):
    """Arguments of ``ppo_penalty_loss``."""

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    beta: float


@dataclass(frozen=True, repr=False)
class ValueBatch(_Bundle):
    """Arguments of ``value_loss``; ``clip_eps`` None means unclipped (VF-2)."""

    values: Tensor
    old_values: Tensor
    returns: Tensor
    mask: Tensor
    clip_eps: float | None


@dataclass(frozen=True, repr=False)
class GAEBatch(_Bundle):
    """Arguments of ``gae``; ``last_values`` None means terminal after the last action token."""

    rewards: Tensor
    values: Tensor
    mask: Tensor
    gamma: float
    lam: float
    last_values: Tensor | None


@dataclass(frozen=True, repr=False)
class RewardBatch(_Bundle):
    """Arguments of ``token_rewards``."""

    scores: Tensor
    logp: Tensor
    ref_logp: Tensor
    mask: Tensor
    kl_coef: float
    estimator: str


@dataclass(frozen=True, repr=False)
class KLBatch(_Bundle):
    """Arguments of ``kl_penalty``; ``mask`` may be None (every entry is then finite)."""

    logp: Tensor
    ref_logp: Tensor
    mask: Tensor | None
    estimator: str


@dataclass(frozen=True, repr=False)
class MaskedBatch(_Bundle):
    """Arguments of ``masked_mean`` / ``masked_var`` / ``masked_whiten``: ``x`` and a same-shape mask."""

    x: Tensor
    mask: Tensor


@dataclass(frozen=True, repr=False)
class EVBatch(_Bundle):
    """Arguments of ``explained_variance``."""

    values: Tensor
    returns: Tensor
    mask: Tensor


@dataclass(frozen=True, repr=False)
class LogitsBatch(_Bundle):
    """Arguments of ``token_logprobs`` (``logits`` is also a valid (B, T, V) input of ``entropy``)."""

    logits: Tensor
    input_ids: Tensor
    temperature: float


@dataclass(frozen=True, repr=False)
class KLControllerCase(_Bundle):
    """An ``AdaptiveKLController(init_kl_coef, target, horizon)`` and the ``(kl, n_steps)`` updates."""

    init_kl_coef: float
    target: float
    horizon: float
    updates: tuple[tuple[float, int], ...]


# --------------------------------------------------------------------------------------------------
# Scalars (each factory is cached: building and validating a strategy costs more than drawing from it)


@functools.cache
def _sampled(choices: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    return st.sampled_from(choices)


def float_dtypes(dtypes: Sequence[torch.dtype] = FLOAT_DTYPES) -> st.SearchStrategy[torch.dtype]:
    """A floating-point dtype, float32 or float64 by default."""
    return _sampled(tuple(dtypes))


@functools.cache
def _unit_interval() -> st.SearchStrategy[float]:
    return st.one_of(st.just(0.0), st.just(1.0), st.floats(0.0, 1.0))


def gammas() -> st.SearchStrategy[float]:
    """Discount gamma in [0, 1], the endpoints included."""
    return _unit_interval()


def lams() -> st.SearchStrategy[float]:
    """GAE lambda in [0, 1], drawn independently of gamma."""
    return _unit_interval()


@functools.cache
def clip_eps() -> st.SearchStrategy[float]:
    """PPO clip range epsilon in [0.05, 0.5]."""
    return st.one_of(st.just(0.2), st.floats(0.05, 0.5))


@functools.cache
def temperatures() -> st.SearchStrategy[float]:
    """Sampling temperature in [0.3, 3]."""
    return st.one_of(st.just(1.0), st.floats(0.3, 3.0))


@functools.cache
def kl_coefs() -> st.SearchStrategy[float]:
    """KL coefficient beta in [0, 1]."""
    return st.one_of(st.just(0.0), st.floats(0.0, 1.0))


@functools.cache
def _penalty_betas() -> st.SearchStrategy[float]:
    return st.one_of(st.just(0.0), st.floats(0.0, 10.0))


@functools.cache
def value_clips() -> st.SearchStrategy[float | None]:
    """Value-loss clip range: None (unclipped) or a positive float in reward units."""
    return st.one_of(st.none(), st.floats(0.05, 0.5), st.floats(0.5, 10.0))


@functools.cache
def kl_estimators() -> st.SearchStrategy[str]:
    """``k1``, ``k2`` or ``k3``."""
    return st.sampled_from(KL_ESTIMATORS)


def loss_aggregations(choices: Sequence[str] = COUNT_AGGREGATIONS) -> st.SearchStrategy[str]:
    """One of the loss aggregation modes (all three by default)."""
    return _sampled(tuple(choices))


@functools.cache
def junk_floats() -> st.SearchStrategy[float]:
    """Arbitrary values for masked-out slots: NaN, +-inf, 1e6 and any other float."""
    return st.one_of(st.sampled_from(JUNK_VALUES), st.floats(allow_nan=True, allow_infinity=True))


# --------------------------------------------------------------------------------------------------
# Tensors and masks. Hypothesis costs tens of microseconds per draw, so a tensor is not drawn entry
# by entry: its bulk comes from random.Random(seed) (stable across Python and torch versions), and
# Hypothesis draws the style, the seed and a few pinned entries. The bundles' reprs print every
# value, so a failure reproduces exactly even though shrinking a seed does not simplify it.

_SEEDS = st.integers(0, 2**32 - 1)
_STYLES = st.sampled_from(("uniform", "grid", "constant"))
_DENSITIES = st.sampled_from((0.5, 0.2, 0.8))
_PIN_COUNTS = st.integers(0, 3)
_BOOLS = st.booleans()


@functools.cache
def _indices(size: int) -> st.SearchStrategy[int]:
    return st.integers(0, size - 1)


@functools.cache
def batch_shapes(
    min_rows: int = 1, max_rows: int = MAX_ROWS, min_steps: int = 1, max_steps: int = MAX_STEPS
) -> st.SearchStrategy[tuple[int, int]]:
    """A (B, T) shape, from 1 x 1 up to ``max_rows`` x ``max_steps``."""
    return st.tuples(st.integers(min_rows, max_rows), st.integers(min_steps, max_steps))


def _float_width(dtype: torch.dtype) -> Literal[32, 64]:
    return 64 if dtype == torch.float64 else 32


def _inward(bound: float, width: int, upwards: bool) -> float:
    """``bound`` rounded towards the inside of the interval to a float of the given width."""
    if width == 64 or math.isinf(bound):
        return bound
    rounded = torch.tensor(bound, dtype=torch.float32)
    if (upwards and float(rounded) < bound) or (not upwards and float(rounded) > bound):
        direction = torch.tensor(math.inf if upwards else -math.inf, dtype=torch.float32)
        rounded = torch.nextafter(rounded, direction)
    return float(rounded)


@functools.cache
def _elements(
    dtype: torch.dtype, low: float, high: float, specials: tuple[float, ...] = ()
) -> st.SearchStrategy[float]:
    """Single values in [low, high] representable in ``dtype`` (Hypothesis favours 0 and the ends)."""
    width = _float_width(dtype)
    element = st.floats(
        _inward(low, width, upwards=True),
        _inward(high, width, upwards=False),
        width=width,
        allow_subnormal=False,
    )
    return st.one_of(element, st.sampled_from(specials)) if specials else element


def _draw_values(
    draw: st.DrawFn, size: int, dtype: torch.dtype, low: float, high: float, specials: tuple[float, ...] = ()
) -> list[float]:
    """``size`` floats in [low, high]: a style, a seed and up to 3 pinned entries.

    Styles: ``uniform`` in [low, high]; ``grid``, multiples of (high - low) / 8 (exact in binary, so
    ties and exact cancellations happen); ``constant``. Pinned entries take values Hypothesis picks
    or one of ``specials`` (e.g. clip boundaries).
    """
    element = _elements(dtype, low, high, specials)
    style = draw(_STYLES)
    width = _float_width(dtype)
    lo, hi = _inward(low, width, upwards=True), _inward(high, width, upwards=False)
    if style == "constant":
        values = [draw(element)] * size
    else:
        rng = random.Random(draw(_SEEDS))
        if style == "uniform":
            values = [rng.uniform(lo, hi) for _ in range(size)]
        else:
            values = [lo + (hi - lo) / 8 * rng.randint(0, 8) for _ in range(size)]
    if size:
        for _ in range(draw(_PIN_COUNTS)):
            values[draw(_indices(size))] = draw(element)
    return [min(max(v, lo), hi) if math.isfinite(v) else v for v in values]


def _to_tensor(values: Sequence[float], shape: Sequence[int], dtype: torch.dtype) -> Tensor:
    return torch.tensor(list(values), dtype=torch.float64).to(dtype).reshape(tuple(shape))


def _draw_tensor(
    draw: st.DrawFn, shape: Sequence[int], dtype: torch.dtype, low: float, high: float
) -> Tensor:
    return _to_tensor(_draw_values(draw, math.prod(shape), dtype, low, high), shape, dtype)


@st.composite
def float_tensors(
    draw: st.DrawFn, shape: Sequence[int], dtype: torch.dtype, low: float, high: float
) -> Tensor:
    """A tensor of the given shape and dtype with entries in [low, high], exactly representable."""
    return _draw_tensor(draw, shape, dtype, low, high)


def _draw_junk(draw: st.DrawFn, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
    palette = [draw(junk_floats()) for _ in range(draw(_PIN_COUNTS) + 1)]
    rng = random.Random(draw(_SEEDS))
    return _to_tensor([rng.choice(palette) for _ in range(math.prod(shape))], shape, dtype)


@st.composite
def junk_tensors(draw: st.DrawFn, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
    """Arbitrary values for masked-out slots: every entry one of a palette of 1 to 4 values (NaN,
    +-inf, 1e6 or any float), chosen by a seeded generator."""
    return _draw_junk(draw, shape, dtype)


@st.composite
def masked_fills(draw: st.DrawFn, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
    """Values for masked-out slots as the declared input conventions allow (:func:`declared_inputs`):
    junk (:func:`junk_tensors`) under ``"any"``, finite values in [-5, 0] under ``"finite"``, zeros or
    the declared pad value otherwise."""
    fill = _INPUTS["masked_fill"]
    if fill == "any":
        return _draw_junk(draw, shape, dtype)
    if fill == "finite":
        return _draw_tensor(draw, shape, dtype, -5.0, 0.0)
    return torch.full(tuple(shape), 0.0 if fill == "zero" else float(fill), dtype=dtype)


def _draw_bits(draw: st.DrawFn, size: int) -> list[bool]:
    """``size`` booleans from a drawn density and seed."""
    density = draw(_DENSITIES)
    rng = random.Random(draw(_SEEDS))
    return [rng.random() < density for _ in range(size)]


@functools.cache
def _lengths(shortest: int, steps: int) -> st.SearchStrategy[int]:
    return st.one_of(st.just(steps), st.just(shortest), st.integers(shortest, steps))


def _draw_mask(
    draw: st.DrawFn,
    shape: tuple[int, int],
    holes: bool = True,
    empty_rows: bool = False,
    min_tokens: int = 1,
    dtypes: tuple[torch.dtype, ...] = MASK_DTYPES,
) -> Tensor:
    rows, steps = shape
    if rows * steps < min_tokens:
        raise ValueError(f"masks: shape {shape} cannot hold {min_tokens} action tokens")
    holes = holes and bool(_INPUTS["holes"])
    empty_rows = empty_rows and bool(_INPUTS["empty_rows"])
    grid: list[list[bool]] = []
    for _ in range(rows):
        length = draw(_lengths(0 if empty_rows else 1, steps))
        row = [column < length for column in range(steps)]
        if holes and length >= 2 and draw(_BOOLS):
            # Holes anywhere before the last action token, which stays: it ends the response.
            for column, hole in enumerate(_draw_bits(draw, length - 1)):
                row[column] = not hole
        grid.append(row)
    missing = min_tokens - sum(map(sum, grid))
    for flat in range(rows * steps):
        if missing <= 0:
            break
        if not grid[flat // steps][flat % steps]:
            grid[flat // steps][flat % steps] = True
            missing -= 1
    return torch.tensor(grid, dtype=torch.bool).reshape(rows, steps).to(draw(_sampled(dtypes)))


@st.composite
def masks(
    draw: st.DrawFn,
    shape: tuple[int, int],
    *,
    holes: bool = True,
    empty_rows: bool = False,
    min_tokens: int = 1,
    dtypes: Sequence[torch.dtype] = MASK_DTYPES,
) -> Tensor:
    """A (B, T) action mask, bool or 0/1 of a dtype in ``dtypes``.

    Each row has a length (right padding after it; lengths differ between rows, 1 and T are
    favoured) and, if ``holes``, may have holes before its last action token. ``empty_rows``
    allows rows without any action token. At least ``min_tokens`` entries are 1 (turned on in
    row-major order if the draw had fewer), so ``B * T >= min_tokens`` is required.
    """
    return _draw_mask(draw, shape, holes, empty_rows, min_tokens, tuple(dtypes))


def fill_masked(tensor: Tensor, mask: Tensor, value: float | Tensor) -> Tensor:
    """A copy of ``tensor`` with ``value`` (a number or a same-shape tensor) in the masked-out slots."""
    fill = torch.as_tensor(value, dtype=tensor.dtype)
    return torch.where(mask != 0, tensor, fill)


def append_padding(tensor: Tensor, columns: int, value: float | bool | Tensor = 0) -> Tensor:
    """``tensor`` (B, T, ...) with ``columns`` extra positions at the end of dim 1 holding ``value``.

    ``value`` is a number or a tensor of shape (B, columns, ...). Use ``value=0`` for a mask.
    """
    shape = (tensor.shape[0], columns, *tensor.shape[2:])
    if isinstance(value, Tensor):
        extra = value.to(tensor.dtype).reshape(shape)
    else:
        extra = torch.full(shape, value, dtype=tensor.dtype)
    return torch.cat([tensor, extra], dim=1)


def insert_holes(tensor: Tensor, positions: Sequence[int], value: float | bool | Tensor = 0) -> Tensor:
    """``tensor`` (B, T) with one new column inserted before each index in ``positions``.

    ``positions`` are column indices of the original tensor in [0, T] (T appends; repeats insert
    several columns at one place). ``value`` is a number or a (B, len(positions)) tensor holding
    the inserted entries in order. Use ``value=0`` for a mask: the new columns are then holes.
    """
    rows, steps = tensor.shape
    if isinstance(value, Tensor):
        inserted = value.to(tensor.dtype).reshape(rows, len(positions))
    else:
        inserted = torch.full((rows, len(positions)), value, dtype=tensor.dtype)
    pieces: list[Tensor] = []
    start = 0
    for number, position in enumerate(sorted(positions)):
        if not 0 <= position <= steps:
            raise ValueError(f"positions: expected indices in [0, {steps}], got {position}")
        pieces.append(tensor[:, start:position])
        pieces.append(inserted[:, number : number + 1])
        start = position
    pieces.append(tensor[:, start:])
    return torch.cat(pieces, dim=1)


def hole_positions(steps: int, max_holes: int = 4) -> st.SearchStrategy[list[int]]:
    """Sorted insertion indices in [0, steps] for :func:`insert_holes` (at least one)."""
    return st.lists(st.integers(0, steps), min_size=1, max_size=max_holes).map(sorted)


def _junk_off_mask(
    draw: st.DrawFn, tensors: Sequence[Tensor], mask: Tensor, junk: bool | None
) -> list[Tensor]:
    """The tensors, with arbitrary values in their masked-out slots if ``junk`` (None: draw it when
    the declared ``masked_fill`` is ``"any"``), else with what the declared fill puts there."""
    fill = _INPUTS["masked_fill"]
    if junk is None:
        junk = draw(_BOOLS) if fill == "any" else False
    if junk:
        return [fill_masked(t, mask, _draw_junk(draw, tuple(t.shape), t.dtype)) for t in tensors]
    if fill in ("any", "finite"):
        return list(tensors)
    value = 0.0 if fill == "zero" else float(fill)
    return [fill_masked(t, mask, value) for t in tensors]


# --------------------------------------------------------------------------------------------------
# Bundles. ``junk``: True writes arbitrary values (NaN, inf, ...) into the masked-out slots of every
# (B, T) float tensor, False leaves the drawn finite values there (or the declared fill, see
# declared_inputs), None draws the choice when the declared masked_fill is "any".


def _draw_log_ratio_pair(
    draw: st.DrawFn, shape: tuple[int, int], dtype: torch.dtype, specials: tuple[float, ...] = ()
) -> tuple[Tensor, Tensor]:
    """(logp, base_logp): base in [LOGP_MIN, 0], logp - base mostly in [-3, 3] (logp is kept <= 0)."""
    base = _draw_values(draw, math.prod(shape), dtype, LOGP_MIN, 0.0)
    ratios = _draw_values(draw, math.prod(shape), dtype, -LOG_RATIO_MAX, LOG_RATIO_MAX, specials)
    moved = [min(b + r, 0.0) for b, r in zip(base, ratios, strict=True)]
    return _to_tensor(moved, shape, dtype), _to_tensor(base, shape, dtype)


@st.composite
def policy_batches(
    draw: st.DrawFn,
    *,
    max_rows: int = MAX_ROWS,
    max_steps: int = MAX_STEPS,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    empty_rows: bool = True,
    min_tokens: int = 1,
    loss_aggs: Sequence[str] = COUNT_AGGREGATIONS,
    junk: bool | None = None,
) -> PolicyBatch:
    """Inputs of ``policy_loss``: log-ratios up to +-3 (the clip boundaries log(1 +- eps) and 0
    pinned on purpose), advantages in [-5, 5]."""
    rows, steps = draw(batch_shapes(max_rows=max_rows, max_steps=max_steps))
    shape = (rows, max(steps, -(-min_tokens // rows)))  # room for min_tokens action tokens
    dtype = draw(float_dtypes(dtypes))
    eps = draw(clip_eps())
    logp, old_logp = _draw_log_ratio_pair(draw, shape, dtype, (math.log1p(eps), math.log1p(-eps), 0.0))
    advantages = _draw_tensor(draw, shape, dtype, -5.0, 5.0)
    mask = _draw_mask(draw, shape, empty_rows=empty_rows, min_tokens=min_tokens)
    logp, old_logp, advantages = _junk_off_mask(draw, (logp, old_logp, advantages), mask, junk)
    return PolicyBatch(logp, old_logp, advantages, mask, eps, draw(loss_aggregations(loss_aggs)))


@st.composite
def penalty_batches(
    draw: st.DrawFn,
    *,
    max_rows: int = MAX_ROWS,
    max_steps: int = MAX_STEPS,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    empty_rows: bool = True,
    junk: bool | None = None,
) -> PenaltyBatch:
    """Inputs of ``ppo_penalty_loss``: log-ratios up to +-3, advantages in [-5, 5], beta in [0, 10]."""
    shape = draw(batch_shapes(max_rows=max_rows, max_steps=max_steps))
    dtype = draw(float_dtypes(dtypes))
    logp, old_logp = _draw_log_ratio_pair(draw, shape, dtype)
    advantages = _draw_tensor(draw, shape, dtype, -5.0, 5.0)
    mask = _draw_mask(draw, shape, empty_rows=empty_rows)
    logp, old_logp, advantages = _junk_off_mask(draw, (logp, old_logp, advantages), mask, junk)
    return PenaltyBatch(logp, old_logp, advantages, mask, draw(_penalty_betas()))


@st.composite
def value_batches(
    draw: st.DrawFn,
    *,
    max_rows: int = MAX_ROWS,
    max_steps: int = MAX_STEPS,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    empty_rows: bool = True,
    clip: bool | None = None,
    junk: bool | None = None,
) -> ValueBatch:
    """Inputs of ``value_loss``: old values and returns in [-10, 10], values within 2 of the old
    ones; ``clip`` True draws a clip range, False gives None, None draws either."""
    shape = draw(batch_shapes(max_rows=max_rows, max_steps=max_steps))
    dtype = draw(float_dtypes(dtypes))
    old_values = _draw_tensor(draw, shape, dtype, -10.0, 10.0)
    # Values near the old ones (inside and outside the clip range) are the interesting case.
    moves = _draw_tensor(draw, shape, dtype, -2.0, 2.0)
    values = (old_values.double() + moves.double()).to(dtype)
    returns = _draw_tensor(draw, shape, dtype, -10.0, 10.0)
    mask = _draw_mask(draw, shape, empty_rows=empty_rows)
    values, old_values, returns = _junk_off_mask(draw, (values, old_values, returns), mask, junk)
    clip_range = draw(value_clips())
    if clip is not None and (clip_range is not None) != clip:
        clip_range = draw(clip_eps()) * 5.0 if clip else None
    return ValueBatch(values, old_values, returns, mask, clip_range)


@st.composite
def gae_batches(
    draw: st.DrawFn,
    *,
    max_rows: int = MAX_ROWS,
    max_steps: int = MAX_STEPS,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    empty_rows: bool = True,
    bootstrap: bool | None = None,
    junk: bool | None = None,
) -> GAEBatch:
    """Inputs of ``gae``: rewards and values in [-5, 5], gamma and lam independent in [0, 1];
    ``bootstrap`` True draws ``last_values`` in [-5, 5], False gives None, None draws either."""
    shape = draw(batch_shapes(max_rows=max_rows, max_steps=max_steps))
    dtype = draw(float_dtypes(dtypes))
    rewards = _draw_tensor(draw, shape, dtype, -5.0, 5.0)
    values = _draw_tensor(draw, shape, dtype, -5.0, 5.0)
    mask = _draw_mask(draw, shape, empty_rows=empty_rows)
    rewards, values = _junk_off_mask(draw, (rewards, values), mask, junk)
    if bootstrap is None:
        bootstrap = draw(_BOOLS)
    last_values = _draw_tensor(draw, (shape[0],), dtype, -5.0, 5.0) if bootstrap else None
    return GAEBatch(rewards, values, mask, draw(gammas()), draw(lams()), last_values)


@st.composite
def reward_batches(
    draw: st.DrawFn,
    *,
    max_rows: int = MAX_ROWS,
    max_steps: int = MAX_STEPS,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    empty_rows: bool = True,
    junk: bool | None = None,
) -> RewardBatch:
    """Inputs of ``token_rewards``: scores in [-5, 5], log-probs with log-ratios up to +-3."""
    shape = draw(batch_shapes(max_rows=max_rows, max_steps=max_steps))
    dtype = draw(float_dtypes(dtypes))
    logp, ref_logp = _draw_log_ratio_pair(draw, shape, dtype)
    scores = _draw_tensor(draw, (shape[0],), dtype, -5.0, 5.0)
    mask = _draw_mask(draw, shape, empty_rows=empty_rows)
    logp, ref_logp = _junk_off_mask(draw, (logp, ref_logp), mask, junk)
    return RewardBatch(scores, logp, ref_logp, mask, draw(kl_coefs()), draw(kl_estimators()))


@st.composite
def kl_batches(
    draw: st.DrawFn,
    *,
    max_rows: int = MAX_ROWS,
    max_steps: int = MAX_STEPS,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    with_mask: bool | None = None,
    junk: bool | None = None,
) -> KLBatch:
    """Inputs of ``kl_penalty``; ``with_mask`` True/False/None (draw). Junk only goes where masked."""
    shape = draw(batch_shapes(max_rows=max_rows, max_steps=max_steps))
    dtype = draw(float_dtypes(dtypes))
    logp, ref_logp = _draw_log_ratio_pair(draw, shape, dtype)
    if with_mask is None:
        with_mask = draw(_BOOLS)
    mask = _draw_mask(draw, shape, empty_rows=True) if with_mask else None
    if mask is not None:
        logp, ref_logp = _junk_off_mask(draw, (logp, ref_logp), mask, junk)
    return KLBatch(logp, ref_logp, mask, draw(kl_estimators()))


@st.composite
def masked_batches(
    draw: st.DrawFn,
    *,
    ndims: Sequence[int] = (2,),
    max_side: int = MAX_STEPS,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    min_tokens: int = 0,
    low: float = -100.0,
    high: float = 100.0,
    junk: bool | None = None,
) -> MaskedBatch:
    """``x`` in [low, high] and a same-shape mask with at least ``min_tokens`` ones. Two-dimensional
    ``x`` gets a (B, T) action mask (empty rows allowed); other ranks an arbitrary 0/1 pattern."""
    ndim = draw(_sampled(tuple(ndims)))
    dtype = draw(float_dtypes(dtypes))
    if ndim == 2:
        rows, steps = draw(batch_shapes(max_steps=max_side))
        shape: tuple[int, ...] = (rows, max(steps, -(-min_tokens // rows)))
        mask = _draw_mask(draw, (shape[0], shape[1]), empty_rows=True, min_tokens=min_tokens)
    else:
        shape = tuple(draw(_indices(4)) + 1 for _ in range(ndim))
        if math.prod(shape) < min_tokens:
            shape = (*shape[:-1], min_tokens) if ndim else ()
        size = math.prod(shape)
        bits = _draw_bits(draw, size)
        for flat in range(size):
            if sum(bits) >= min_tokens:
                break
            bits[flat] = True
        mask = torch.tensor(bits, dtype=torch.bool).reshape(shape).to(draw(_sampled(MASK_DTYPES)))
    x = _draw_tensor(draw, shape, dtype, low, high)
    return MaskedBatch(_junk_off_mask(draw, (x,), mask, junk)[0], mask)


@functools.cache
def _constant_levels(dtype: torch.dtype) -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from((0.1, 1.0 / 3.0, -2.7)), _elements(dtype, -10.0, 10.0))


@st.composite
def ev_batches(
    draw: st.DrawFn,
    *,
    max_rows: int = MAX_ROWS,
    max_steps: int = MAX_STEPS,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    constant_returns: bool = False,
    junk: bool | None = None,
) -> EVBatch:
    """Inputs of ``explained_variance`` with at least 2 action tokens; values and returns in
    [-10, 10]. ``constant_returns`` makes every return the same value (EV undefined)."""
    rows, steps = draw(batch_shapes(max_rows=max_rows, max_steps=max_steps))
    shape = (rows, max(steps, 2))
    dtype = draw(float_dtypes(dtypes))
    values = _draw_tensor(draw, shape, dtype, -10.0, 10.0)
    if constant_returns:
        returns = _to_tensor([draw(_constant_levels(dtype))] * math.prod(shape), shape, dtype)
    else:
        returns = _draw_tensor(draw, shape, dtype, -10.0, 10.0)
    mask = _draw_mask(draw, shape, empty_rows=True, min_tokens=2)
    values, returns = _junk_off_mask(draw, (values, returns), mask, junk)
    return EVBatch(values, returns, mask)


def _draw_ids(draw: st.DrawFn, size: int, vocab: int) -> list[int]:
    rng = random.Random(draw(_SEEDS))
    ids = [rng.randrange(vocab) for _ in range(size)]
    if size:
        for _ in range(draw(_PIN_COUNTS)):
            ids[draw(_indices(size))] = draw(_indices(vocab))
    return ids


@st.composite
def token_ids(draw: st.DrawFn, size: int, vocab: int) -> list[int]:
    """``size`` token ids in [0, vocab): seeded, with up to 3 entries pinned by Hypothesis."""
    return _draw_ids(draw, size, vocab)


@st.composite
def logits_batches(
    draw: st.DrawFn,
    *,
    max_rows: int = 4,
    max_length: int = 8,
    max_vocab: int = 9,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES + HALF_DTYPES,
    banned_tokens: bool = True,
    id_dtypes: Sequence[torch.dtype] = (torch.int64,),
) -> LogitsBatch:
    """Logits (B, L, V) in [-10, 10] with ``input_ids`` (B, L) in [0, V) and a temperature.

    ``banned_tokens`` sets some logits to -inf (never a whole position, which is invalid input);
    a sampled id may be a banned one (its log-prob is then -inf).
    """
    rows, length, vocab = (draw(_indices(top)) + 1 for top in (max_rows, max_length, max_vocab))
    dtype = draw(_sampled(tuple(dtypes)))
    logits = _draw_tensor(
        draw, (rows, length, vocab), torch.float32 if dtype in HALF_DTYPES else dtype, -10, 10
    )
    logits = logits.to(dtype)
    if banned_tokens and _INPUTS["inf_logits"] and vocab > 1 and draw(_BOOLS):
        banned = torch.tensor(_draw_bits(draw, rows * length * vocab)).reshape(rows, length, vocab)
        banned[..., draw(_indices(vocab))] = False  # one token always stays allowed
        logits = logits.masked_fill(banned, -math.inf)
    ids = torch.tensor(_draw_ids(draw, rows * length, vocab), dtype=draw(_sampled(tuple(id_dtypes))))
    return LogitsBatch(logits, ids.reshape(rows, length), draw(temperatures()))


@st.composite
def kl_controller_cases(draw: st.DrawFn, max_updates: int = 6) -> KLControllerCase:
    """An adaptive controller (coef in [1e-3, 1], target in [0.1, 20], horizon in [100, 1e5]) and
    a few updates with measured KL in [0, 50] and 1..1024 sequences."""
    updates = draw(
        st.lists(st.tuples(st.floats(0.0, 50.0), st.integers(1, 1024)), min_size=1, max_size=max_updates)
    )
    return KLControllerCase(
        init_kl_coef=draw(st.floats(1e-3, 1.0)),
        target=draw(st.floats(0.1, 20.0)),
        horizon=draw(st.floats(100.0, 1e5)),
        updates=tuple(updates),
    )


# --------------------------------------------------------------------------------------------------
# The PPO family (issue 10): group advantages, loss aggregation and micro-batch splits, the clip
# options of policy_loss, GSPO, CISPO, KL as a loss, rollout corrections. Every (B, T) bundle has
# holes, padding and (unless told otherwise) empty rows and rows of unequal length.

GROUP_ID_POOL: tuple[int, ...] = (7, -3, 0, 42, 5, 1000, 11, 2, -8, 64)
"""Group ids are drawn from this pool: not contiguous, not sorted, negative ones included."""


@dataclass(frozen=True, repr=False)
class GroupBatch(_Bundle):
    """Arguments of ``group_advantages``: one score per row, rows of a group scattered through the
    batch; ``eps`` is only read by ``grpo``."""

    scores: Tensor
    group_ids: Tensor
    method: str
    std_scope: str
    eps: float


@dataclass(frozen=True, repr=False)
class AggregationBatch(_Bundle):
    """Arguments of ``aggregate_loss``; ``norm_constant`` is set for ``seq-mean-token-sum-norm`` only."""

    per_token: Tensor
    mask: Tensor
    loss_agg: str
    norm_constant: float | None


@dataclass(frozen=True, repr=False)
class ClipBatch(_Bundle):
    """Arguments of ``policy_loss`` with the clip options (CLIP-1..3): ``clip_eps_high`` None means
    symmetric, ``dual_clip`` None means no dual clip."""

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    clip_eps: float
    clip_eps_high: float | None
    dual_clip: float | None
    loss_agg: str


@dataclass(frozen=True, repr=False)
class GSPOBatch(_Bundle):
    """Arguments of ``gspo_loss``: ``advantages`` is (B,), one per sequence."""

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    clip_eps: float
    clip_eps_high: float | None


@dataclass(frozen=True, repr=False)
class CISPOBatch(_Bundle):
    """Arguments of ``cispo_loss`` (offsets from 1: the weight is clip(rho, 1 - clip_low, 1 + clip_high))."""

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    clip_low: float
    clip_high: float
    loss_agg: str
    norm_constant: float | None


@dataclass(frozen=True, repr=False)
class KLLossBatch(_Bundle):
    """Arguments of ``kl_loss``."""

    logp: Tensor
    ref_logp: Tensor
    mask: Tensor
    estimator: str
    loss_agg: str
    norm_constant: float | None


@dataclass(frozen=True, repr=False)
class CorrectionBatch(_Bundle):
    """Arguments of ``rollout_correction`` (``low`` None: no lower bound)."""

    logp: Tensor
    rollout_logp: Tensor
    mask: Tensor
    level: str
    mode: str
    high: float
    low: float | None


@functools.cache
def _group_sizes(max_groups: int, max_size: int) -> st.SearchStrategy[list[int]]:
    size = st.one_of(st.just(1), st.integers(1, max_size))
    return st.lists(size, min_size=1, max_size=max_groups)


@st.composite
def group_batches(
    draw: st.DrawFn,
    *,
    methods: Sequence[str] = GROUP_METHODS,
    scopes: Sequence[str] = STD_SCOPES,
    max_groups: int = 4,
    max_size: int = 5,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    singletons: bool = True,
) -> GroupBatch:
    """Scores in [-5, 5] (grid values give ties and constant groups), groups of 1..``max_size``
    rows (singletons unless ``singletons`` is False) with ids from :data:`GROUP_ID_POOL`, rows
    shuffled so that a group's rows are not contiguous. Some groups are made constant on purpose.
    ``std_scope`` is drawn for ``grpo`` only (the other methods take ``group``)."""
    sizes = draw(_group_sizes(max_groups, max_size))
    if not singletons:
        sizes = [max(size, 2) for size in sizes]
    ids_pool = list(GROUP_ID_POOL)
    random.Random(draw(_SEEDS)).shuffle(ids_pool)
    dtype = draw(float_dtypes(dtypes))
    rows: list[tuple[int, float]] = []
    for group, size in enumerate(sizes):
        values = _draw_values(draw, size, dtype, -5.0, 5.0)
        if size > 1 and draw(_BOOLS) and draw(_BOOLS):  # a constant group, a quarter of the time
            values = [values[0]] * size
        rows += [(ids_pool[group % len(ids_pool)], value) for value in values]
    random.Random(draw(_SEEDS)).shuffle(rows)
    method = draw(_sampled(tuple(methods)))
    scope = draw(_sampled(tuple(scopes))) if method == "grpo" else "group"
    eps = draw(_sampled((1e-6, 0.0, 1e-4, 0.1)))
    scores = _to_tensor([v for _, v in rows], (len(rows),), dtype)
    return GroupBatch(scores, torch.tensor([i for i, _ in rows], dtype=torch.int64), method, scope, eps)


@functools.cache
def norm_constants() -> st.SearchStrategy[float]:
    """The C of ``seq-mean-token-sum-norm``: a maximum response length (1..64) or any float in [0.5, 100]."""
    return st.one_of(st.integers(1, 64).map(float), st.floats(0.5, 100.0))


def _norm_constant(draw: st.DrawFn, loss_agg: str) -> float | None:
    return draw(norm_constants()) if loss_agg == "seq-mean-token-sum-norm" else None


@st.composite
def aggregation_batches(
    draw: st.DrawFn,
    *,
    loss_aggs: Sequence[str] = LOSS_AGGREGATIONS,
    max_rows: int = MAX_ROWS,
    max_steps: int = MAX_STEPS,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    empty_rows: bool = True,
    junk: bool | None = None,
) -> AggregationBatch:
    """A per-token loss in [-10, 10] with a mask (holes, padding, empty rows) and a loss_agg mode."""
    shape = draw(batch_shapes(max_rows=max_rows, max_steps=max_steps))
    dtype = draw(float_dtypes(dtypes))
    per_token = _draw_tensor(draw, shape, dtype, -10.0, 10.0)
    mask = _draw_mask(draw, shape, empty_rows=empty_rows)
    (per_token,) = _junk_off_mask(draw, (per_token,), mask, junk)
    loss_agg = draw(_sampled(tuple(loss_aggs)))
    return AggregationBatch(per_token, mask, loss_agg, _norm_constant(draw, loss_agg))


@st.composite
def micro_batches(draw: st.DrawFn, rows: int, max_parts: int = 4) -> list[list[int]]:
    """A split of ``rows`` row indices into 1..``max_parts`` non-empty micro-batches, each a sorted
    list; rows are assigned at random, so a micro-batch need not be contiguous (data-parallel
    shards) and may hold only rows without an action token."""
    parts = draw(st.integers(1, max(1, min(max_parts, rows))))
    order = draw(st.permutations(range(rows)))
    cuts = (
        sorted(draw(st.sets(st.integers(1, rows - 1), min_size=parts - 1, max_size=parts - 1)))
        if parts > 1
        else []
    )
    bounds = [0, *cuts, rows]
    return [sorted(order[a:b]) for a, b in itertools.pairwise(bounds)]


def whole_batch_counts(mask: Tensor, loss_agg: str) -> dict[str, int]:
    """The keywords that make a call on one micro-batch a share of the whole batch (AGG-2): the
    whole batch's action-token count for ``token-mean``, its row count for the other modes (rows
    with an action token; every row for ``seq-mean-token-sum-norm``)."""
    keep = mask != 0
    if loss_agg == "token-mean":
        return {"token_count": int(keep.sum())}
    if loss_agg == "seq-mean-token-sum-norm":
        return {"row_count": int(keep.shape[0])}
    return {"row_count": int(keep.any(dim=1).sum())}


@functools.cache
def clip_eps_highs() -> st.SearchStrategy[float | None]:
    """DAPO's upper clip offset: None (symmetric), 0.28 or a float in [0.05, 1]."""
    return st.one_of(st.none(), st.just(0.28), st.floats(0.05, 1.0))


@functools.cache
def dual_clips() -> st.SearchStrategy[float | None]:
    """The dual-clip constant c: None, 3 or a float in (1, 10]."""
    return st.one_of(st.none(), st.just(3.0), st.floats(1.05, 10.0))


@st.composite
def clip_batches(
    draw: st.DrawFn,
    *,
    max_rows: int = MAX_ROWS,
    max_steps: int = MAX_STEPS,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    loss_aggs: Sequence[str] = COUNT_AGGREGATIONS,
    high: bool | None = None,
    dual: bool | None = None,
    junk: bool | None = None,
) -> ClipBatch:
    """Inputs of ``policy_loss`` with ``clip_eps_high`` and ``dual_clip`` (``high``/``dual`` True
    forces one, False gives None, None draws). Log-ratios reach +-3 (ratios up to 20, beyond any
    dual-clip bound up to 10 drawn here), with log(1 - eps), log(1 + eps_high), log(c) and 0
    pinned; advantages in [-5, 5], negative half the time."""
    shape = draw(batch_shapes(max_rows=max_rows, max_steps=max_steps))
    dtype = draw(float_dtypes(dtypes))
    eps = draw(clip_eps())
    eps_high = draw(clip_eps_highs())
    if high is not None and (eps_high is not None) != high:
        eps_high = 0.28 if high else None
    c = draw(dual_clips())
    if dual is not None and (c is not None) != dual:
        c = 3.0 if dual else None
    specials = [math.log1p(-eps), math.log1p(eps_high if eps_high is not None else eps), 0.0]
    if c is not None:
        specials.append(math.log(c))
    logp, old_logp = _draw_log_ratio_pair(draw, shape, dtype, tuple(specials))
    advantages = _draw_tensor(draw, shape, dtype, -5.0, 5.0)
    mask = _draw_mask(draw, shape, empty_rows=True)
    logp, old_logp, advantages = _junk_off_mask(draw, (logp, old_logp, advantages), mask, junk)
    loss_agg = draw(_sampled(tuple(loss_aggs)))
    return ClipBatch(logp, old_logp, advantages, mask, eps, eps_high, c, loss_agg)


@functools.cache
def _gspo_eps() -> st.SearchStrategy[float]:
    return st.one_of(st.just(3e-4), st.just(0.2), st.floats(1e-4, 0.5))


@st.composite
def gspo_batches(
    draw: st.DrawFn,
    *,
    max_rows: int = MAX_ROWS,
    max_steps: int = MAX_STEPS,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    empty_rows: bool = True,
    junk: bool | None = None,
) -> GSPOBatch:
    """Inputs of ``gspo_loss``: token log-ratios within +-1 (so a sequence ratio lands on either
    side of GSPO's narrow clip range, 3e-4 in the paper), one advantage per row in [-5, 5]."""
    shape = draw(batch_shapes(max_rows=max_rows, max_steps=max_steps))
    dtype = draw(float_dtypes(dtypes))
    eps = draw(_gspo_eps())
    eps_high = draw(st.one_of(st.none(), st.just(4e-4), st.floats(1e-4, 0.5)))
    base = _draw_values(draw, math.prod(shape), dtype, LOGP_MIN, -1.0)
    moves = _draw_values(draw, math.prod(shape), dtype, -1.0, 1.0, (0.0,))
    logp = _to_tensor([b + m for b, m in zip(base, moves, strict=True)], shape, dtype)
    old_logp = _to_tensor(base, shape, dtype)
    advantages = _draw_tensor(draw, (shape[0],), dtype, -5.0, 5.0)
    mask = _draw_mask(draw, shape, empty_rows=empty_rows)
    logp, old_logp = _junk_off_mask(draw, (logp, old_logp), mask, junk)
    return GSPOBatch(logp, old_logp, advantages, mask, eps, eps_high)


@functools.cache
def _cispo_offsets() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from((0.0, 0.2, 0.28, 1.0, 4.0, 5.0)), st.floats(0.0, 5.0))


@st.composite
def cispo_batches(
    draw: st.DrawFn,
    *,
    max_rows: int = MAX_ROWS,
    max_steps: int = MAX_STEPS,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    loss_aggs: Sequence[str] = LOSS_AGGREGATIONS,
    empty_rows: bool = True,
    junk: bool | None = None,
) -> CISPOBatch:
    """Inputs of ``cispo_loss``: log-ratios up to +-3 with the bounds' logs pinned, advantages in
    [-5, 5], offsets in [0, 5] (0.2/0.28, ScaleRL's 1/4 and skyrl 0.3.1's 0/5 favoured)."""
    shape = draw(batch_shapes(max_rows=max_rows, max_steps=max_steps))
    dtype = draw(float_dtypes(dtypes))
    low, high = draw(_cispo_offsets()), draw(_cispo_offsets())
    specials = [math.log1p(high), 0.0] + ([math.log1p(-low)] if low < 1 else [])
    logp, old_logp = _draw_log_ratio_pair(draw, shape, dtype, tuple(specials))
    advantages = _draw_tensor(draw, shape, dtype, -5.0, 5.0)
    mask = _draw_mask(draw, shape, empty_rows=empty_rows)
    logp, old_logp, advantages = _junk_off_mask(draw, (logp, old_logp, advantages), mask, junk)
    loss_agg = draw(_sampled(tuple(loss_aggs)))
    return CISPOBatch(logp, old_logp, advantages, mask, low, high, loss_agg, _norm_constant(draw, loss_agg))


@st.composite
def kl_loss_batches(
    draw: st.DrawFn,
    *,
    estimators: Sequence[str] = KL_LOSS_ESTIMATORS,
    max_rows: int = MAX_ROWS,
    max_steps: int = MAX_STEPS,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    loss_aggs: Sequence[str] = LOSS_AGGREGATIONS,
    empty_rows: bool = True,
    junk: bool | None = None,
) -> KLLossBatch:
    """Inputs of ``kl_loss``: log-ratios to the reference up to +-3, holes, padding, empty rows."""
    shape = draw(batch_shapes(max_rows=max_rows, max_steps=max_steps))
    dtype = draw(float_dtypes(dtypes))
    logp, ref_logp = _draw_log_ratio_pair(draw, shape, dtype, (0.0,))
    mask = _draw_mask(draw, shape, empty_rows=empty_rows)
    logp, ref_logp = _junk_off_mask(draw, (logp, ref_logp), mask, junk)
    loss_agg = draw(_sampled(tuple(loss_aggs)))
    estimator = draw(_sampled(tuple(estimators)))
    return KLLossBatch(logp, ref_logp, mask, estimator, loss_agg, _norm_constant(draw, loss_agg))


@st.composite
def correction_batches(
    draw: st.DrawFn,
    *,
    levels: Sequence[str] = CORRECTION_LEVELS,
    modes: Sequence[str] = CORRECTION_MODES,
    max_rows: int = MAX_ROWS,
    max_steps: int = MAX_STEPS,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    empty_rows: bool = True,
    junk: bool | None = None,
) -> CorrectionBatch:
    """Inputs of ``rollout_correction``: trainer and rollout log-probs within +-1 of each other
    (some equal), ``high`` in [1, 10] (2 and 5 favoured), ``low`` None or in [0.05, 1]."""
    shape = draw(batch_shapes(max_rows=max_rows, max_steps=max_steps))
    dtype = draw(float_dtypes(dtypes))
    base = _draw_values(draw, math.prod(shape), dtype, LOGP_MIN, -1.0)
    moves = _draw_values(draw, math.prod(shape), dtype, -1.0, 1.0, (0.0, math.log(2.0), -math.log(2.0)))
    logp = _to_tensor([b + m for b, m in zip(base, moves, strict=True)], shape, dtype)
    rollout_logp = _to_tensor(base, shape, dtype)
    mask = _draw_mask(draw, shape, empty_rows=empty_rows)
    logp, rollout_logp = _junk_off_mask(draw, (logp, rollout_logp), mask, junk)
    high = draw(st.one_of(st.sampled_from((2.0, 5.0)), st.floats(1.0, 10.0)))
    low = draw(st.one_of(st.none(), st.just(0.5), st.floats(0.05, 1.0)))
    return CorrectionBatch(
        logp, rollout_logp, mask, draw(_sampled(tuple(levels))), draw(_sampled(tuple(modes))), high, low
    )
