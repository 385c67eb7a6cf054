"""Generalized advantage estimation and explained variance (spec GAE-*, EV-1)."""

from __future__ import annotations

import torch
from torch import Tensor

from ppo_ref._validate import (
    check_finite_where,
    check_float,
    check_mask,
    check_real,
    check_rows,
    compute_dtype,
)
from ppo_ref.masked import masked_mean_var

__all__ = ["explained_variance", "gae"]


def gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float,
    lam: float,
    last_values: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Generalized advantage estimates and value targets over the action tokens (GAE-1..4).

    Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", eq. 16, run backwards over the action tokens of each row only:

    .. math:: \delta_t = r_t + \gamma V_{next(t)} - V_t, \qquad
              A_t = \delta_t + \gamma\lambda A_{next(t)}, \qquad R_t = A_t + V_t

    where :math:`next(t)` is the next *action* token of the row: positions with ``mask == 0``
    (tool or observation tokens inside a response, and trailing padding) are skipped, their
    rewards and values never read, and the next value and the running advantage carry across
    them. After a row's last action token, :math:`V_{next}` is ``last_values[b]`` when
    ``last_values`` is given (a response cut at the length limit: bootstrap from the critic) and
    0 otherwise (the response ended with EOS: terminal), and :math:`A_{next} = 0`.

    ===============  ========  ============================================================
    argument         shape     meaning
    ===============  ========  ============================================================
    ``rewards``      (B, T)    per-token rewards (see :func:`token_rewards`)
    ``values``       (B, T)    the critic's V(s_t) for each token position
    ``mask``         (B, T)    1 on action tokens
    ``gamma``        [0, 1]    discount γ
    ``lam``          [0, 1]    GAE λ
    ``last_values``  (B,)      optional bootstrap values V(s_T) after each row's last action
                               token; pass 0 for rows that terminated
    returns          2 x (B,T) ``(advantages, returns)``, 0 off the mask, not whitened
    ===============  ========  ============================================================

    Example (rewards [0, 0, 1], values [0.2, 0.4, 0.7], γ = 1, λ = 0.5, terminal)::

        >>> a, r = gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.2, 0.4, 0.7]]),
        ...            torch.ones(1, 3), gamma=1.0, lam=0.5)
        >>> a
        tensor([[0.4250, 0.4500, 0.3000]])
    """
    keep = check_mask(mask)
    check_float(rewards, "rewards", shape=keep.shape)
    check_float(values, "values", shape=keep.shape)
    check_finite_where(rewards, keep, "rewards")
    check_finite_where(values, keep, "values")
    gamma = check_real(gamma, "gamma", 0.0, 1.0)
    lam = check_real(lam, "lam", 0.0, 1.0)
    if last_values is not None:
        last_values = check_rows(last_values, "last_values", keep.shape[0])
    return _gae(rewards, values, keep, gamma, lam, last_values)


def _gae(
    rewards: Tensor,
    values: Tensor,
    keep: Tensor,
    gamma: float,
    lam: float,
    last_values: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """gae without validation. ``keep`` is the bool mask.

    The TD errors are computed for all positions at once (the "next value" of a position is the
    value at the row's next action token, or the bootstrap after its last one), so only the
    running advantage is left to the backward loop over columns: two element-wise ops per column
    when no row has holes, plus a masked copy with holes. Every number goes through the same
    float operations in the same order as in the plain recursion, so the results are
    bit-identical to it.
    """
    dtype = compute_dtype(rewards, values, *(() if last_values is None else (last_values,)))
    batch, steps = keep.shape
    device = keep.device
    zero = torch.zeros((), dtype=dtype, device=device)
    rewards = torch.where(keep, rewards.to(dtype), zero)
    values = torch.where(keep, values.to(dtype), zero)
    if steps == 0:
        return torch.zeros_like(values), torch.zeros_like(values)
    bootstrap = (
        torch.zeros(batch, dtype=dtype, device=device) if last_values is None else last_values.to(dtype)
    ).unsqueeze(1)
    # A hole is an off-mask column between two action tokens: a row with holes starts two runs.
    run_starts = keep.clone()
    run_starts[:, 1:] &= ~keep[:, :-1]
    has_holes = bool((run_starts.sum(dim=1) > 1).any())
    if has_holes:
        columns = torch.arange(steps, device=device).expand(batch, steps)
        own_index = torch.where(keep, columns, steps)
        first_from_here = own_index.flip(1).cummin(dim=1).values.flip(1)  # first action column >= t
        after_last = torch.full((batch, 1), steps, dtype=first_from_here.dtype, device=device)
        next_index = torch.cat([first_from_here[:, 1:], after_last], dim=1)
        next_values = torch.cat([values, bootstrap], dim=1).gather(1, next_index)
    else:
        following = torch.where(keep[:, 1:], values[:, 1:], bootstrap)
        next_values = torch.cat([following, bootstrap], dim=1)
    deltas = rewards + gamma * next_values - values
    if not has_holes:
        # One run per row: zero TD errors after it keep the running advantage at exactly 0 until
        # its last token; the columns before it are never read.
        deltas = torch.where(keep, deltas, zero)
    raw = _recurrence(deltas, keep if has_holes else None, gamma * lam)
    advantages = torch.where(keep, raw, zero)
    returns = torch.where(keep, advantages + values, zero)
    return advantages, returns


def _recurrence(deltas: Tensor, keep: Tensor | None, decay: float) -> Tensor:
    """``A_t = delta_t + decay * A_next`` backwards over the columns; with ``keep``, off-mask
    columns carry ``A_next`` through unchanged (their own entry of the result is unused)."""
    running = torch.zeros_like(deltas[:, 0])
    columns: list[Tensor] = [running] * deltas.shape[1]
    kept_columns = None if keep is None else keep.t().unbind(0)
    for t, delta in reversed(list(enumerate(deltas.t().unbind(0)))):
        advantage = delta + decay * running
        running = advantage if kept_columns is None else torch.where(kept_columns[t], advantage, running)
        columns[t] = advantage
    return torch.stack(columns, dim=1)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    r"""How much of the variance of the value targets the critic explains (spec EV-1).

    .. math:: \mathrm{EV} = 1 - \frac{\operatorname{var}_m(R - V)}{\operatorname{var}_m(R)}

    over the masked-in entries of the (B, T) ``values`` and ``returns`` (unbiased variances).
    1 is a perfect critic, 0 is no better than a constant, negative is worse. Returns a 0-dim
    tensor, NaN when :math:`\operatorname{var}_m(R) = 0` (undefined). Fewer than 2 masked-in
    entries is a ``ValueError``.

    Example::

        >>> explained_variance(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1.0, 2.0, 4.0]]),
        ...                    torch.ones(1, 3))
        tensor(0.8571)
    """
    keep = check_mask(mask)
    check_float(values, "values", shape=keep.shape)
    check_float(returns, "returns", shape=keep.shape)
    check_finite_where(values, keep, "values")
    check_finite_where(returns, keep, "returns")
    dtype = compute_dtype(values, returns)
    target = returns.to(dtype)
    _, var_returns, _ = masked_mean_var(target, keep, unbiased=True)
    _, var_error, _ = masked_mean_var(target - values.to(dtype), keep, unbiased=True)
    kept_returns = target.detach()[keep]
    if bool(kept_returns.max() == kept_returns.min()):
        # Var[R] is exactly 0 (a rounded variance of equal values may not be): undefined.
        return torch.full((), float("nan"), dtype=dtype, device=keep.device)
    return 1.0 - var_error / var_returns
