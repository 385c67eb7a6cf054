"""Mutants of loss aggregation (AGG-1..3): the Dr. GRPO normaliser and the whole-batch counts of a
micro-batch, as trainers got them wrong."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import ppo_ref
from tests.mutants.base import MutantSpec, bool_mask


def _masked_sum(per_token: Tensor, mask: Tensor) -> Tensor:
    keep = bool_mask(mask)
    return torch.where(keep, per_token, torch.zeros((), dtype=per_token.dtype)).sum()


# --- AGG-1: the seq-mean-token-sum-norm mode ---------------------------------------------------------


def aggregate_norm_by_padded_width(
    per_token: Tensor,
    mask: Tensor,
    loss_agg: str = "token-mean",
    *,
    norm_constant: float | None = None,
    token_count: int | Tensor | None = None,
    row_count: int | Tensor | None = None,
) -> Tensor:
    if loss_agg != "seq-mean-token-sum-norm":
        return ppo_ref.aggregate_loss(
            per_token,
            mask,
            loss_agg,
            norm_constant=norm_constant,
            token_count=token_count,
            row_count=row_count,
        )
    ppo_ref.aggregate_loss(per_token, mask, loss_agg, norm_constant=norm_constant, row_count=row_count)
    rows = row_count if row_count is not None else max(mask.shape[0], 1)
    # BUG (verl #3741): C = loss_mask.shape[-1], the padded width of this micro-batch, whatever
    # norm_constant says (verl's default loss_scale_factor=None)
    return _masked_sum(per_token, mask) / (rows * mask.shape[-1])


def aggregate_norm_over_nonempty_rows(
    per_token: Tensor,
    mask: Tensor,
    loss_agg: str = "token-mean",
    *,
    norm_constant: float | None = None,
    token_count: int | Tensor | None = None,
    row_count: int | Tensor | None = None,
) -> Tensor:
    if loss_agg != "seq-mean-token-sum-norm" or row_count is not None:
        return ppo_ref.aggregate_loss(
            per_token,
            mask,
            loss_agg,
            norm_constant=norm_constant,
            token_count=token_count,
            row_count=row_count,
        )
    ppo_ref.aggregate_loss(per_token, mask, loss_agg, norm_constant=norm_constant)
    assert norm_constant is not None
    rows = bool_mask(mask).any(dim=1).sum().clamp(min=1)
    # BUG (AGG-1): B counts only rows with an action token (the seq-mean modes' R), so an empty
    # (filtered, overlong-masked) row no longer lowers the loss as Dr. GRPO's B * C does
    return _masked_sum(per_token, mask) / (rows * norm_constant)


# --- AGG-2: whole-batch counts ----------------------------------------------------------------------


def aggregate_token_count_ignored(
    per_token: Tensor,
    mask: Tensor,
    loss_agg: str = "token-mean",
    *,
    norm_constant: float | None = None,
    token_count: int | Tensor | None = None,
    row_count: int | Tensor | None = None,
) -> Tensor:
    ppo_ref.aggregate_loss(
        per_token, mask, loss_agg, norm_constant=norm_constant, token_count=token_count, row_count=row_count
    )
    # BUG (verl #7321): without batch_num_tokens agg_loss falls back to this micro-batch's own token
    # count, so the sum over micro-batches depends on how the batch was split
    return ppo_ref.aggregate_loss(per_token, mask, loss_agg, norm_constant=norm_constant, row_count=row_count)


def aggregate_row_count_ignored(
    per_token: Tensor,
    mask: Tensor,
    loss_agg: str = "token-mean",
    *,
    norm_constant: float | None = None,
    token_count: int | Tensor | None = None,
    row_count: int | Tensor | None = None,
) -> Tensor:
    ppo_ref.aggregate_loss(
        per_token, mask, loss_agg, norm_constant=norm_constant, token_count=token_count, row_count=row_count
    )
    if loss_agg != "seq-mean-token-sum-norm":
        return ppo_ref.aggregate_loss(
            per_token,
            mask,
            loss_agg,
            norm_constant=norm_constant,
            token_count=token_count,
            row_count=row_count,
        )
    # BUG (TRL PR #3138's dr_grpo, verl #3741): B = per_token_loss.size(0), the rows of this
    # micro-batch, so the loss of each micro-batch is scaled up by the number of micro-batches
    return ppo_ref.aggregate_loss(per_token, mask, loss_agg, norm_constant=norm_constant)


def aggregate_divided_twice(
    per_token: Tensor,
    mask: Tensor,
    loss_agg: str = "token-mean",
    *,
    norm_constant: float | None = None,
    token_count: int | Tensor | None = None,
    row_count: int | Tensor | None = None,
) -> Tensor:
    loss = ppo_ref.aggregate_loss(
        per_token, mask, loss_agg, norm_constant=norm_constant, token_count=token_count, row_count=row_count
    )
    if token_count is None:
        return loss
    local = int(bool_mask(mask).sum())
    micro_batches = float(token_count) / max(local, 1)
    # BUG (ms-swift #10117): the loss, already normalised by the whole batch's token count, is
    # divided by the number of gradient-accumulation steps a second time (gradient g / G)
    return loss / micro_batches


# --- AGG-3: the keywords through the losses ---------------------------------------------------------


def value_loss_counts_dropped(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip_eps: float | None = None,
    loss_agg: str = "token-mean",
    *,
    norm_constant: float | None = None,
    token_count: int | Tensor | None = None,
    row_count: int | Tensor | None = None,
) -> Tensor:
    ppo_ref.value_loss(
        values,
        old_values,
        returns,
        mask,
        clip_eps,
        loss_agg,
        norm_constant=norm_constant,
        token_count=token_count,
        row_count=row_count,
    )
    # BUG (AGG-3): the critic loss drops the whole-batch counts (verl's critic before the
    # global-token fix, verl #7321): a per-micro-batch mean while the policy loss is a whole-batch one
    return ppo_ref.value_loss(
        values, old_values, returns, mask, clip_eps, loss_agg, norm_constant=norm_constant
    )


def policy_loss_token_count_dropped(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str = "token-mean",
    *,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    norm_constant: float | None = None,
    token_count: int | Tensor | None = None,
    row_count: int | Tensor | None = None,
) -> ppo_ref.PolicyLossResult:
    ppo_ref.policy_loss(
        logp.detach(),
        old_logp,
        advantages,
        mask,
        clip_eps,
        loss_agg,
        clip_eps_high=clip_eps_high,
        dual_clip=dual_clip,
        norm_constant=norm_constant,
        token_count=token_count,
        row_count=row_count,
    )
    # BUG (TRL PR #6024): the policy loss normalised by this micro-batch's own tokens
    # (num_items_in_batch not passed through), 0.5x or 4x the intended gradient
    return ppo_ref.policy_loss(
        logp,
        old_logp,
        advantages,
        mask,
        clip_eps,
        loss_agg,
        clip_eps_high=clip_eps_high,
        dual_clip=dual_clip,
        norm_constant=norm_constant,
        row_count=row_count,
    )


# --- inputs -----------------------------------------------------------------------------------------


def per_token_inputs(
    rows: list[list[float]], mask: list[list[int]], loss_agg: str = "token-mean", **kw: Any
) -> dict[str, Any]:
    """aggregate_loss inputs: a float64 per-token loss (differentiable) and its mask."""
    return {
        "per_token": torch.tensor(rows, dtype=torch.float64).requires_grad_(),
        "mask": torch.tensor(mask),
        "loss_agg": loss_agg,
        **kw,
    }


def value_inputs(loss_agg: str = "token-mean", **kw: Any) -> dict[str, Any]:
    """value_loss inputs: two rows of unequal length, one micro-batch of a larger batch."""
    values = torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.0, 0.0]], dtype=torch.float64).requires_grad_()
    return {
        "values": values,
        "old_values": torch.tensor([[1.1, 1.5, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64),
        "returns": torch.tensor([[2.0, 1.0, 0.0], [1.5, 0.0, 0.0]], dtype=torch.float64),
        "mask": torch.tensor([[1, 1, 0], [1, 0, 0]]),
        "clip_eps": 0.2,
        "loss_agg": loss_agg,
        **kw,
    }


def policy_inputs(loss_agg: str = "token-mean", **kw: Any) -> dict[str, Any]:
    """policy_loss inputs (ratios 1.3, 0.7, 1.1, old_logp -1), one micro-batch of a larger batch."""
    ratio = torch.tensor([[1.3, 0.7, 1.0], [1.1, 1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    old_logp = torch.full_like(ratio, -1.0)
    return {
        "logp": (old_logp + ratio.log()).requires_grad_(),
        "old_logp": old_logp,
        "advantages": torch.tensor([[1.0, -2.0, 0.0], [0.5, 0.0, 0.0]], dtype=torch.float64),
        "mask": mask,
        "clip_eps": 0.2,
        "loss_agg": loss_agg,
        **kw,
    }


LOSS = [[1.0, 2.0, 9.0], [4.0, 0.0, 0.0]]
MASK = [[1, 1, 0], [1, 0, 0]]
"""Three action tokens in two rows of a padded width of 3: one micro-batch of a larger batch."""
NORM = "seq-mean-token-sum-norm"

SPECS: tuple[MutantSpec, ...] = (
    MutantSpec(
        "verl3741-norm-by-padded-width",
        "verl#3741",
        "aggregate_loss",
        "seq-mean-token-sum-norm divides by B * mask.shape[-1] (the padded width), not B * norm_constant",
        "seq-mean-token-sum-norm with norm_constant other than the padded width",
        aggregate_norm_by_padded_width,
        shows_on=lambda: per_token_inputs(LOSS, MASK, NORM, norm_constant=8.0),
        hides_on=lambda: per_token_inputs(LOSS, MASK, NORM, norm_constant=3.0),
        clause="AGG-1",
    ),
    MutantSpec(
        "AGG1-norm-over-nonempty-rows",
        "AGG-1",
        "aggregate_loss",
        "seq-mean-token-sum-norm's B counts only rows with an action token",
        "seq-mean-token-sum-norm with a row without action tokens",
        aggregate_norm_over_nonempty_rows,
        shows_on=lambda: per_token_inputs(LOSS, [[1, 1, 0], [0, 0, 0]], NORM, norm_constant=8.0),
        hides_on=lambda: per_token_inputs(LOSS, MASK, NORM, norm_constant=8.0),
        clause="AGG-1",
    ),
    MutantSpec(
        "verl7321-token-count-ignored",
        "verl#7321",
        "aggregate_loss",
        "token-mean divides by this micro-batch's token count whatever token_count says",
        "token_count larger than the call's own count (a micro-batch of a larger batch)",
        aggregate_token_count_ignored,
        shows_on=lambda: per_token_inputs(LOSS, MASK, token_count=10),
        hides_on=lambda: per_token_inputs(LOSS, MASK, token_count=3),
        clause="AGG-2",
    ),
    MutantSpec(
        "verl3741-norm-row-count-ignored",
        "verl#3741",
        "aggregate_loss",
        "seq-mean-token-sum-norm's B is the micro-batch's rows (size(0)) whatever row_count says",
        "seq-mean-token-sum-norm with row_count larger than the rows passed",
        aggregate_row_count_ignored,
        shows_on=lambda: per_token_inputs(LOSS, MASK, NORM, norm_constant=8.0, row_count=6),
        hides_on=lambda: per_token_inputs(LOSS, MASK, NORM, norm_constant=8.0, row_count=2),
        clause="AGG-2",
    ),
    MutantSpec(
        "ms-swift10117-divided-twice",
        "ms-swift#10117",
        "aggregate_loss",
        "a loss normalised by the whole batch's token_count is divided again by the micro-batch count",
        "token_count larger than the call's own count",
        aggregate_divided_twice,
        shows_on=lambda: per_token_inputs(LOSS, MASK, token_count=6),
        hides_on=lambda: per_token_inputs(LOSS, MASK, token_count=3),
        clause="AGG-2",
    ),
    MutantSpec(
        "AGG3-value-loss-drops-counts",
        "AGG-3",
        "value_loss",
        "value_loss ignores token_count and row_count: a per-micro-batch mean",
        "token_count or row_count larger than the call's own count",
        value_loss_counts_dropped,
        shows_on=lambda: value_inputs(token_count=6),
        hides_on=lambda: value_inputs(token_count=3),
        clause="AGG-3",
    ),
    MutantSpec(
        "TRL-PR6024-policy-loss-drops-token-count",
        "TRL-PR#6024",
        "policy_loss",
        "policy_loss ignores token_count: normalised by the micro-batch's own action tokens",
        "token_count larger than the call's own count",
        policy_loss_token_count_dropped,
        shows_on=lambda: policy_inputs(token_count=6),
        hides_on=lambda: policy_inputs(token_count=3),
        clause="AGG-3",
    ),
)
