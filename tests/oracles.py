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


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, unbiased: bool = True) -> Nested:
    """(x - mean) / sqrt(var + 1e-8) on masked-in entries (+ mean if not shift_mean), 0 elsewhere;
    var divides by n - 1 (``unbiased``) or n."""
    picked = _masked_values(x, mask)
    mean = math.fsum(picked) / len(picked)
    scale = math.sqrt(masked_var(x, mask, unbiased) + WHITEN_EPS)
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
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip_eps: float | None,
    clip_form: str = "max",
) -> float:
    """0.5 * mean over action tokens of max((V - R)^2, (V_clip - R)^2), or of (V - R)^2 (VF-1, VF-2);
    ``clip_form="clipped-only"``: of (V_clip - R)^2 alone."""
    v, old, target, keep = values.tolist(), old_values.tolist(), returns.tolist(), _keep(mask)
    terms = []
    for b in range(len(keep)):
        for t in range(len(keep[b])):
            if not keep[b][t]:
                continue
            squared = (v[b][t] - target[b][t]) ** 2
            if clip_eps is not None:
                moved = min(max(v[b][t] - old[b][t], -clip_eps), clip_eps)
                clipped = (old[b][t] + moved - target[b][t]) ** 2
                squared = clipped if clip_form == "clipped-only" else max(squared, clipped)
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


# --- The PPO family: GRP-1..3, AGG-1..3, CLIP-1..3, GSPO-1..3, CISPO-1, KLL-1, IS-1..3 ----------


def _rows_of(mask: Tensor) -> list[list[int]]:
    """The action-token columns of each row."""
    return [[t for t, on in enumerate(row) if on] for row in _keep(mask)]


def group_advantages(
    scores: Tensor, group_ids: Tensor, method: str, std_scope: str = "group", eps: float = 1e-6
) -> list[float]:
    """One advantage per row from its group (equal ids), with ``singleton='zero'`` (GRP-1..3).

    grpo (r - mean_g) / (std + eps), std with n - 1 over the group (``group``), over all scores
    (``batch``) or 1 with eps 0 (``none``); dr_grpo r - mean_g; rloo r - (sum_g - r) / (n_g - 1),
    the leave-one-out mean computed as such. A group of one gives 0, a constant group exactly 0.
    """
    r, ids = scores.tolist(), group_ids.tolist()
    members: dict[int, list[int]] = {}
    for i, gid in enumerate(ids):
        members.setdefault(gid, []).append(i)
    batch_std = math.sqrt(_variance(r)) if len(r) > 1 else 0.0
    out = [0.0] * len(r)
    for rows in members.values():
        values = [r[i] for i in rows]
        n = len(values)
        if n == 1 or min(values) == max(values):
            continue
        mean = math.fsum(values) / n
        for i in rows:
            if method == "dr_grpo" or (method == "grpo" and std_scope == "none"):
                out[i] = r[i] - mean
            elif method == "rloo":
                others = [r[j] for j in rows if j != i]
                out[i] = r[i] - math.fsum(others) / (n - 1)
            else:
                std = math.sqrt(_variance(values)) if std_scope == "group" else batch_std
                out[i] = (r[i] - mean) / (std + eps)
    return out


def aggregate(
    per_token: Nested,
    mask: Tensor,
    loss_agg: str,
    norm_constant: float | None = None,
    token_count: int | None = None,
    row_count: int | None = None,
) -> float:
    """All four modes with the whole-batch counts (AGG-1..3): token-mean sum / N; the seq-means
    sum over rows with an action token of the row's mean (or sum) / R; seq-mean-token-sum-norm
    sum / (B * C) with B every row passed. ``token_count`` replaces N, ``row_count`` R or B."""
    values = per_token.tolist() if isinstance(per_token, Tensor) else per_token
    rows = [[values[b][t] for t in cols] for b, cols in enumerate(_rows_of(mask))]
    if loss_agg == "token-mean":
        every = [v for row in rows for v in row]
        count = token_count if token_count is not None else len(every)
        return math.fsum(every) / count if count else 0.0
    if loss_agg == "seq-mean-token-sum-norm":
        assert norm_constant is not None
        count = row_count if row_count is not None else len(rows)
        return math.fsum(v for row in rows for v in row) / (max(count, 1) * norm_constant)
    per_row = [math.fsum(row) / (len(row) if loss_agg == "seq-mean-token-mean" else 1) for row in rows if row]
    count = row_count if row_count is not None else len(per_row)
    return math.fsum(per_row) / count if count else 0.0


def aggregation_weights(
    mask: Tensor,
    loss_agg: str,
    norm_constant: float | None = None,
    token_count: int | None = None,
    row_count: int | None = None,
) -> list[list[float]]:
    """d aggregate / d per_token[b][t] for each entry (0 off the mask)."""
    cols = _rows_of(mask)
    keep = _keep(mask)
    out = [[0.0] * len(row) for row in keep]
    tokens = token_count if token_count is not None else sum(len(c) for c in cols)
    nonempty = row_count if row_count is not None else sum(1 for c in cols if c)
    every = row_count if row_count is not None else len(cols)
    for b, row_cols in enumerate(cols):
        for t in row_cols:
            if loss_agg == "token-mean":
                out[b][t] = 1.0 / tokens
            elif loss_agg == "seq-mean-token-mean":
                out[b][t] = 1.0 / (len(row_cols) * nonempty)
            elif loss_agg == "seq-mean-token-sum":
                out[b][t] = 1.0 / nonempty
            else:
                assert norm_constant is not None
                out[b][t] = 1.0 / (max(every, 1) * norm_constant)
    return out


@dataclass(frozen=True)
class ClipOracle:
    """Oracle values of ``policy_loss`` with the clip options; shares as [low, high] bounds (a
    ratio within ``tie_tol`` of a boundary may round either way)."""

    loss: float
    objective: list[list[float]]
    slope: list[list[float]]
    clipfrac: tuple[float, float]
    dual_clip_frac: tuple[float, float]
    outside: tuple[float, float]
    max_abs_objective: float


def clipped_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    clip_eps_high: float | None,
    dual_clip: float | None,
    loss_agg: str,
    tie_tol: float,
    norm_constant: float | None = None,
) -> ClipOracle:
    """o = min(r A, clip(r, 1 - eps, 1 + eps_h) A), then max(o, c A) where A < 0 (CLIP-1, CLIP-2).

    ``slope`` is d o / d logp: r A off the flat branches, 0 on them (A > 0 and r > 1 + eps_h;
    A < 0 and r < 1 - eps; A < 0 and r > c under the dual clip).
    """
    high = clip_eps if clip_eps_high is None else clip_eps_high
    lp, old, adv, keep = logp.tolist(), old_logp.tolist(), advantages.tolist(), _keep(mask)
    objective = [[0.0] * len(row) for row in keep]
    slope = [[0.0] * len(row) for row in keep]
    counts = {"flat": [0, 0], "dual": [0, 0], "out": [0, 0]}  # [sure, maybe]

    def tally(name: str, margin: float) -> None:
        if abs(margin) <= tie_tol:
            counts[name][1] += 1
        elif margin > 0:
            counts[name][0] += 1

    n = 0
    for b in range(len(keep)):
        for t in range(len(keep[b])):
            if not keep[b][t]:
                continue
            n += 1
            ratio = math.exp(lp[b][t] - old[b][t])
            a = adv[b][t]
            clipped = min(max(ratio, 1.0 - clip_eps), 1.0 + high)
            o = min(ratio * a, clipped * a)
            flat = (a > 0 and ratio > 1.0 + high) or (a < 0 and ratio < 1.0 - clip_eps)
            if a > 0:
                tally("flat", ratio - (1.0 + high))
            elif a < 0:
                tally("flat", (1.0 - clip_eps) - ratio)
            if dual_clip is not None and a < 0:
                tally("dual", ratio - dual_clip)
                if dual_clip * a > o:
                    o, flat = dual_clip * a, True
            tally("out", max(ratio - (1.0 + high), (1.0 - clip_eps) - ratio))
            objective[b][t] = o
            slope[b][t] = 0.0 if flat else ratio * a

    def share(name: str) -> tuple[float, float]:
        sure, maybe = counts[name]
        return (sure / n, (sure + maybe) / n) if n else (0.0, 0.0)

    return ClipOracle(
        loss=-aggregate(objective, mask, loss_agg, norm_constant),
        objective=objective,
        slope=slope,
        clipfrac=share("flat"),
        dual_clip_frac=share("dual") if dual_clip is not None else (0.0, 0.0),
        outside=share("out"),
        max_abs_objective=max((abs(o) for row in objective for o in row), default=0.0),
    )


@dataclass(frozen=True)
class GSPOOracle:
    """Oracle values of ``gspo_loss``; ``seq_ratios`` has None for rows without an action token."""

    loss: float
    gradient: list[list[float]]
    clipfrac: tuple[float, float]
    ratio_mean: float
    ratio_max: float
    seq_ratios: list[float | None]


def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    clip_eps_high: float | None,
    tie_tol: float,
    row_count: int | None = None,
) -> GSPOOracle:
    """s_i = exp(mean_t (logp - old_logp)), o_i = min(s A, clip(s) A), loss = -sum_i o_i / R over the
    R rows with an action token (GSPO-1); d loss / d logp_t = -s_i A_i / (n_i R) on the unclipped
    branch, 0 on the flat one (GSPO-2); clipfrac over sequences, ratios of sequences (GSPO-3)."""
    high = clip_eps if clip_eps_high is None else clip_eps_high
    lp, old, adv, keep = logp.tolist(), old_logp.tolist(), advantages.tolist(), _keep(mask)
    cols = _rows_of(mask)
    rows = row_count if row_count is not None else sum(1 for c in cols if c)
    gradient = [[0.0] * len(row) for row in keep]
    objectives, ratios, seq_ratios = [], [], []
    sure = maybe = 0
    for b, row_cols in enumerate(cols):
        if not row_cols:
            seq_ratios.append(None)
            continue
        s = math.exp(math.fsum(lp[b][t] - old[b][t] for t in row_cols) / len(row_cols))
        a = adv[b]
        objectives.append(min(s * a, min(max(s, 1.0 - clip_eps), 1.0 + high) * a))
        ratios.append(s)
        seq_ratios.append(s)
        margin = s - (1.0 + high) if a > 0 else ((1.0 - clip_eps) - s if a < 0 else -1.0)
        if abs(margin) <= tie_tol:
            maybe += 1
        elif margin > 0:
            sure += 1
        flat = (a > 0 and s > 1.0 + high) or (a < 0 and s < 1.0 - clip_eps)
        for t in row_cols:
            gradient[b][t] = 0.0 if flat else -s * a / (len(row_cols) * rows)
    count = len(ratios)
    return GSPOOracle(
        loss=-math.fsum(objectives) / rows if rows else 0.0,
        gradient=gradient,
        clipfrac=(sure / count, (sure + maybe) / count) if count else (0.0, 0.0),
        ratio_mean=math.fsum(ratios) / count if count else 0.0,
        ratio_max=max(ratios) if count else 0.0,
        seq_ratios=seq_ratios,
    )


def cispo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    loss_agg: str,
    norm_constant: float | None = None,
) -> tuple[float, list[list[float]]]:
    """(loss, d loss / d logp): l_t = -w_t A_t logp_t with w = clip(r, 1 - low, 1 + high) held
    constant, aggregated; the gradient is -w A times the aggregation weight on every action token
    (CISPO-1)."""
    lp, old, adv, keep = logp.tolist(), old_logp.tolist(), advantages.tolist(), _keep(mask)
    per_token = [[0.0] * len(row) for row in keep]
    slope = [[0.0] * len(row) for row in keep]
    for b in range(len(keep)):
        for t in range(len(keep[b])):
            if keep[b][t]:
                ratio = math.exp(lp[b][t] - old[b][t])
                weight = min(max(ratio, 1.0 - clip_low), 1.0 + clip_high)
                per_token[b][t] = -weight * adv[b][t] * lp[b][t]
                slope[b][t] = -weight * adv[b][t]
    weights = aggregation_weights(mask, loss_agg, norm_constant)
    gradient = [
        [s * w for s, w in zip(srow, wrow, strict=True)] for srow, wrow in zip(slope, weights, strict=True)
    ]
    return aggregate(per_token, mask, loss_agg, norm_constant), gradient


def kl_loss_term(logp: float, ref_logp: float, estimator: str) -> tuple[float, float]:
    """(value, d value / d logp) of one token's KL loss term, delta = logp - ref_logp (KLL-1):
    k1 (delta, 1); k2 (delta^2 / 2, delta); k3 (e^-delta - 1 + delta, 1 - e^-delta); k3+ (k3's
    value, k2's gradient delta)."""
    delta = logp - ref_logp
    k3 = math.exp(-delta) - 1.0 + delta
    return {
        "k1": (delta, 1.0),
        "k2": (0.5 * delta * delta, delta),
        "k3": (k3, 1.0 - math.exp(-delta)),
        "k3+": (k3, delta),
    }[estimator]


def kl_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    estimator: str,
    loss_agg: str,
    norm_constant: float | None = None,
) -> tuple[float, list[list[float]]]:
    """(loss, d loss / d logp): the per-token terms of :func:`kl_loss_term` aggregated (KLL-1, KLL-3)."""
    lp, ref, keep = logp.tolist(), ref_logp.tolist(), _keep(mask)
    values = [[0.0] * len(row) for row in keep]
    slope = [[0.0] * len(row) for row in keep]
    for b in range(len(keep)):
        for t in range(len(keep[b])):
            if keep[b][t]:
                values[b][t], slope[b][t] = kl_loss_term(lp[b][t], ref[b][t], estimator)
    weights = aggregation_weights(mask, loss_agg, norm_constant)
    gradient = [
        [s * w for s, w in zip(srow, wrow, strict=True)] for srow, wrow in zip(slope, weights, strict=True)
    ]
    return aggregate(values, mask, loss_agg, norm_constant), gradient


def rollout_correction(
    logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    level: str,
    mode: str,
    high: float,
    low: float | None,
) -> list[list[float]]:
    """Weights per action token (IS-1, IS-2): w_t = exp(logp - rollout_logp) (token), the row's
    product exp(sum) (sequence) or geometric mean exp(mean) (sequence-geometric); truncate gives
    min(w, high) (and max(., low) with a low), mask gives w inside [low, high] and 0 outside.
    0 off the mask."""
    lp, roll, keep = logp.tolist(), rollout_logp.tolist(), _keep(mask)
    out = [[0.0] * len(row) for row in keep]
    for b, cols in enumerate(_rows_of(mask)):
        logs = [lp[b][t] - roll[b][t] for t in cols]
        for i, t in enumerate(cols):
            if level == "token":
                w = math.exp(logs[i])
            elif level == "sequence":
                w = math.exp(math.fsum(logs))
            else:
                w = math.exp(math.fsum(logs) / len(logs))
            if mode == "truncate":
                w = min(w, high)
                if low is not None:
                    w = max(w, low)
            elif w > high or (low is not None and w < low):
                w = 0.0
            out[b][t] = w
    return out


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> list[list[float]]:
    """REINFORCE++'s raw returns (RPP-1): G_t = r_t + gamma G_next over each row's action tokens,
    G_next the return of the next action token (holes skipped), 0 after the last; 0 off the mask."""
    r, keep = rewards.tolist(), _keep(mask)
    out = [[0.0] * len(row) for row in keep]
    for b, cols in enumerate(_rows_of(mask)):
        running = 0.0
        for t in reversed(cols):
            running = r[b][t] + gamma * running
            out[b][t] = running
    return out


def group_baseline_advantages(scores: Tensor, group_ids: Tensor, mask: Tensor) -> list[list[float]]:
    """REINFORCE++-baseline before whitening (RPP-2): score minus the group's mean score (0 for a
    group of one), on every action token of the row; 0 off the mask."""
    r, ids, keep = scores.tolist(), group_ids.tolist(), _keep(mask)
    out = [[0.0] * len(row) for row in keep]
    for b, cols in enumerate(_rows_of(mask)):
        peers = [r[j] for j in range(len(r)) if ids[j] == ids[b]]
        centred = 0.0 if len(peers) < 2 or min(peers) == max(peers) else r[b] - math.fsum(peers) / len(peers)
        for t in cols:
            out[b][t] = centred
    return out
