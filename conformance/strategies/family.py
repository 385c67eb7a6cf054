"""The PPO family's bundles and strategies (issue 10): group advantages, loss aggregation and
micro-batch splits, the clip options of ``policy_loss``, GSPO, CISPO, KL as a loss, rollout
corrections.

One job: draw whole, consistent inputs of the family's reference functions. Every (B, T) bundle has
holes, padding and (unless told otherwise) empty rows and rows of unequal length.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from torch import Tensor

from ppo_ref.aggregation import COUNT_AGGREGATIONS, LOSS_AGGREGATIONS
from ppo_ref.correction import CORRECTION_LEVELS, CORRECTION_MODES
from ppo_ref.group import GROUP_METHODS, STD_SCOPES
from ppo_ref.kl_loss import KL_LOSS_ESTIMATORS

from .inputs import FLOAT_DTYPES, LOGP_MIN, MAX_ROWS, MAX_STEPS
from .primitives import (
    _BOOLS,
    _SEEDS,
    _draw_log_ratio_pair,
    _draw_mask,
    _draw_tensor,
    _draw_values,
    _junk_off_mask,
    _sampled,
    _to_tensor,
    batch_shapes,
    clip_eps,
    float_dtypes,
)
from .reprs import _Bundle

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
