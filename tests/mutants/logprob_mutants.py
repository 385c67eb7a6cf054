"""Mutants of the log-prob, entropy and masked-statistics ops (LOGP-*, ENT-1, MASK-*)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

import ppo_ref
from tests.mutants.base import MutantSpec, bool_mask, work_dtype

NAN, INF = math.nan, math.inf
WHITEN_EPS = 1e-8


def _table(dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """The LOGP-1 table: tokens [p, a, b, EOS] and hand-set logits."""
    logits = torch.tensor(
        [
            [
                [0.0, math.log(6), math.log(2), 0.0],
                [3.0, 3.0, 3.0, 3.0],
                [0.0, 0.0, math.log(2), math.log(16)],
                [5.0, -1.0, 0.0, 2.0],
            ]
        ],
        dtype=dtype,
    )
    return {"logits": logits, "input_ids": torch.tensor([[0, 1, 2, 3]])}


def _integer_logits(dtype: torch.dtype) -> Tensor:
    """Logits exactly representable in bfloat16 (so the input carries no rounding)."""
    return torch.tensor([[[0.0, 1, 2, 3, 4, 5, 6, 7], [0.0, 2, 1, 0, -1, 0.5, 3, 1.5]]], dtype=dtype)


# --- token_logprobs --------------------------------------------------------------------------------


def token_logprobs_without_shift(logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
    logp = torch.log_softmax(logits[:, :-1].to(work_dtype(logits)) / temperature, dim=-1)
    # BUG (A1): reads the token at position i instead of i + 1
    return logp.gather(-1, input_ids[:, :-1].unsqueeze(-1)).squeeze(-1)


def token_logprobs_ignoring_temperature(
    logits: Tensor, input_ids: Tensor, temperature: float = 1.0
) -> Tensor:
    # BUG (A2): the sampling temperature is accepted but never applied
    logp = torch.log_softmax(logits[:, :-1].to(work_dtype(logits)), dim=-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def token_logprobs_temperature_on_target_only(
    logits: Tensor, input_ids: Tensor, temperature: float = 1.0
) -> Tensor:
    """Gather-then-logsumexp (no (B, L, V) log-softmax), with the temperature on one side only."""
    z = logits[:, :-1].to(work_dtype(logits))
    target = z.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1) / temperature
    # BUG (A2): the normaliser is the logsumexp of the unscaled logits
    return target - torch.logsumexp(z, dim=-1)


def token_logprobs_in_logits_dtype(logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
    # BUG (A6): log_softmax runs in the logits' own dtype (bfloat16 stays bfloat16), cast afterwards
    logp = torch.log_softmax(logits[:, :-1] / temperature, dim=-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1).to(work_dtype(logits))


# --- entropy ----------------------------------------------------------------------------------------


def entropy_in_logits_dtype(logits: Tensor) -> Tensor:
    # BUG (A6): the softmax and its logarithm are computed in half precision for half logits
    logp = torch.log_softmax(logits, dim=-1)
    probs = logp.exp()
    terms = torch.where(probs > 0, probs * logp, torch.zeros((), dtype=logp.dtype))
    return -terms.sum(-1).to(work_dtype(logits))


# --- masked_mean ------------------------------------------------------------------------------------


def masked_mean_by_multiplying(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    weights = mask.to(x.dtype)
    weighted = x * weights  # BUG (E2): 0 * nan = nan, so a NaN in padding reaches the mean
    total = weighted.sum() if dim is None else weighted.sum(dim)
    count = weights.sum() if dim is None else weights.sum(dim)
    return total / count.clamp(min=1)


def masked_mean_without_empty_guard(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    keep = bool_mask(mask)
    zeroed = torch.where(keep, x, torch.zeros((), dtype=x.dtype))
    total = zeroed.sum() if dim is None else zeroed.sum(dim)
    count = keep.sum() if dim is None else keep.sum(dim)
    return total / count  # BUG (E2): no clamp or epsilon, an empty mask gives 0 / 0 = nan


def masked_mean_over_all_positions(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    zeroed = torch.where(bool_mask(mask), x, torch.zeros((), dtype=x.dtype))
    # BUG (E1): .mean() divides by every position, padding and holes included
    return zeroed.mean() if dim is None else zeroed.mean(dim)


# --- masked_whiten ----------------------------------------------------------------------------------


def masked_whiten_per_row(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    keep = bool_mask(mask)
    zero = torch.zeros((), dtype=x.dtype)
    x = torch.where(keep, x, zero)
    # BUG (C6): statistics of each row (sequence) instead of the whole batch
    count = keep.sum(-1, keepdim=True)
    mean = x.sum(-1, keepdim=True) / count
    var = torch.where(keep, x - mean, zero).pow(2).sum(-1, keepdim=True) / (count - 1)
    whitened = (x - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(keep, whitened, zero)


def masked_whiten_biased(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    keep = bool_mask(mask)
    zero = torch.zeros((), dtype=x.dtype)
    x = torch.where(keep, x, zero)
    mean = ppo_ref.masked_mean(x, keep)
    var = ppo_ref.masked_var(x, keep, unbiased=False)  # BUG (C6): population variance, not declared
    whitened = (x - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(keep, whitened, zero)


def masked_whiten_always_shifting(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    return ppo_ref.masked_whiten(x, mask)  # BUG (C7): shift_mean is not passed on


def masked_whiten_mean_over_all_positions(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    keep = bool_mask(mask)
    zero = torch.zeros((), dtype=x.dtype)
    x = torch.where(keep, x, zero)
    mean = x.mean()  # BUG (C6): the mean counts the padded positions as zeros
    var = torch.where(keep, x - mean, zero).pow(2).sum() / (keep.sum() - 1)
    whitened = (x - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(keep, whitened, zero)


# --- specs ------------------------------------------------------------------------------------------


def _padded_row(fill: float) -> dict[str, Any]:
    return {"x": torch.tensor([[1.0, 2.0, 3.0, fill]]), "mask": torch.tensor([[1, 1, 1, 0]])}


SPECS: tuple[MutantSpec, ...] = (
    MutantSpec(
        "A1-logprobs-without-shift",
        "A1",
        "token_logprobs",
        "scores the token at position i instead of i + 1 (logits[:, :-1] against input_ids[:, :-1])",
        None,
        token_logprobs_without_shift,
        shows_on=_table,
    ),
    MutantSpec(
        "A2-temperature-ignored",
        "A2",
        "token_logprobs",
        "log_softmax of the raw logits: the temperature argument is never applied",
        "temperature != 1",
        token_logprobs_ignoring_temperature,
        shows_on=lambda: {**_table(), "temperature": 0.5},
        hides_on=lambda: {**_table(), "temperature": 1.0},
    ),
    MutantSpec(
        "A2-temperature-on-target-only",
        "A2",
        "token_logprobs",
        "gather-then-logsumexp with the target logit divided by T but the logsumexp of raw logits",
        "temperature != 1",
        token_logprobs_temperature_on_target_only,
        shows_on=lambda: {**_table(), "temperature": 2.0},
        hides_on=lambda: {**_table(), "temperature": 1.0},
    ),
    MutantSpec(
        "A6-logprobs-in-half-precision",
        "A6",
        "token_logprobs",
        "log_softmax in the logits' dtype, so bfloat16 logits give bfloat16-rounded log-probs",
        "bfloat16 or float16 logits",
        token_logprobs_in_logits_dtype,
        shows_on=lambda: {"logits": _integer_logits(torch.bfloat16), "input_ids": torch.tensor([[7, 6]])},
        hides_on=lambda: {"logits": _integer_logits(torch.float32), "input_ids": torch.tensor([[7, 6]])},
    ),
    MutantSpec(
        "A6-entropy-in-half-precision",
        "A6",
        "entropy",
        "softmax and log-softmax in the logits' dtype (bfloat16 math for bfloat16 logits)",
        "bfloat16 or float16 logits",
        entropy_in_logits_dtype,
        shows_on=lambda: {"logits": _integer_logits(torch.bfloat16)},
        hides_on=lambda: {"logits": _integer_logits(torch.float32)},
    ),
    MutantSpec(
        "E2-masked-mean-multiplies-mask",
        "E2",
        "masked_mean",
        "(x * mask).sum() / mask.sum(): a NaN or inf in a masked-out entry turns the mean into NaN",
        "NaN or inf in masked-out entries",
        masked_mean_by_multiplying,
        shows_on=lambda: _padded_row(NAN),
        hides_on=lambda: _padded_row(7.0),
    ),
    MutantSpec(
        "E2-masked-mean-empty-is-nan",
        "E2",
        "masked_mean",
        "sum / count without a guard: an empty mask (or an empty row with dim=1) gives NaN",
        "an empty mask or an empty slice along dim",
        masked_mean_without_empty_guard,
        shows_on=lambda: {
            "x": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
            "mask": torch.tensor([[1, 0], [0, 0]]),
            "dim": 1,
        },
        hides_on=lambda: {
            "x": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
            "mask": torch.tensor([[1, 0], [1, 1]]),
            "dim": 1,
        },
    ),
    MutantSpec(
        "E1-masked-mean-over-all-positions",
        "E1",
        "masked_mean",
        "where(mask, x, 0).mean(): padding and holes counted in the denominator",
        "a mask with padding or holes",
        masked_mean_over_all_positions,
        shows_on=lambda: _padded_row(7.0),
        hides_on=lambda: {"x": torch.tensor([[1.0, 2.0, 3.0]]), "mask": torch.ones(1, 3)},
    ),
    MutantSpec(
        "C6-whitening-per-sequence",
        "C6",
        "masked_whiten",
        "mean and variance of each row (TRL before PR #153) instead of the whole batch",
        "more than one row",
        masked_whiten_per_row,
        shows_on=lambda: {
            "x": torch.tensor([[1.0, NAN, 3.0], [5.0, 7.0, INF]]),
            "mask": torch.tensor([[1, 0, 1], [1, 1, 0]]),
        },
        hides_on=lambda: _padded_row(9.0),
    ),
    MutantSpec(
        "C6-whitening-biased-variance",
        "C6",
        "masked_whiten",
        "divides by the population (1/n) standard deviation without declaring whiten_variance",
        None,
        masked_whiten_biased,
        shows_on=lambda: _padded_row(9.0),
        convention={"whiten_variance": "biased"},
    ),
    MutantSpec(
        "C7-whitening-ignores-shift-mean",
        "C7",
        "masked_whiten",
        "a wrapper that drops shift_mean, so reward whitening (shift_mean=False) moves the mean to 0",
        "shift_mean=False",
        masked_whiten_always_shifting,
        shows_on=lambda: {**_padded_row(9.0), "shift_mean": False},
        hides_on=lambda: {**_padded_row(9.0), "shift_mean": True},
    ),
    MutantSpec(
        "C6-whitening-mean-over-all-positions",
        "C6",
        "masked_whiten",
        "the whitening mean is where(mask, x, 0).mean(), padded positions counted as zeros",
        "a mask with padding or holes",
        masked_whiten_mean_over_all_positions,
        shows_on=lambda: _padded_row(9.0),
        hides_on=lambda: {"x": torch.tensor([[1.0, 2.0, 3.0], [4.0, 6.0, 5.0]]), "mask": torch.ones(2, 3)},
    ),
)
