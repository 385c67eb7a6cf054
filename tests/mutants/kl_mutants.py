"""Mutants of the KL estimators and the per-token rewards (KL-*, RWD-*)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

import ppo_ref
from ppo_ref.kl import last_action_index
from tests.mutants.base import MutantSpec, bool_mask, work_dtype

NAN = math.nan
KL_CLAMP = 10.0
SCORE_CLIP = 10.0


def _estimate(log_ratio: Tensor, estimator: str) -> Tensor:
    """Per-token k1 / k2 / k3 of KL(pi || ref) from log_ratio = logp - ref_logp (correct formulas)."""
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.pow(2)
    return torch.expm1(-log_ratio) + log_ratio


def _log_ratio(logp: Tensor, ref_logp: Tensor, keep: Tensor | None) -> Tensor:
    dtype = work_dtype(logp, ref_logp)
    log_ratio = logp.to(dtype) - ref_logp.to(dtype)
    return log_ratio if keep is None else torch.where(keep, log_ratio, torch.zeros((), dtype=dtype))


def _finish(kl: Tensor, keep: Tensor | None) -> Tensor:
    return kl if keep is None else torch.where(keep, kl, torch.zeros((), dtype=kl.dtype))


# --- kl_penalty -------------------------------------------------------------------------------------


def kl_penalty_arguments_swapped(
    logp: Tensor, ref_logp: Tensor, estimator: str = "k1", mask: Tensor | None = None
) -> Tensor:
    # BUG (D1): log-ratio taken as ref_logp - logp (k1 changes sign, k3 measures the other direction)
    return ppo_ref.kl_penalty(ref_logp, logp, estimator, mask=mask)


def kl_penalty_k3_inverted_ratio(
    logp: Tensor, ref_logp: Tensor, estimator: str = "k1", mask: Tensor | None = None
) -> Tensor:
    keep = None if mask is None else bool_mask(mask)
    log_ratio = _log_ratio(logp, ref_logp, keep)
    if estimator == "k3":
        kl = torch.expm1(log_ratio) - log_ratio  # BUG (D1): trlx's k3 with r = pi/ref instead of ref/pi
    else:
        kl = _estimate(log_ratio, estimator)
    return _finish(kl, keep)


def kl_penalty_if_chain(
    logp: Tensor, ref_logp: Tensor, estimator: str = "k1", mask: Tensor | None = None
) -> Tensor:
    keep = None if mask is None else bool_mask(mask)
    log_ratio = _log_ratio(logp, ref_logp, keep)
    if estimator == "k1":
        kl = log_ratio
    if estimator == "k2":  # BUG (D2): `if` instead of `elif`, so k1 falls through to the k3 branch
        kl = 0.5 * log_ratio.pow(2)
    else:
        kl = torch.expm1(-log_ratio) + log_ratio
    return _finish(kl, keep)


def kl_penalty_k3_clamped(
    logp: Tensor, ref_logp: Tensor, estimator: str = "k1", mask: Tensor | None = None
) -> Tensor:
    keep = None if mask is None else bool_mask(mask)
    kl = _estimate(_log_ratio(logp, ref_logp, keep), estimator)
    if estimator == "k3":
        kl = kl.clamp(-KL_CLAMP, KL_CLAMP)  # BUG (D2): verl-style low_var_kl clamp, not declared
    return _finish(kl, keep)


def kl_penalty_ignoring_mask(
    logp: Tensor, ref_logp: Tensor, estimator: str = "k1", mask: Tensor | None = None
) -> Tensor:
    # BUG (D5): the mask is accepted but the KL is computed and returned on every position
    return _estimate(_log_ratio(logp, ref_logp, None), estimator)


# --- token_rewards ----------------------------------------------------------------------------------


def _kl_rewards(logp: Tensor, ref_logp: Tensor, keep: Tensor, kl_coef: float, estimator: str) -> Tensor:
    kl = _estimate(_log_ratio(logp, ref_logp, keep), estimator)
    return torch.where(keep, -kl_coef * kl, torch.zeros((), dtype=kl.dtype))


def _add_scores(rewards: Tensor, scores: Tensor, rows: Tensor, columns: Tensor) -> Tensor:
    dtype = torch.promote_types(rewards.dtype, scores.dtype)
    return rewards.to(dtype).index_put((rows, columns), scores.to(dtype)[rows], accumulate=True)


def token_rewards_score_after_eos(
    scores: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, kl_coef: float, estimator: str = "k1"
) -> Tensor:
    keep = bool_mask(mask)
    rewards = _kl_rewards(logp, ref_logp, keep, kl_coef, estimator)
    last = last_action_index(keep)
    # BUG (D6): TRL/N+ sequence_lengths_p1, the score lands on the first pad after EOS when there is one
    end = torch.where(last + 1 < keep.shape[1], last + 1, last)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    return _add_scores(rewards, scores, rows, end[rows])


def token_rewards_score_on_last_column(
    scores: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, kl_coef: float, estimator: str = "k1"
) -> Tensor:
    keep = bool_mask(mask)
    rewards = _kl_rewards(logp, ref_logp, keep, kl_coef, estimator)
    if keep.shape[1] == 0:
        return rewards
    rows = torch.arange(keep.shape[0])
    # BUG (D6): lm-human-preferences rewards[:, -1] += scores, whatever the response length
    return _add_scores(rewards, scores, rows, torch.full_like(rows, keep.shape[1] - 1))


def token_rewards_argmax_end(
    scores: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, kl_coef: float, estimator: str = "k1"
) -> Tensor:
    keep = bool_mask(mask)
    rewards = _kl_rewards(logp, ref_logp, keep, kl_coef, estimator)
    steps = keep.shape[1]
    if steps == 0:
        return rewards
    # BUG (D6b): argmax of an all-zero row is 0, so an empty response gets its score at column T - 1
    end = steps - 1 - keep.long().fliplr().argmax(dim=1)
    return _add_scores(rewards, scores, torch.arange(keep.shape[0]), end)


def token_rewards_score_at_token_count(
    scores: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, kl_coef: float, estimator: str = "k1"
) -> Tensor:
    keep = bool_mask(mask)
    rewards = _kl_rewards(logp, ref_logp, keep, kl_coef, estimator)
    valid_length = keep.sum(dim=1)
    rows = torch.nonzero(valid_length > 0).squeeze(-1)
    # BUG (D6): valid_response_length - 1 is the last action token only when the mask has no holes
    return _add_scores(rewards, scores, rows, (valid_length - 1)[rows])


def token_rewards_score_clipped(
    scores: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, kl_coef: float, estimator: str = "k1"
) -> Tensor:
    # BUG (G6): OpenRLHF compute_reward's default reward_clip_range, scores clipped to [-10, 10]
    # without any declared convention
    clipped = scores.clamp(-SCORE_CLIP, SCORE_CLIP)
    return ppo_ref.token_rewards(clipped, logp, ref_logp, mask, kl_coef, estimator)


def token_rewards_default_estimator(
    scores: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, kl_coef: float, estimator: str = "k1"
) -> Tensor:
    # BUG (D2): the configured estimator is not passed on, so the reward always uses k1
    return ppo_ref.token_rewards(scores, logp, ref_logp, mask, kl_coef)


def token_rewards_kl_mask_shifted(
    scores: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, kl_coef: float, estimator: str = "k1"
) -> Tensor:
    keep = bool_mask(mask)
    # BUG (A1): trlx #582, the KL mask is attention_mask[:, :-1], the action mask shifted right by one
    kl_mask = torch.cat([torch.ones_like(keep[:, :1]), keep[:, :-1]], dim=1)
    kl = _estimate(logp.to(work_dtype(logp, ref_logp)) - ref_logp, estimator)
    rewards = torch.where(kl_mask, -kl_coef * kl, torch.zeros((), dtype=kl.dtype))
    last = last_action_index(keep)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    return _add_scores(rewards, scores, rows, last[rows])


# --- specs ------------------------------------------------------------------------------------------


def _two_token_kl(estimator: str) -> dict[str, Any]:
    """The KL running example: pi = [0.9, 0.1], ref = [0.5, 0.5], the two tokens as two positions."""
    return {
        "logp": torch.tensor([[math.log(0.9), math.log(0.1)]]),
        "ref_logp": torch.tensor([[math.log(0.5), math.log(0.5)]]),
        "estimator": estimator,
    }


def _rewards(mask: list[list[int]], estimator: str = "k1", fill: float = 0.3) -> dict[str, Any]:
    """Two rows with the given mask; masked-out log-probs hold ``fill``."""
    keep = torch.tensor(mask, dtype=torch.bool)
    logp = torch.tensor([[-0.5, -1.0, -0.2, -2.0], [-0.1, -0.7, -1.5, -0.4]])
    ref_logp = torch.tensor([[-0.7, -0.4, -0.9, -1.0], [-0.6, -0.3, -1.0, -0.2]])
    return {
        "scores": torch.tensor([1.0, -2.0]),
        "logp": torch.where(keep, logp, torch.tensor(fill)),
        "ref_logp": torch.where(keep, ref_logp, torch.tensor(-fill)),
        "mask": keep.long(),
        "kl_coef": 0.1,
        "estimator": estimator,
    }


FULL = [[1, 1, 1, 1], [1, 1, 1, 1]]
PADDED = [[1, 1, 0, 0], [1, 1, 1, 0]]
HOLES = [[1, 0, 1, 1], [1, 1, 0, 1]]

SPECS: tuple[MutantSpec, ...] = (
    MutantSpec(
        "D1-kl-arguments-swapped",
        "D1",
        "kl_penalty",
        "kl_penalty(ref_logp, logp): k1 with the wrong sign, k3 in the wrong direction",
        "estimator k1 or k3 (k2 is symmetric)",
        kl_penalty_arguments_swapped,
        shows_on=lambda: _two_token_kl("k1"),
        hides_on=lambda: _two_token_kl("k2"),
    ),
    MutantSpec(
        "D1-k3-inverted-ratio",
        "D1",
        "kl_penalty",
        "k3 = exp(logp - ref) - 1 - (logp - ref) (trlx): expectation chi^2 - KL instead of KL",
        "estimator k3",
        kl_penalty_k3_inverted_ratio,
        shows_on=lambda: _two_token_kl("k3"),
        hides_on=lambda: _two_token_kl("k1"),
    ),
    MutantSpec(
        "D2-kl-estimator-if-chain",
        "D2",
        "kl_penalty",
        "if k1 ... if k2 ... else k3: the k1 estimate is overwritten by k3 (AReaL PR #408)",
        "estimator k1",
        kl_penalty_if_chain,
        shows_on=lambda: _two_token_kl("k1"),
        hides_on=lambda: _two_token_kl("k2"),
    ),
    MutantSpec(
        "D2-k3-clamped-undeclared",
        "D2",
        "kl_penalty",
        "k3 clamped to [-10, 10] (verl low_var_kl) without declaring kl_clamp",
        "estimator k3 with logp - ref_logp below about -2.53 (k3 > 10)",
        kl_penalty_k3_clamped,
        shows_on=lambda: {
            "logp": torch.tensor([[-3.5, -0.2]]),
            "ref_logp": torch.tensor([[-0.5, -0.4]]),
            "estimator": "k3",
        },
        hides_on=lambda: {**_two_token_kl("k3")},
        convention={"kl_clamp": {"k3": 10.0}},
    ),
    MutantSpec(
        "D5-kl-ignores-mask",
        "D5",
        "kl_penalty",
        "the mask is accepted but the KL is returned on every position, padding included",
        "a mask with padding or holes",
        kl_penalty_ignoring_mask,
        shows_on=lambda: {
            k: v for k, v in _rewards(PADDED).items() if k in ("logp", "ref_logp", "mask", "estimator")
        },
        hides_on=lambda: {
            k: v for k, v in _rewards(FULL).items() if k in ("logp", "ref_logp", "mask", "estimator")
        },
    ),
    MutantSpec(
        "D6-score-after-eos",
        "D6",
        "token_rewards",
        "the score on the first pad after EOS (TRL/N+ sequence_lengths_p1), undeclared",
        "rows shorter than T (padding after the last action token)",
        token_rewards_score_after_eos,
        shows_on=lambda: _rewards(PADDED),
        hides_on=lambda: _rewards(FULL),
        convention={"score_placement": "after-last-action-token"},
    ),
    MutantSpec(
        "D6-score-on-last-column",
        "D6",
        "token_rewards",
        "rewards[:, -1] += scores (lm-human-preferences, fixed-length responses)",
        "rows shorter than T (padding) or empty rows",
        token_rewards_score_on_last_column,
        shows_on=lambda: _rewards(PADDED),
        hides_on=lambda: _rewards(HOLES),
    ),
    MutantSpec(
        "D6b-empty-row-score-at-index-minus-one",
        "D6b",
        "token_rewards",
        "end = T - 1 - mask.fliplr().argmax(1): an empty row puts its score on its last slot",
        "rows without action tokens",
        token_rewards_argmax_end,
        shows_on=lambda: _rewards([[1, 1, 0, 0], [0, 0, 0, 0]]),
        hides_on=lambda: _rewards([[1, 1, 0, 0], [1, 0, 1, 0]]),
    ),
    MutantSpec(
        "D6-score-at-token-count",
        "D6",
        "token_rewards",
        "the score at index mask.sum(1) - 1 (verl valid_response_length - 1), wrong with holes",
        "masks with holes",
        token_rewards_score_at_token_count,
        shows_on=lambda: _rewards(HOLES),
        hides_on=lambda: _rewards(PADDED),
    ),
    MutantSpec(
        "G6-score-clipped-undeclared",
        "G6",
        "token_rewards",
        "scores clipped to [-10, 10] before they are placed (OpenRLHF compute_reward default)",
        "|score| > 10",
        token_rewards_score_clipped,
        shows_on=lambda: {**_rewards(PADDED), "scores": torch.tensor([50.0, -2.0])},
        hides_on=lambda: _rewards(PADDED),
        convention={"score_clip": 10.0},
    ),
    MutantSpec(
        "D2-reward-ignores-estimator",
        "D2",
        "token_rewards",
        "the estimator argument is not passed on: the reward's KL is always k1",
        "estimator k2 or k3",
        token_rewards_default_estimator,
        shows_on=lambda: _rewards(PADDED, "k3"),
        hides_on=lambda: _rewards(PADDED, "k1"),
    ),
    MutantSpec(
        "A1-kl-mask-shifted",
        "A1",
        "token_rewards",
        "the KL penalty uses the action mask shifted right by one (trlx attention_mask[:, :-1])",
        "rows shorter than T or holes (the slot after an action token is masked out)",
        token_rewards_kl_mask_shifted,
        shows_on=lambda: _rewards(PADDED, fill=NAN),
        hides_on=lambda: _rewards(FULL, fill=NAN),
    ),
)
