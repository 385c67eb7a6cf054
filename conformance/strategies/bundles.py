"""The core bundles: frozen dataclasses of one reference function's arguments (:class:`PolicyBatch`,
:class:`GAEBatch`, ...) and the strategies that draw them (:func:`policy_batches`, ...).

One job: draw whole, consistent inputs of the PPO core (policy, penalty and value losses, GAE,
token rewards, KL, masked statistics, explained variance, log-probs, the adaptive KL controller).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from torch import Tensor

from ppo_ref.aggregation import COUNT_AGGREGATIONS

from .inputs import _INPUTS, FLOAT_DTYPES, HALF_DTYPES, MASK_DTYPES, MAX_ROWS, MAX_STEPS
from .primitives import (
    _BOOLS,
    _draw_bits,
    _draw_ids,
    _draw_log_ratio_pair,
    _draw_mask,
    _draw_tensor,
    _elements,
    _indices,
    _junk_off_mask,
    _penalty_betas,
    _sampled,
    _to_tensor,
    batch_shapes,
    clip_eps,
    float_dtypes,
    gammas,
    kl_coefs,
    kl_estimators,
    lams,
    loss_aggregations,
    temperatures,
    value_clips,
)
from .reprs import _Bundle


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
# Bundles. ``junk``: True writes arbitrary values (NaN, inf, ...) into the masked-out slots of every
# (B, T) float tensor, False leaves the drawn finite values there (or the declared fill, see
# declared_inputs), None draws the choice when the declared masked_fill is "any".


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
