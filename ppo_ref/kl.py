"""KL estimators, per-token rewards and KL-coefficient controllers (spec KL-*, RWD-*, KLC-*)."""

from __future__ import annotations

from typing import Literal, get_args

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

__all__ = [
    "KL_ESTIMATORS",
    "AdaptiveKLController",
    "FixedKLController",
    "KLEstimator",
    "kl_penalty",
    "last_action_index",
    "token_rewards",
]

KLEstimator = Literal["k1", "k2", "k3"]
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)


def _kl_from_log_ratio(log_ratio: Tensor, estimator: str) -> Tensor:
    """Per-token estimate from log_ratio = logp - ref_logp (no validation)."""
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio * log_ratio
    # k3 with r = pi_ref / pi: r - 1 - log r, where log r = -log_ratio. expm1 keeps precision near 0.
    return torch.expm1(-log_ratio) + log_ratio


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str = "k1", mask: Tensor | None = None) -> Tensor:
    r"""Per-token estimate of KL(π ‖ π_ref) from tokens sampled from π (spec KL-1..4).

    With :math:`\delta = \log\pi(a) - \log\pi_{ref}(a)` for the sampled token :math:`a \sim \pi`:

    =========  ===================================  ===========================================
    estimator  per-token value                      properties
    =========  ===================================  ===========================================
    ``k1``     :math:`\delta`                       unbiased; may be negative per token
    ``k2``     :math:`\tfrac12 \delta^2`            biased, >= 0 (exact to second order)
    ``k3``     :math:`e^{-\delta} - 1 + \delta`     unbiased, >= 0 (Schulman, "Approximating
                                                    KL divergence", 2020)
    =========  ===================================  ===========================================

    ``logp`` and ``ref_logp`` are (B, T) log-probs of the sampled tokens under the policy and the
    reference. Sign convention: positive ``k1`` means the policy gives the token more probability
    than the reference does. Without ``mask`` every entry must be finite; with a (B, T) ``mask``
    the masked-out entries are ignored and returned as 0. Returns (B, T).

    Example (π = [0.9, 0.1], π_ref = [0.5, 0.5])::

        >>> kl_penalty(torch.tensor([[0.9, 0.1]]).log(), torch.tensor([[0.5, 0.5]]).log())
        tensor([[ 0.5878, -1.6094]])
    """
    check_float(logp, "logp", ndim=2)
    check_float(ref_logp, "ref_logp", shape=logp.shape, like="logp")
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"estimator: expected one of {KL_ESTIMATORS}, got {estimator!r}")
    keep = None if mask is None else check_mask(mask)
    if keep is not None and keep.shape != logp.shape:
        raise ValueError(f"mask: expected shape {tuple(logp.shape)} (same as logp), got {tuple(keep.shape)}")
    check_finite_where(logp, keep, "logp")
    check_finite_where(ref_logp, keep, "ref_logp")
    dtype = compute_dtype(logp, ref_logp)
    log_ratio = logp.to(dtype) - ref_logp.to(dtype)
    if keep is None:
        return _kl_from_log_ratio(log_ratio, estimator)
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    return torch.where(keep, _kl_from_log_ratio(torch.where(keep, log_ratio, zero), estimator), zero)


def last_action_index(mask: Tensor) -> Tensor:
    """Column of each row's last action token, -1 for a row without one. ``mask`` is bool (B, T)."""
    columns = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return (
        torch.where(mask, columns, -1).amax(dim=1)
        if mask.shape[1]
        else torch.full((mask.shape[0],), -1, dtype=torch.long, device=mask.device)
    )


def token_rewards(
    scores: Tensor,
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    kl_coef: float,
    estimator: str = "k1",
) -> Tensor:
    r"""Per-token RLHF rewards: a KL penalty on every action token, the score on the last (RWD-1..3).

    .. math:: r_{b,t} = -\beta\,\mathrm{kl}_{b,t}\,m_{b,t}
              + s_b\,[\,t = \text{last action token of row } b\,]

    ===============  =======  ===============================================================
    argument         shape    meaning
    ===============  =======  ===============================================================
    ``scores``       (B,)     the reward model's (or verifier's) score of each response
    ``logp``         (B, T)   log-probs of the sampled tokens under the rollout policy
    ``ref_logp``     (B, T)   the same tokens under the frozen reference
    ``mask``         (B, T)   1 on action tokens (the EOS that ends a response is one)
    ``kl_coef``      >= 0     β, the KL coefficient
    ``estimator``    str      ``k1`` (default), ``k2`` or ``k3``: see :func:`kl_penalty`
    returns          (B, T)   0 off the mask; a row with no action token is all 0
    ===============  =======  ===============================================================

    Example (β = 0.1, score 1.0, mask [1, 1, 0], k1 = [0.2, -0.1])::

        >>> token_rewards(torch.tensor([1.0]), torch.tensor([[0.2, -0.1, 7.0]]),
        ...               torch.zeros(1, 3), torch.tensor([[1, 1, 0]]), kl_coef=0.1)
        tensor([[-0.0200,  1.0100,  0.0000]])
    """
    keep = check_mask(mask)
    check_float(logp, "logp", shape=keep.shape)
    scores = check_rows(scores, "scores", keep.shape[0])
    beta = check_real(kl_coef, "kl_coef", low=0.0)
    kl = kl_penalty(logp, ref_logp, estimator, mask=keep)
    dtype = compute_dtype(kl, scores)
    rewards = torch.where(keep, -beta * kl.to(dtype), torch.zeros((), dtype=dtype, device=kl.device))
    last = last_action_index(keep)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    return rewards.index_put((rows, last[rows]), scores.to(dtype)[rows], accumulate=True)


class FixedKLController:
    """A constant KL coefficient, with the same interface as :class:`AdaptiveKLController`."""

    def __init__(self, kl_coef: float) -> None:
        self.value = check_real(kl_coef, "kl_coef", low=0.0)

    def update(self, kl: float, n_steps: int) -> float:
        """Leave the coefficient unchanged (arguments are validated all the same); return it."""
        check_real(kl, "kl")
        if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
            raise ValueError(f"n_steps: expected a positive int, got {n_steps!r}")
        return self.value


class AdaptiveKLController(FixedKLController):
    r"""The adaptive KL coefficient of Ziegler et al. 2019, "Fine-Tuning Language Models from
    Human Preferences", section 2.2 (spec KLC-1).

    .. math:: e = \operatorname{clip}\!\left(\frac{\mathrm{KL}}{\mathrm{target}} - 1,
              -0.2, 0.2\right), \qquad \beta \leftarrow \beta\,\Big(1 + e\,
              \frac{n\_steps}{\mathrm{horizon}}\Big)

    ``kl`` is the mean over the rollout batch of each sequence's *summed* per-token KL to the
    reference (not a token mean, not the PPO approx-KL to the old policy), and ``n_steps`` the
    number of sequences in that batch.

    Example::

        >>> c = AdaptiveKLController(0.1, target=6.0, horizon=10000)
        >>> round(c.update(12.0, n_steps=512), 6)
        0.101024
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float) -> None:
        super().__init__(check_real(init_kl_coef, "init_kl_coef", low=0.0))
        self.target = check_real(target, "target", low=0.0, low_open=True)
        self.horizon = check_real(horizon, "horizon", low=0.0, low_open=True)

    def update(self, kl: float, n_steps: int) -> float:
        """Apply one update from a rollout batch of ``n_steps`` sequences; return the new value."""
        super().update(kl, n_steps)
        error = min(max(float(kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value
