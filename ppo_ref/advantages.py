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
from ppo_ref.masked import _mean_and_var

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
    """gae without validation. ``keep`` is the bool mask."""
    dtype = compute_dtype(rewards, values, *(() if last_values is None else (last_values,)))
    batch, steps = keep.shape
    zero = torch.zeros((), dtype=dtype, device=keep.device)
    rewards = torch.where(keep, rewards.to(dtype), zero)
    values = torch.where(keep, values.to(dtype), zero)
    next_value = (
        torch.zeros(batch, dtype=dtype, device=keep.device) if last_values is None else last_values.to(dtype)
    )
    running = torch.zeros(batch, dtype=dtype, device=keep.device)
    columns: list[Tensor] = [zero.expand(batch)] * steps
    for t in range(steps - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * running
        here = keep[:, t]
        running = torch.where(here, advantage, running)
        next_value = torch.where(here, values[:, t], next_value)
        columns[t] = torch.where(here, advantage, zero)
    advantages = torch.stack(columns, dim=1) if steps else torch.zeros_like(values)
    returns = torch.where(keep, advantages + values, zero)
    return advantages, returns


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
    _, var_returns = _mean_and_var(target, keep, unbiased=True)
    _, var_error = _mean_and_var(target - values.to(dtype), keep, unbiased=True)
    kept_returns = target.detach()[keep]
    if bool(kept_returns.max() == kept_returns.min()):
        # Var[R] is exactly 0 (a rounded variance of equal values may not be): undefined.
        return torch.full((), float("nan"), dtype=dtype, device=keep.device)
    return 1.0 - var_error / var_returns
