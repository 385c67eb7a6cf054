"""Primitive draws: scalars, tensors, masks, junk for masked-out slots, and the helpers of the
invariance tests (:func:`fill_masked`, :func:`append_padding`, :func:`insert_holes`).

One job: draw the pieces the bundles are made of. Everything is drawn on the CPU from torch and
Hypothesis alone, obeying the declared input conventions (:mod:`.inputs`).
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Sequence
from typing import Any, Literal

import torch
from hypothesis import strategies as st
from torch import Tensor

from ppo_ref.aggregation import COUNT_AGGREGATIONS
from ppo_ref.kl import KL_ESTIMATORS

from .inputs import (
    _INPUTS,
    FLOAT_DTYPES,
    JUNK_VALUES,
    LOG_RATIO_MAX,
    LOGP_MIN,
    MASK_DTYPES,
    MAX_ROWS,
    MAX_STEPS,
)

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


def _draw_log_ratio_pair(
    draw: st.DrawFn, shape: tuple[int, int], dtype: torch.dtype, specials: tuple[float, ...] = ()
) -> tuple[Tensor, Tensor]:
    """(logp, base_logp): base in [LOGP_MIN, 0], logp - base mostly in [-3, 3] (logp is kept <= 0)."""
    base = _draw_values(draw, math.prod(shape), dtype, LOGP_MIN, 0.0)
    ratios = _draw_values(draw, math.prod(shape), dtype, -LOG_RATIO_MAX, LOG_RATIO_MAX, specials)
    moved = [min(b + r, 0.0) for b, r in zip(base, ratios, strict=True)]
    return _to_tensor(moved, shape, dtype), _to_tensor(base, shape, dtype)


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
