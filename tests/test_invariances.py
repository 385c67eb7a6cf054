"""Invariances of the reference functions (spec IN-1, GAE-2, PG-2 and row independence).

- Masked-out entries never matter: writing arbitrary values (NaN, +-inf, 1e6, ...) into them, in
  place or in appended padding columns, leaves every result bit-identical to zeros there, and
  padding leaves the results on the action tokens unchanged.
- NaN and inf on masked-out entries give finite results and finite gradients (0 off the mask).
- GAE is unchanged by inserting holes, and equals GAE over each row's action tokens packed densely.
- Rows are independent where the math is per row, and permuting rows permutes the results.
- A token-mean loss over a batch equals the chunked losses recombined by token counts.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from typing import Any

import oracles
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch import Tensor

import ppo_ref
from conformance import strategies as cs

Outputs = dict[str, Tensor]


def _results(result: Any) -> Outputs:
    return {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}


def _largest(*tensors: Tensor | None, mask: Tensor | None = None) -> float:
    """Largest finite magnitude among the (masked-in) entries of the tensors."""
    largest = 0.0
    for t in tensors:
        if t is None:
            continue
        picked = t.detach().double() if mask is None else t.detach().double()[mask != 0]
        picked = picked[torch.isfinite(picked)]
        largest = max(largest, float(picked.abs().max()) if picked.numel() else 0.0)
    return largest


def _dtype(batch: Any) -> torch.dtype:
    """The float dtype of the bundle's tensors."""
    return next(
        v.dtype
        for v in vars(batch).values()
        if isinstance(v, Tensor) and v.is_floating_point() and v is not getattr(batch, "mask", None)
    )


def _compare(got: Tensor, want: Tensor, dtype: torch.dtype, scale: float, key: str) -> None:
    """Equal up to the rounding of a different summation order: 1e-5 (float32) or 1e-12 (float64),
    relative and absolute on ``scale``."""
    rel = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(
        got, want, rtol=rel, atol=rel * max(1.0, scale), equal_nan=True, msg=lambda m: f"{key}: {m}"
    )


def _gae(b: cs.GAEBatch) -> Outputs:
    advantages, returns = ppo_ref.gae(b.rewards, b.values, b.mask, b.gamma, b.lam, b.last_values)
    return {"advantages": advantages, "returns": returns}


def _masked(b: cs.MaskedBatch) -> Outputs:
    return {
        "mean": ppo_ref.masked_mean(b.x, b.mask),
        "row means": ppo_ref.masked_mean(b.x, b.mask, dim=1),
        "column means": ppo_ref.masked_mean(b.x, b.mask, dim=0),
        "var": ppo_ref.masked_var(b.x, b.mask),
        "biased var": ppo_ref.masked_var(b.x, b.mask, unbiased=False),
        "whiten": ppo_ref.masked_whiten(b.x, b.mask),
        "whiten unshifted": ppo_ref.masked_whiten(b.x, b.mask, shift_mean=False),
    }


def _rewards(b: cs.RewardBatch) -> Outputs:
    return {"rewards": ppo_ref.token_rewards(b.scores, b.logp, b.ref_logp, b.mask, b.kl_coef, b.estimator)}


def _policy(b: cs.PolicyBatch) -> Outputs:
    out = _results(ppo_ref.policy_loss(b.logp, b.old_logp, b.advantages, b.mask, b.clip_eps, b.loss_agg))
    out["aggregate"] = ppo_ref.aggregate_loss(b.advantages, b.mask, b.loss_agg)
    return out


def _masked_scale(b: cs.MaskedBatch) -> float:
    """Rounding scale of the masked statistics: x^2 for the variance, |x| / std for whitening."""
    largest = _largest(b.x, b.mask)
    std = math.sqrt(oracles.masked_var(b.x, b.mask) + oracles.WHITEN_EPS)
    return largest**2 + largest / std


def _ev_scale(b: cs.EVBatch) -> float:
    """1 - Var[R - V] / Var[R] amplifies rounding by (|R| + |V|)^2 / Var[R]; inf if Var[R] is 0."""
    var_returns = oracles.masked_var(b.returns, b.mask)
    return math.inf if var_returns == 0 else 4 * _largest(b.values, b.returns, mask=b.mask) ** 2 / var_returns


@dataclasses.dataclass(frozen=True)
class Case:
    """A function under test: a strategy of bundles with finite masked-out entries, a function from a
    bundle to named outputs, and the magnitude its rounding errors scale with."""

    strategy: st.SearchStrategy[Any]
    run: Callable[[Any], Outputs]
    scale: Callable[[Any], float]


RATIO_MAX = math.exp(cs.LOG_RATIO_MAX)

CASES: dict[str, Case] = {
    "masked stats": Case(cs.masked_batches(min_tokens=2, junk=False), _masked, _masked_scale),
    "kl_penalty": Case(
        cs.kl_batches(with_mask=True, junk=False),
        lambda b: {"kl": ppo_ref.kl_penalty(b.logp, b.ref_logp, b.estimator, mask=b.mask)},
        lambda b: RATIO_MAX + cs.LOG_RATIO_MAX**2,
    ),
    "token_rewards": Case(
        cs.reward_batches(junk=False),
        _rewards,
        lambda b: RATIO_MAX + cs.LOG_RATIO_MAX**2 + _largest(b.scores),
    ),
    "gae": Case(
        cs.gae_batches(junk=False),
        _gae,
        lambda b: b.mask.shape[1] * (_largest(b.rewards, b.values, mask=b.mask) + _largest(b.last_values)),
    ),
    "policy_loss": Case(cs.policy_batches(junk=False), _policy, lambda b: RATIO_MAX * 5.0 * b.mask.shape[1]),
    "value_loss": Case(
        cs.value_batches(junk=False),
        lambda b: {"loss": ppo_ref.value_loss(b.values, b.old_values, b.returns, b.mask, b.clip_eps)},
        lambda b: (2 * _largest(b.values, b.old_values, b.returns, mask=b.mask)) ** 2,
    ),
    "ppo_penalty_loss": Case(
        cs.penalty_batches(junk=False),
        lambda b: _results(ppo_ref.ppo_penalty_loss(b.logp, b.old_logp, b.advantages, b.mask, b.beta)),
        lambda b: RATIO_MAX * (5.0 + b.beta),
    ),
    "explained_variance": Case(
        cs.ev_batches(junk=False),
        lambda b: {"ev": ppo_ref.explained_variance(b.values, b.returns, b.mask)},
        _ev_scale,
    ),
}


def _token_fields(batch: Any) -> list[str]:
    """Names of the bundle's (B, T) float tensors (the mask excluded)."""
    return [
        f.name
        for f in dataclasses.fields(batch)
        if f.name != "mask"
        and isinstance(getattr(batch, f.name), Tensor)
        and getattr(batch, f.name).is_floating_point()
        and getattr(batch, f.name).shape == batch.mask.shape
    ]


def _padded(batch: Any, columns: int) -> Any:
    """The bundle with ``columns`` masked-out positions appended (values 0, mask 0)."""
    changes = {name: cs.append_padding(getattr(batch, name), columns, 0.0) for name in _token_fields(batch)}
    return dataclasses.replace(batch, mask=cs.append_padding(batch.mask, columns, 0), **changes)


def _scribbled(batch: Any, data: st.DataObject) -> Any:
    """The bundle with arbitrary values (NaN, inf, ...) drawn into every masked-out slot."""
    changes = {}
    for name in _token_fields(batch):
        tensor = getattr(batch, name)
        junk = data.draw(cs.junk_tensors(tuple(tensor.shape), tensor.dtype), label=f"junk for {name}")
        changes[name] = cs.fill_masked(tensor, batch.mask, junk)
    return dataclasses.replace(batch, **changes)


def _assert_identical(actual: Outputs, expected: Outputs) -> None:
    for key, want in expected.items():
        torch.testing.assert_close(
            actual[key], want, rtol=0, atol=0, equal_nan=True, msg=lambda m, k=key: f"{k}: {m}"
        )


@pytest.mark.clause("IN-1")
@pytest.mark.parametrize("name", sorted(CASES))
@given(data=st.data())
def test_masked_out_values_and_padding_change_nothing(name: str, data: st.DataObject) -> None:
    case = CASES[name]
    batch = data.draw(case.strategy, label="batch")
    columns = data.draw(st.integers(0, 3), label="padding columns")
    padded = _padded(batch, columns)
    zero_filled = case.run(padded)
    # Arbitrary values where the mask is 0 give bit-identical results to zeros there.
    _assert_identical(case.run(_scribbled(padded, data)), zero_filled)
    # Padding changes nothing on the action tokens, and per-token outputs are 0 on the padding.
    steps = batch.mask.shape[1]
    for key, want in case.run(batch).items():
        got = zero_filled[key]
        if got.shape != want.shape:
            assert bool((got[..., steps:] == 0).all()), key
            got = got[..., :steps]
        _compare(got, want, _dtype(batch), case.scale(batch), key)


@pytest.mark.clause("IN-1", "LOGP-1", "ENT-1")
@given(cs.logits_batches(dtypes=cs.FLOAT_DTYPES), st.data())
def test_logits_of_later_positions_change_nothing_earlier(batch: cs.LogitsBatch, data: st.DataObject) -> None:
    rows, length, vocab = batch.logits.shape
    extra = data.draw(st.integers(1, 3), label="extra positions")
    more_logits = data.draw(cs.float_tensors((rows, extra, vocab), batch.logits.dtype, -1e3, 1e3))
    more_ids = torch.tensor(
        data.draw(st.lists(st.integers(0, vocab - 1), min_size=rows * extra, max_size=rows * extra))
    ).reshape(rows, extra)
    logits = torch.cat([batch.logits, more_logits], dim=1)
    ids = torch.cat([batch.input_ids, more_ids], dim=1)
    longer = ppo_ref.token_logprobs(logits, ids, batch.temperature)
    torch.testing.assert_close(
        longer[:, : length - 1], ppo_ref.token_logprobs(batch.logits, batch.input_ids, batch.temperature)
    )
    torch.testing.assert_close(ppo_ref.entropy(logits)[:, :length], ppo_ref.entropy(batch.logits))


# --- finite results and gradients with NaN/inf off the mask ---------------------------------------


def _with_grad(batch: Any, names: list[str]) -> tuple[Any, list[Tensor]]:
    leaves = [getattr(batch, n).clone().requires_grad_(True) for n in names]
    return dataclasses.replace(batch, **dict(zip(names, leaves, strict=True))), leaves


def _sum(outputs: Outputs) -> Tensor:
    return torch.stack([o.sum() for o in outputs.values() if o.requires_grad]).sum()


GRAD_CASES: dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], Outputs], list[str]]] = {
    "policy_loss": (cs.policy_batches(junk=True), _policy, ["logp", "advantages"]),
    "value_loss": (
        cs.value_batches(junk=True),
        lambda b: {"loss": ppo_ref.value_loss(b.values, b.old_values, b.returns, b.mask, b.clip_eps)},
        ["values", "returns"],
    ),
    "ppo_penalty_loss": (
        cs.penalty_batches(junk=True),
        lambda b: _results(ppo_ref.ppo_penalty_loss(b.logp, b.old_logp, b.advantages, b.mask, b.beta)),
        ["logp", "advantages"],
    ),
    "masked stats": (cs.masked_batches(min_tokens=2, junk=True), _masked, ["x"]),
    "kl_penalty": (
        cs.kl_batches(with_mask=True, junk=True),
        lambda b: {"kl": ppo_ref.kl_penalty(b.logp, b.ref_logp, b.estimator, mask=b.mask)},
        ["logp", "ref_logp"],
    ),
    "token_rewards": (cs.reward_batches(junk=True), _rewards, ["logp", "ref_logp"]),
    "gae": (cs.gae_batches(junk=True), _gae, ["rewards", "values"]),
    "explained_variance": (
        cs.ev_batches(junk=True),
        lambda b: {"ev": ppo_ref.explained_variance(b.values, b.returns, b.mask)},
        ["values", "returns"],
    ),
}


@pytest.mark.clause("IN-1")
@pytest.mark.parametrize("name", sorted(GRAD_CASES))
@given(data=st.data())
def test_nan_off_the_mask_gives_finite_results_and_gradients(name: str, data: st.DataObject) -> None:
    strategy, run, names = GRAD_CASES[name]
    batch = data.draw(strategy, label="batch")
    batch = dataclasses.replace(
        batch, **{n: cs.fill_masked(getattr(batch, n), batch.mask, math.nan) for n in names[:1]}
    )  # at least one NaN-filled input
    batch, leaves = _with_grad(batch, names)
    outputs = run(batch)
    # NaN is the specified EV for constant returns (EV-1), not a leak: such draws are not counted.
    assume(not (name == "explained_variance" and bool(outputs["ev"].isnan())))
    for key, value in outputs.items():
        assert bool(torch.isfinite(value).all()), key
    _sum(outputs).backward()
    off = batch.mask == 0
    for leaf_name, leaf in zip(names, leaves, strict=True):
        assert leaf.grad is not None, leaf_name
        assert bool(torch.isfinite(leaf.grad).all()), leaf_name
        assert bool((leaf.grad[off] == 0).all()), leaf_name


@pytest.mark.clause("IN-1", "ENT-1", "LOGP-1")
@given(cs.logits_batches(dtypes=cs.FLOAT_DTYPES))
def test_banned_tokens_give_finite_entropy_and_gradients(batch: cs.LogitsBatch) -> None:
    logits = batch.logits.clone().requires_grad_(True)
    entropy = ppo_ref.entropy(logits)
    assert bool(torch.isfinite(entropy).all())
    # Score only allowed tokens (logits at i score token i + 1) so that the log-probs are finite too.
    targets = batch.input_ids[:, 1:]
    allowed = torch.isfinite(batch.logits[:, :-1].gather(-1, targets[..., None])).squeeze(-1)
    allowed_ids = batch.input_ids.clone()
    allowed_ids[:, 1:] = torch.where(allowed, targets, batch.logits[:, :-1].argmax(-1))
    logp = ppo_ref.token_logprobs(logits, allowed_ids, batch.temperature)
    assert bool(torch.isfinite(logp).all())
    (entropy.sum() + logp.sum()).backward()
    assert logits.grad is not None and bool(torch.isfinite(logits.grad).all())
    assert bool((logits.grad[torch.isinf(batch.logits)] == 0).all())


# --- GAE holes ----------------------------------------------------------------------------------


@pytest.mark.clause("GAE-2", "IN-1")
@given(cs.gae_batches(junk=False), st.data())
def test_gae_unchanged_by_inserting_holes(batch: cs.GAEBatch, data: st.DataObject) -> None:
    rows, steps = batch.mask.shape
    positions = data.draw(cs.hole_positions(steps), label="hole positions")
    holes = (rows, len(positions))
    hole_rewards = data.draw(cs.junk_tensors(holes, batch.rewards.dtype), label="hole rewards")
    hole_values = data.draw(cs.junk_tensors(holes, batch.values.dtype), label="hole values")
    holed = dataclasses.replace(
        batch,
        rewards=cs.insert_holes(batch.rewards, positions, hole_rewards),
        values=cs.insert_holes(batch.values, positions, hole_values),
        mask=cs.insert_holes(batch.mask, positions, 0),
    )
    kept = torch.ones(steps + len(positions), dtype=torch.bool)
    kept[[p + i for i, p in enumerate(sorted(positions))]] = False
    base, with_holes = _gae(batch), _gae(holed)
    for key in base:
        assert torch.equal(with_holes[key][:, kept], base[key]), key
        assert bool((with_holes[key][:, ~kept] == 0).all()), key


@pytest.mark.clause("GAE-2", "GAE-3")
@given(cs.gae_batches(junk=True))
def test_gae_equals_gae_over_the_packed_action_tokens(batch: cs.GAEBatch) -> None:
    advantages, returns = ppo_ref.gae(
        batch.rewards, batch.values, batch.mask, batch.gamma, batch.lam, batch.last_values
    )
    for b in range(batch.mask.shape[0]):
        keep = batch.mask[b] != 0
        if not bool(keep.any()):
            continue
        packed_mask = torch.ones(1, int(keep.sum()))
        last = None if batch.last_values is None else batch.last_values[b : b + 1]
        a, r = ppo_ref.gae(
            batch.rewards[b, keep][None],
            batch.values[b, keep][None],
            packed_mask,
            batch.gamma,
            batch.lam,
            last,
        )
        assert torch.equal(a[0], advantages[b, keep]) and torch.equal(r[0], returns[b, keep])


# --- rows ---------------------------------------------------------------------------------------

PER_ROW: dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], Outputs]]] = {
    "gae": (cs.gae_batches(), _gae),
    "token_rewards": (cs.reward_batches(), _rewards),
    "kl_penalty": (
        cs.kl_batches(),
        lambda b: {"kl": ppo_ref.kl_penalty(b.logp, b.ref_logp, b.estimator, mask=b.mask)},
    ),
    "token_logprobs": (
        cs.logits_batches(),
        lambda b: {
            "logp": ppo_ref.token_logprobs(b.logits, b.input_ids, b.temperature),
            "entropy": ppo_ref.entropy(b.logits),
        },
    ),
}


def _rows(batch: Any, index: Tensor) -> Any:
    """The bundle restricted to (or reordered by) the rows in ``index``."""
    changes = {}
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, Tensor) and value.dim() >= 1:
            changes[f.name] = value[index]
    return dataclasses.replace(batch, **changes)


@pytest.mark.clause("GAE-1", "RWD-1", "RWD-2", "KL-1", "LOGP-1", "ENT-1")
@pytest.mark.parametrize("name", sorted(PER_ROW))
@given(data=st.data())
def test_rows_are_independent_and_permute(name: str, data: st.DataObject) -> None:
    strategy, run = PER_ROW[name]
    batch = data.draw(strategy, label="batch")
    rows = next(v for v in vars(batch).values() if isinstance(v, Tensor)).shape[0]
    full = run(batch)
    for b in range(rows):
        alone = run(_rows(batch, torch.tensor([b])))
        for key, value in alone.items():
            assert torch.equal(value[0], full[key][b]), (key, b)
    order = torch.tensor(data.draw(st.permutations(range(rows)), label="row order"))
    permuted = run(_rows(batch, order))
    for key, value in permuted.items():
        assert torch.equal(value, full[key][order]), key


@pytest.mark.clause("PG-2", "MASK-1", "MASK-3", "VF-1", "PEN-1", "EV-1")
@pytest.mark.parametrize("name", sorted(CASES))
@given(data=st.data())
def test_batch_results_do_not_depend_on_row_order(name: str, data: st.DataObject) -> None:
    case = CASES[name]
    batch = data.draw(case.strategy, label="batch")
    rows = batch.mask.shape[0]
    order = torch.tensor(data.draw(st.permutations(range(rows)), label="row order"))
    base, permuted = case.run(batch), case.run(_rows(batch, order))
    scale = case.scale(batch)
    assume(math.isfinite(scale))  # constant returns: EV is undefined (test_properties covers it)
    for key, want in base.items():
        got = permuted[key]
        if want.dim() == 2 or (want.dim() == 1 and key != "column means"):
            got = got[torch.argsort(order)]  # per-row and per-token outputs come back in the new order
        _compare(got, want, _dtype(batch), scale, key)


# --- chunking -----------------------------------------------------------------------------------


@pytest.mark.clause("PG-2", "PG-3", "PG-4", "PG-5")
@given(cs.policy_batches(dtypes=(torch.float64,)), st.data())
def test_chunked_losses_recombine_by_token_counts(batch: cs.PolicyBatch, data: st.DataObject) -> None:
    rows = batch.mask.shape[0]
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, rows - 1)), max_size=3), label="cuts")))
    bounds = [0, *[c for c in cuts if 0 < c < rows], rows]
    whole = ppo_ref.policy_loss(
        batch.logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_eps, batch.loss_agg
    )
    by_tokens = batch.loss_agg == "token-mean"
    keep = batch.mask != 0
    total_weight = int(keep.sum()) if by_tokens else int(keep.any(dim=1).sum())
    stats = ("loss", "clipfrac", "ratio_outside_frac", "approx_kl", "ratio_mean")
    recombined = dict.fromkeys(stats, 0.0)
    for start, stop in itertools.pairwise(bounds):
        part = _rows(batch, torch.arange(start, stop))
        result = ppo_ref.policy_loss(
            part.logp, part.old_logp, part.advantages, part.mask, part.clip_eps, part.loss_agg
        )
        chunk_keep = part.mask != 0
        tokens = int(chunk_keep.sum())
        weight = tokens if by_tokens else int(chunk_keep.any(dim=1).sum())
        recombined["loss"] += float(result.loss) * weight / max(total_weight, 1)
        for stat in stats[1:]:  # the statistics are token means whatever the loss aggregation
            recombined[stat] += float(getattr(result, stat)) * tokens / max(int(keep.sum()), 1)
    ratio_max = max(
        float(ppo_ref.policy_loss(p.logp, p.old_logp, p.advantages, p.mask, p.clip_eps).ratio_max)
        for p in (_rows(batch, torch.arange(a, z)) for a, z in itertools.pairwise(bounds))
    )
    assert float(whole.ratio_max) == ratio_max
    for stat in stats:
        # clipfrac and ratio_outside_frac are float32 shares (see test_properties).
        tol = 1e-6 if stat in ("clipfrac", "ratio_outside_frac") else 1e-9
        assert math.isclose(float(getattr(whole, stat)), recombined[stat], rel_tol=tol, abs_tol=tol * 100), (
            stat
        )
