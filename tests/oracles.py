"""Plain-Python oracles for every reference function, for the property tests.

Each oracle is written from the formula in the spec (clause ids in the docstrings), not from
ppo_ref's code: it turns its tensors into Python lists and loops over rows and tokens with Python
floats (double precision) and ``math``. No torch arithmetic, no vectorisation. A mask entry counts
as an action token when it is non-zero; masked-out entries are never read.

``assert_close_to_oracle`` holds the tolerance policy for comparing a reference result with an
oracle value.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

Nested = Any  # a number or a nested list of numbers, as produced by Tensor.tolist()

FLOAT32_TOLERANCE = 1e-5
FLOAT64_TOLERANCE = 1e-9
WHITEN_EPS = 1e-8


def tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance for a result computed in ``dtype`` against a double-precision oracle.

    float32 results carry ~1e-7 relative rounding per operation and the functions chain at most a
    few dozen operations per value, so 1e-5 (relative, and absolute on the scale of the inputs)
    leaves a margin of 10-100x. float64 results are held to 1e-9.
    """
    return FLOAT64_TOLERANCE if dtype == torch.float64 else FLOAT32_TOLERANCE


def assert_close_to_oracle(actual: Tensor, expected: Nested, dtype: torch.dtype, scale: float = 1.0) -> None:
    """Assert ``actual`` matches the oracle value within ``tolerance(dtype)``, relative and absolute.

    The absolute part is ``tolerance * max(1, scale)``: ``scale`` is the magnitude of the values the
    result was computed from (rounding errors are relative to them, not to the result, which may
    cancel to near 0). NaN matches NaN, and infinities must match exactly.
    """
    rel = tolerance(dtype)
    want = torch.tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(
        actual.detach().to(torch.float64),
        want.reshape(actual.shape),
        rtol=rel,
        atol=rel * max(1.0, scale),
        equal_nan=True,
    )


def _keep(mask: Tensor) -> list[list[bool]]:
    return [[value != 0 for value in row] for row in mask.tolist()]


def _logsumexp(values: list[float]) -> float:
    top = max(values)
    if top == -math.inf:
        return -math.inf
    return top + math.log(math.fsum(math.exp(v - top) for v in values))


# --- LOGP-1..3, ENT-1 ------------------------------------------------------------------------------


def token_logprobs(logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> list[list[float]]:
    """out[b][i] = log softmax(logits[b][i] / temperature)[input_ids[b][i + 1]] (LOGP-1, LOGP-2)."""
    z = logits.tolist()
    ids = input_ids.tolist()
    out = []
    for b in range(len(z)):
        row = []
        for i in range(len(z[b]) - 1):
            scaled = [v / temperature for v in z[b][i]]
            row.append(scaled[ids[b][i + 1]] - _logsumexp(scaled))
        out.append(row)
    return out


def entropy(logits: Tensor) -> list[list[float]]:
    """H[b][t] = -sum_v p_v log p_v with p = softmax(logits[b][t]); p_v = 0 contributes 0 (ENT-1)."""
    out = []
    for row in logits.tolist():
        out_row = []
        for z in row:
            lse = _logsumexp(z)
            terms = []
            for v in z:
                log_p = v - lse
                p = math.exp(log_p)
                if p > 0.0:
                    terms.append(-p * log_p)
            out_row.append(math.fsum(terms))
        out.append(out_row)
    return out


# --- MASK-1..3 ----------------------------------------------------------------------------------


def _at(nested: Nested, index: tuple[int, ...]) -> Any:
    for i in index:
        nested = nested[i]
    return nested


def _indices(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(n) for n in shape)))


def _nest(flat: list[float], shape: tuple[int, ...]) -> Nested:
    if not shape:
        return flat[0]
    step = len(flat) // shape[0] if shape[0] else 0
    return [_nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Nested:
    """Sum of the masked-in entries over their count; 0 when there are none (MASK-1)."""
    values, keep, shape = x.tolist(), mask.tolist(), tuple(x.shape)
    if dim is None:
        picked = [_at(values, i) for i in _indices(shape) if _at(keep, i) != 0]
        return math.fsum(picked) / len(picked) if picked else 0.0
    dim %= len(shape)
    out_shape = shape[:dim] + shape[dim + 1 :]
    flat = []
    for out_index in _indices(out_shape):
        picked = []
        for k in range(shape[dim]):
            index = (*out_index[:dim], k, *out_index[dim:])
            if _at(keep, index) != 0:
                picked.append(_at(values, index))
        flat.append(math.fsum(picked) / len(picked) if picked else 0.0)
    return _nest(flat, out_shape)


def _masked_values(x: Tensor, mask: Tensor) -> list[float]:
    return [v for v, m in zip(x.flatten().tolist(), mask.flatten().tolist(), strict=True) if m != 0]


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> float:
    """sum (x - mean)^2 / (n - 1) over the masked-in entries, or / n if not unbiased (MASK-2)."""
    picked = _masked_values(x, mask)
    n = len(picked)
    mean = math.fsum(picked) / n
    return math.fsum((v - mean) ** 2 for v in picked) / (n - 1 if unbiased else n)


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Nested:
    """(x - mean) / sqrt(var + 1e-8) on masked-in entries (+ mean if not shift_mean), 0 elsewhere."""
    picked = _masked_values(x, mask)
    mean = math.fsum(picked) / len(picked)
    scale = math.sqrt(masked_var(x, mask) + WHITEN_EPS)
    flat = []
    for v, m in zip(x.flatten().tolist(), mask.flatten().tolist(), strict=True):
        if m == 0:
            flat.append(0.0)
        else:
            flat.append((v - mean) / scale + (0.0 if shift_mean else mean))
    return _nest(flat, tuple(x.shape))


# --- KL-1..3, RWD-1..3 --------------------------------------------------------------------------


def kl_term(logp: float, ref_logp: float, estimator: str) -> float:
    """One token's KL estimate: k1 = logp - ref, k2 = (logp - ref)^2 / 2, k3 = e^u - 1 - u, u = ref - logp."""
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k2":
        return 0.5 * (logp - ref_logp) ** 2
    if estimator == "k3":
        u = ref_logp - logp
        return math.exp(u) - 1.0 - u
    raise ValueError(estimator)


def kl_penalty(
    logp: Tensor, ref_logp: Tensor, estimator: str, mask: Tensor | None = None
) -> list[list[float]]:
    """Per-token KL estimates (KL-1..3); 0 on masked-out entries when a mask is given."""
    lp, ref = logp.tolist(), ref_logp.tolist()
    keep = _keep(mask) if mask is not None else [[True] * len(row) for row in lp]
    return [
        [kl_term(lp[b][t], ref[b][t], estimator) if keep[b][t] else 0.0 for t in range(len(lp[b]))]
        for b in range(len(lp))
    ]


def token_rewards(
    scores: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, kl_coef: float, estimator: str
) -> list[list[float]]:
    """-kl_coef * kl on every action token, plus the score on each row's last action token (RWD-1..3)."""
    lp, ref, keep, score = logp.tolist(), ref_logp.tolist(), _keep(mask), scores.tolist()
    out = []
    for b in range(len(keep)):
        row = [0.0] * len(keep[b])
        last = None
        for t in range(len(keep[b])):
            if keep[b][t]:
                row[t] = -kl_coef * kl_term(lp[b][t], ref[b][t], estimator)
                last = t
        if last is not None:
            row[last] += score[b]
        out.append(row)
    return out


# --- GAE-1..4 -----------------------------------------------------------------------------------


def gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float,
    lam: float,
    last_values: Tensor | None = None,
) -> tuple[list[list[float]], list[list[float]]]:
    """Backward GAE over each row's action tokens only, holes skipped (GAE-1..4).

    After the last action token the next value is last_values[b] (bootstrap) or 0 (terminal) and
    the next advantage is 0. Returns (advantages, returns = advantages + values), 0 off the mask.
    """
    r, v, keep = rewards.tolist(), values.tolist(), _keep(mask)
    boot = last_values.tolist() if last_values is not None else None
    advantages, returns = [], []
    for b in range(len(keep)):
        adv_row = [0.0] * len(keep[b])
        ret_row = [0.0] * len(keep[b])
        next_value = boot[b] if boot is not None else 0.0
        next_advantage = 0.0
        for t in reversed([t for t in range(len(keep[b])) if keep[b][t]]):
            delta = r[b][t] + gamma * next_value - v[b][t]
            next_advantage = delta + gamma * lam * next_advantage
            adv_row[t] = next_advantage
            ret_row[t] = next_advantage + v[b][t]
            next_value = v[b][t]
        advantages.append(adv_row)
        returns.append(ret_row)
    return advantages, returns


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var[R - V] / Var[R] over the mask (unbiased); NaN when every masked-in return is equal (EV-1)."""
    picked_r = _masked_values(returns, mask)
    picked_v = _masked_values(values, mask)
    if all(r == picked_r[0] for r in picked_r):
        return math.nan
    errors = [r - v for r, v in zip(picked_r, picked_v, strict=True)]
    return 1.0 - _variance(errors) / _variance(picked_r)


def _variance(picked: list[float]) -> float:
    mean = math.fsum(picked) / len(picked)
    return math.fsum((p - mean) ** 2 for p in picked) / (len(picked) - 1)


# --- PG-1..6 ------------------------------------------------------------------------------------


def aggregate_loss(per_token: Nested, mask: Tensor, loss_agg: str) -> float:
    """token-mean / seq-mean-token-mean / seq-mean-token-sum of a (B, T) nested list (PG-2).

    Rows without action tokens are left out of the row averages; no action token at all gives 0.
    """
    values = per_token.tolist() if isinstance(per_token, Tensor) else per_token
    keep = _keep(mask)
    rows = [[values[b][t] for t in range(len(keep[b])) if keep[b][t]] for b in range(len(keep))]
    if loss_agg == "token-mean":
        every = [v for row in rows for v in row]
        return math.fsum(every) / len(every) if every else 0.0
    per_row = []
    for row in rows:
        if row:
            total = math.fsum(row)
            per_row.append(total / len(row) if loss_agg == "seq-mean-token-mean" else total)
    if loss_agg not in ("seq-mean-token-mean", "seq-mean-token-sum"):
        raise ValueError(loss_agg)
    return math.fsum(per_row) / len(per_row) if per_row else 0.0


@dataclass(frozen=True)
class PolicyLossOracle:
    """Oracle values for ``policy_loss``; the two shares are bounds because a ratio within
    ``tie_tol`` of a clip boundary may fall on either side once rounded in the tested dtype."""

    loss: float
    objective: list[list[float]]
    clipfrac_low: float
    clipfrac_high: float
    outside_low: float
    outside_high: float
    approx_kl: float
    ratio_mean: float
    ratio_max: float
    max_abs_objective: float


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    loss_agg: str,
    tie_tol: float,
) -> PolicyLossOracle:
    """PPO-Clip: o = min(r A, clip(r, 1 - eps, 1 + eps) A), loss = -aggregate(o) (PG-1..5)."""
    lp, old, adv, keep = logp.tolist(), old_logp.tolist(), advantages.tolist(), _keep(mask)
    objective = [[0.0] * len(row) for row in keep]
    flat_sure = flat_maybe = out_sure = out_maybe = 0
    ratios, kl_terms = [], []
    for b in range(len(keep)):
        for t in range(len(keep[b])):
            if not keep[b][t]:
                continue
            ratio = math.exp(lp[b][t] - old[b][t])
            a = adv[b][t]
            clipped_ratio = min(max(ratio, 1.0 - clip_eps), 1.0 + clip_eps)
            objective[b][t] = min(ratio * a, clipped_ratio * a)
            # Flat branch: clip(r) A < r A, i.e. A > 0 with r > 1 + eps or A < 0 with r < 1 - eps.
            bound = 1.0 + clip_eps if a > 0 else 1.0 - clip_eps
            beyond = ratio - bound if a > 0 else bound - ratio
            if a != 0 and abs(beyond) <= tie_tol:
                flat_maybe += 1
            elif a != 0 and beyond > 0:
                flat_sure += 1
            distance = abs(ratio - 1.0) - clip_eps
            if abs(distance) <= tie_tol:
                out_maybe += 1
            elif distance > 0:
                out_sure += 1
            ratios.append(ratio)
            kl_terms.append((ratio - 1.0) - math.log(ratio))
    n = len(ratios)
    share = (lambda count: count / n) if n else (lambda count: 0.0)
    return PolicyLossOracle(
        loss=-aggregate_loss(objective, mask, loss_agg),
        objective=objective,
        clipfrac_low=share(flat_sure),
        clipfrac_high=share(flat_sure + flat_maybe),
        outside_low=share(out_sure),
        outside_high=share(out_sure + out_maybe),
        approx_kl=math.fsum(kl_terms) / n if n else 0.0,
        ratio_mean=math.fsum(ratios) / n if n else 0.0,
        ratio_max=max(ratios) if n else 0.0,
        max_abs_objective=max((abs(o) for row in objective for o in row), default=0.0),
    )


# --- VF-1, VF-2, PEN-1, PEN-2, KLC-1 ------------------------------------------------------------


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip_eps: float | None
) -> float:
    """0.5 * mean over action tokens of max((V - R)^2, (V_clip - R)^2), or of (V - R)^2 (VF-1, VF-2)."""
    v, old, target, keep = values.tolist(), old_values.tolist(), returns.tolist(), _keep(mask)
    terms = []
    for b in range(len(keep)):
        for t in range(len(keep[b])):
            if not keep[b][t]:
                continue
            squared = (v[b][t] - target[b][t]) ** 2
            if clip_eps is not None:
                moved = min(max(v[b][t] - old[b][t], -clip_eps), clip_eps)
                squared = max(squared, (old[b][t] + moved - target[b][t]) ** 2)
            terms.append(squared)
    return 0.5 * math.fsum(terms) / len(terms) if terms else 0.0


def ppo_penalty_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, beta: float
) -> tuple[float, float]:
    """(loss, kl): loss = -mean(r A - beta k), k = r - 1 - log r the k3 estimate of KL(pi_old||pi) (PEN-1)."""
    lp, old, adv, keep = logp.tolist(), old_logp.tolist(), advantages.tolist(), _keep(mask)
    objective, kls = [], []
    for b in range(len(keep)):
        for t in range(len(keep[b])):
            if keep[b][t]:
                log_ratio = lp[b][t] - old[b][t]
                ratio = math.exp(log_ratio)
                k = ratio - 1.0 - log_ratio
                objective.append(ratio * adv[b][t] - beta * k)
                kls.append(k)
    if not kls:
        return 0.0, 0.0
    return -math.fsum(objective) / len(kls), math.fsum(kls) / len(kls)


def update_penalty_beta(beta: float, kl: float, target_kl: float) -> float:
    """Halve beta below target / 1.5, double it above 1.5 * target, else keep it (PEN-2)."""
    if kl < target_kl / 1.5:
        return beta / 2.0
    if kl > 1.5 * target_kl:
        return beta * 2.0
    return beta


def adaptive_kl_coefs(
    init_kl_coef: float, target: float, horizon: float, updates: tuple[tuple[float, int], ...]
) -> list[float]:
    """The coefficient after each update: e = clip(kl / target - 1, -0.2, 0.2),
    coef *= 1 + e * n_steps / horizon (KLC-1)."""
    coef = init_kl_coef
    history = []
    for kl, n_steps in updates:
        error = kl / target - 1.0
        error = -0.2 if error < -0.2 else (0.2 if error > 0.2 else error)
        coef = coef * (1.0 + error * n_steps / horizon)
        history.append(coef)
    return history
