"""Hypothesis properties: every public function of ppo_ref against its plain-loop oracle.

Each test names the spec clauses it exercises with ``@pytest.mark.clause``; the last tests check that
every clause id (IN-2 aside, which ``test_validation.py`` covers) has a Hypothesis property.
Tolerances are those of ``oracles.tolerance``: 1e-5 for float32 results, 1e-9 for float64.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import oracles
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import ppo_ref
from conformance import strategies as cs

CLAUSES = (
    "LOGP-1", "LOGP-2", "LOGP-3", "ENT-1",
    "MASK-1", "MASK-2", "MASK-3",
    "KL-1", "KL-2", "KL-3", "KL-4",
    "RWD-1", "RWD-2", "RWD-3",
    "GAE-1", "GAE-2", "GAE-3", "GAE-4",
    "PG-1", "PG-2", "PG-3", "PG-4", "PG-5", "PG-6", "PG-7",
    "VF-1", "VF-2", "PEN-1", "PEN-2", "EV-1", "KLC-1", "KLC-2",
    "IN-1", "IN-2",
    "GRP-1", "GRP-2", "GRP-3", "GRP-4",
    "AGG-1", "AGG-2", "AGG-3",
    "CLIP-1", "CLIP-2", "CLIP-3",
    "GSPO-1", "GSPO-2", "GSPO-3",
    "CISPO-1", "CISPO-2",
    "KLL-1", "KLL-2", "KLL-3",
    "IS-1", "IS-2", "IS-3",
    "RPP-1", "RPP-2",
)  # fmt: skip
"""Every clause id of the spec (the list in the project's ground rules)."""


def _bound(t: torch.Tensor) -> torch.Tensor:
    return t != 0


def _scale(*tensors: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """Largest finite magnitude among the (masked-in) entries: the scale of the rounding errors."""
    largest = 0.0
    for t in tensors:
        picked = t.detach().double() if mask is None else t.detach().double()[_bound(mask)]
        picked = picked[torch.isfinite(picked)]
        if picked.numel():
            largest = max(largest, float(picked.abs().max()))
    return largest


# --- LOGP, ENT ----------------------------------------------------------------------------------


@pytest.mark.clause("LOGP-1", "LOGP-2", "LOGP-3")
@given(cs.logits_batches(id_dtypes=(torch.int64, torch.int32)))
def test_token_logprobs_matches_oracle(batch: cs.LogitsBatch) -> None:
    out = ppo_ref.token_logprobs(batch.logits, batch.input_ids, temperature=batch.temperature)
    rows, length, _ = batch.logits.shape
    assert out.shape == (rows, length - 1)
    # LOGP-3: half-precision logits are computed (and returned) in float32.
    assert out.dtype == (torch.float64 if batch.logits.dtype == torch.float64 else torch.float32)
    expected = oracles.token_logprobs(batch.logits, batch.input_ids, batch.temperature)
    scale = _scale(batch.logits) / batch.temperature
    oracles.assert_close_to_oracle(out, expected, out.dtype, scale=scale)
    assert bool((out <= 0).all())


@pytest.mark.clause("LOGP-1")
@given(cs.logits_batches(dtypes=(torch.float64,)), st.data())
def test_token_logprobs_position_i_reads_logits_i_and_token_i_plus_1(
    batch: cs.LogitsBatch, data: st.DataObject
) -> None:
    rows, _length, vocab = batch.logits.shape
    out = ppo_ref.token_logprobs(batch.logits, batch.input_ids, batch.temperature)
    # The last position's logits and the first token are never scored: changing them changes nothing.
    logits = batch.logits.clone()
    logits[:, -1] = data.draw(
        cs.float_tensors((rows, vocab), torch.float64, -10.0, 10.0), label="last logits"
    )
    ids = batch.input_ids.clone()
    ids[:, 0] = torch.tensor(data.draw(st.lists(st.integers(0, vocab - 1), min_size=rows, max_size=rows)))
    assert torch.equal(ppo_ref.token_logprobs(logits, ids, batch.temperature), out)


@pytest.mark.clause("LOGP-2")
@given(cs.logits_batches(dtypes=(torch.float64,), banned_tokens=False))
def test_token_logprobs_temperature_divides_the_logits(batch: cs.LogitsBatch) -> None:
    scaled = ppo_ref.token_logprobs(batch.logits / batch.temperature, batch.input_ids)
    out = ppo_ref.token_logprobs(batch.logits, batch.input_ids, temperature=batch.temperature)
    torch.testing.assert_close(out, scaled, rtol=1e-12, atol=1e-12)


@pytest.mark.clause("ENT-1", "LOGP-3")
@given(cs.logits_batches())
def test_entropy_matches_oracle(batch: cs.LogitsBatch) -> None:
    out = ppo_ref.entropy(batch.logits)
    assert out.shape == batch.logits.shape[:2]
    assert out.dtype == (torch.float64 if batch.logits.dtype == torch.float64 else torch.float32)
    expected = oracles.entropy(batch.logits)
    oracles.assert_close_to_oracle(out, expected, out.dtype, scale=_scale(batch.logits))
    vocab = batch.logits.shape[-1]
    slack = 10 * oracles.tolerance(out.dtype) * max(1.0, _scale(batch.logits))
    assert bool((out >= -slack).all()) and bool((out <= math.log(vocab) + slack).all())


# --- MASK ---------------------------------------------------------------------------------------


@pytest.mark.clause("MASK-1")
@given(cs.masked_batches(ndims=(0, 1, 2, 3)), st.data())
def test_masked_mean_matches_oracle(batch: cs.MaskedBatch, data: st.DataObject) -> None:
    ndim = batch.x.dim()
    dim = data.draw(st.sampled_from([None, *range(-ndim, ndim)]), label="dim")
    out = ppo_ref.masked_mean(batch.x, batch.mask, dim=dim)
    expected = oracles.masked_mean(batch.x, batch.mask, dim)
    oracles.assert_close_to_oracle(out, expected, batch.x.dtype, scale=_scale(batch.x, mask=batch.mask))
    assert bool(torch.isfinite(out).all())
    if dim is None:
        assert out.dim() == 0
        if not bool(_bound(batch.mask).any()):
            assert float(out) == 0.0


@pytest.mark.clause("MASK-2")
@given(cs.masked_batches(ndims=(1, 2, 3), min_tokens=2), st.booleans())
def test_masked_var_matches_oracle(batch: cs.MaskedBatch, unbiased: bool) -> None:
    out = ppo_ref.masked_var(batch.x, batch.mask, unbiased=unbiased)
    assert out.dim() == 0
    expected = oracles.masked_var(batch.x, batch.mask, unbiased)
    # Rounding errors scale with x^2 (the squares are summed), not with the variance.
    scale = _scale(batch.x, mask=batch.mask) ** 2
    oracles.assert_close_to_oracle(out, expected, batch.x.dtype, scale=scale)


@pytest.mark.clause("MASK-3")
@given(cs.masked_batches(ndims=(1, 2, 3), min_tokens=2), st.booleans(), st.booleans())
def test_masked_whiten_matches_oracle(batch: cs.MaskedBatch, shift_mean: bool, unbiased: bool) -> None:
    """(x - mean) / sqrt(var + 1e-8) with the unbiased (n - 1) or, ``unbiased=False``, biased (n) variance."""
    out = ppo_ref.masked_whiten(batch.x, batch.mask, shift_mean=shift_mean, unbiased=unbiased)
    assert out.shape == batch.x.shape
    expected = oracles.masked_whiten(batch.x, batch.mask, shift_mean, unbiased)
    # An error of tol * |x| in the centred value is divided by the standard deviation (+ 1e-8).
    largest = _scale(batch.x, mask=batch.mask)
    std = math.sqrt(oracles.masked_var(batch.x, batch.mask, unbiased) + oracles.WHITEN_EPS)
    oracles.assert_close_to_oracle(out, expected, batch.x.dtype, scale=largest / std + largest)
    assert bool((out[~_bound(batch.mask)] == 0).all())


# --- KL, RWD ------------------------------------------------------------------------------------


@pytest.mark.clause("KL-1", "KL-2", "KL-3")
@given(cs.kl_batches())
def test_kl_penalty_matches_oracle(batch: cs.KLBatch) -> None:
    out = ppo_ref.kl_penalty(batch.logp, batch.ref_logp, batch.estimator, mask=batch.mask)
    expected = oracles.kl_penalty(batch.logp, batch.ref_logp, batch.estimator, batch.mask)
    scale = _scale(batch.logp, batch.ref_logp, mask=batch.mask)
    oracles.assert_close_to_oracle(out, expected, batch.logp.dtype, scale=scale)
    if batch.estimator in ("k2", "k3"):
        assert bool((out >= 0).all())


@st.composite
def _distribution_pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    vocab = draw(st.integers(2, 8))
    logits = draw(cs.float_tensors((2, vocab), torch.float64, -4.0, 4.0))
    return torch.log_softmax(logits[0], -1), torch.log_softmax(logits[1], -1)


@pytest.mark.clause("KL-4", "KL-1", "KL-2", "KL-3")
@given(_distribution_pairs())
def test_kl_estimators_expectation_under_the_policy(pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    log_pi, log_ref = pair
    pi = log_pi.exp().tolist()
    exact = math.fsum(p * (a - b) for p, a, b in zip(pi, log_pi.tolist(), log_ref.tolist(), strict=True))
    reverse = math.fsum(math.exp(b) * (b - a) for a, b in zip(log_pi.tolist(), log_ref.tolist(), strict=True))
    expectation = {}
    for estimator in cs.KL_ESTIMATORS:
        # Every token of the vocabulary as one sample, weighted by pi: the exact expectation under pi.
        per_token = ppo_ref.kl_penalty(log_pi[None], log_ref[None], estimator)[0].tolist()
        expectation[estimator] = math.fsum(p * k for p, k in zip(pi, per_token, strict=True))
    assert math.isclose(expectation["k1"], exact, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(expectation["k3"], exact, rel_tol=1e-9, abs_tol=1e-12)
    half_square = math.fsum(
        p * 0.5 * (a - b) ** 2 for p, a, b in zip(pi, log_pi.tolist(), log_ref.tolist(), strict=True)
    )
    assert math.isclose(expectation["k2"], half_square, rel_tol=1e-9, abs_tol=1e-12)
    # Direction: the estimate is KL(pi || ref), not KL(ref || pi) (they differ unless pi == ref).
    if abs(exact - reverse) > 1e-6:
        assert not math.isclose(expectation["k1"], reverse, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.clause("RWD-1", "RWD-2", "RWD-3")
@given(cs.reward_batches())
def test_token_rewards_matches_oracle(batch: cs.RewardBatch) -> None:
    out = ppo_ref.token_rewards(
        batch.scores, batch.logp, batch.ref_logp, batch.mask, batch.kl_coef, batch.estimator
    )
    expected = oracles.token_rewards(
        batch.scores, batch.logp, batch.ref_logp, batch.mask, batch.kl_coef, batch.estimator
    )
    scale = _scale(batch.logp, batch.ref_logp, mask=batch.mask) ** 2 + _scale(batch.scores)
    oracles.assert_close_to_oracle(out, expected, batch.logp.dtype, scale=scale)
    keep = _bound(batch.mask)
    assert bool((out[~keep] == 0).all())
    empty_rows = ~keep.any(dim=1)
    assert bool((out[empty_rows] == 0).all())  # RWD-3


# --- GAE ----------------------------------------------------------------------------------------


@pytest.mark.clause("GAE-1", "GAE-2", "GAE-3", "GAE-4")
@given(cs.gae_batches())
def test_gae_matches_oracle(batch: cs.GAEBatch) -> None:
    advantages, returns = ppo_ref.gae(
        batch.rewards, batch.values, batch.mask, batch.gamma, batch.lam, batch.last_values
    )
    want_adv, want_ret = oracles.gae(
        batch.rewards, batch.values, batch.mask, batch.gamma, batch.lam, batch.last_values
    )
    scale = batch.rewards.shape[1] * (
        _scale(batch.rewards, batch.values, mask=batch.mask)
        + (0.0 if batch.last_values is None else _scale(batch.last_values))
    )
    oracles.assert_close_to_oracle(advantages, want_adv, batch.rewards.dtype, scale=scale)
    oracles.assert_close_to_oracle(returns, want_ret, batch.rewards.dtype, scale=scale)
    keep = _bound(batch.mask)
    # GAE-4: zero off the mask, returns = advantages + values on it, and not whitened.
    assert bool((advantages[~keep] == 0).all()) and bool((returns[~keep] == 0).all())
    torch.testing.assert_close(returns[keep], (advantages + batch.values)[keep])


@pytest.mark.clause("GAE-3")
@given(cs.gae_batches(bootstrap=True))
def test_gae_bootstrap_zero_is_terminal(batch: cs.GAEBatch) -> None:
    zeros = torch.zeros_like(batch.last_values)
    bootstrapped = ppo_ref.gae(batch.rewards, batch.values, batch.mask, batch.gamma, batch.lam, zeros)
    terminal = ppo_ref.gae(batch.rewards, batch.values, batch.mask, batch.gamma, batch.lam)
    torch.testing.assert_close(bootstrapped, terminal, rtol=0, atol=0)


# --- PG -----------------------------------------------------------------------------------------


def _check_policy_stats(
    result: ppo_ref.PolicyLossResult, want: oracles.PolicyLossOracle, dtype: torch.dtype
) -> None:
    slack = 1e-6  # the shares are count / count, computed in float32 (torch's default) whatever the dtype
    assert want.clipfrac_low - slack <= float(result.clipfrac) <= want.clipfrac_high + slack
    assert want.outside_low - slack <= float(result.ratio_outside_frac) <= want.outside_high + slack
    oracles.assert_close_to_oracle(result.approx_kl, want.approx_kl, dtype, scale=want.ratio_max)
    oracles.assert_close_to_oracle(result.ratio_mean, want.ratio_mean, dtype, scale=want.ratio_max)
    oracles.assert_close_to_oracle(result.ratio_max, want.ratio_max, dtype, scale=want.ratio_max)


@pytest.mark.clause("PG-1", "PG-2", "PG-3", "PG-4", "PG-5")
@given(cs.policy_batches())
def test_policy_loss_matches_oracle(batch: cs.PolicyBatch) -> None:
    result = ppo_ref.policy_loss(
        batch.logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_eps, batch.loss_agg
    )
    dtype = batch.logp.dtype
    want = oracles.policy_loss(
        batch.logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_eps, batch.loss_agg,
        tie_tol=10 * oracles.tolerance(dtype),
    )  # fmt: skip
    for field in ("loss", "clipfrac", "ratio_outside_frac", "approx_kl", "ratio_mean", "ratio_max"):
        assert getattr(result, field).dim() == 0, field
    summed = batch.loss_agg == "seq-mean-token-sum"
    scale = want.max_abs_objective * (batch.logp.shape[1] if summed else 1)
    oracles.assert_close_to_oracle(result.loss, want.loss, dtype, scale=scale)
    _check_policy_stats(result, want, dtype)


@pytest.mark.clause("PG-2")
@given(cs.policy_batches(), st.data())
def test_aggregate_loss_matches_oracle(batch: cs.PolicyBatch, data: st.DataObject) -> None:
    per_token = batch.advantages  # any (B, T) per-token values will do; junk off the mask included
    loss_agg = data.draw(cs.loss_aggregations(), label="loss_agg")
    out = ppo_ref.aggregate_loss(per_token, batch.mask, loss_agg)
    expected = oracles.aggregate_loss(per_token, batch.mask, loss_agg)
    scale = _scale(per_token, mask=batch.mask) * batch.mask.shape[1]
    oracles.assert_close_to_oracle(out, expected, per_token.dtype, scale=scale)


@pytest.mark.clause("PG-7", "PG-3", "PG-5")
@given(cs.policy_batches(junk=False))
def test_policy_loss_step0_identity(batch: cs.PolicyBatch) -> None:
    result = ppo_ref.policy_loss(batch.old_logp, batch.old_logp, batch.advantages, batch.mask, batch.clip_eps)
    keep = _bound(batch.mask)
    assert float(result.clipfrac) == 0.0 and float(result.ratio_outside_frac) == 0.0
    assert float(result.approx_kl) == 0.0
    assert float(result.ratio_mean) == 1.0 and float(result.ratio_max) == 1.0
    mean_advantage = oracles.masked_mean(batch.advantages, batch.mask)
    oracles.assert_close_to_oracle(result.loss, -mean_advantage, batch.logp.dtype, scale=5.0)
    assert bool(keep.any())


@pytest.mark.clause("PG-6")
@given(cs.policy_batches(junk=True), cs.loss_aggregations())
def test_policy_loss_without_action_tokens_is_zero(batch: cs.PolicyBatch, loss_agg: str) -> None:
    nothing = torch.zeros_like(batch.mask)
    logp = cs.fill_masked(batch.logp, nothing, math.nan).requires_grad_(True)
    result = ppo_ref.policy_loss(logp, batch.old_logp, batch.advantages, nothing, batch.clip_eps, loss_agg)
    for field in ("loss", "clipfrac", "ratio_outside_frac", "approx_kl", "ratio_mean", "ratio_max"):
        assert float(getattr(result, field).detach()) == 0.0, field
    result.loss.backward()
    assert logp.grad is not None and bool((logp.grad == 0).all())


# --- VF, PEN, EV, KLC ---------------------------------------------------------------------------


@pytest.mark.clause("VF-1", "VF-2")
@given(cs.value_batches(), st.sampled_from(["max", "clipped-only"]))
def test_value_loss_matches_oracle(batch: cs.ValueBatch, clip_form: str) -> None:
    """The max form (default) and, ``clip_form="clipped-only"``, the clipped term alone."""
    args = (batch.values, batch.old_values, batch.returns, batch.mask, batch.clip_eps)
    out = ppo_ref.value_loss(*args, clip_form=clip_form)
    assert out.dim() == 0
    expected = oracles.value_loss(*args, clip_form)
    scale = (2 * _scale(batch.values, batch.old_values, batch.returns, mask=batch.mask)) ** 2
    oracles.assert_close_to_oracle(out, expected, batch.values.dtype, scale=scale)


@pytest.mark.clause("VF-1", "VF-2")
@given(cs.value_batches(clip=True, junk=False))
def test_clipped_value_loss_is_at_least_the_unclipped_one(batch: cs.ValueBatch) -> None:
    clipped = ppo_ref.value_loss(batch.values, batch.old_values, batch.returns, batch.mask, batch.clip_eps)
    plain = ppo_ref.value_loss(batch.values, batch.old_values, batch.returns, batch.mask)
    assert float(clipped) >= float(plain) * (1 - 1e-6)
    # Within the clip range everywhere, clipping changes nothing.
    inside = batch.old_values + (batch.values - batch.old_values).clamp(
        -batch.clip_eps / 2, batch.clip_eps / 2
    )
    torch.testing.assert_close(
        ppo_ref.value_loss(inside, batch.old_values, batch.returns, batch.mask, batch.clip_eps),
        ppo_ref.value_loss(inside, batch.old_values, batch.returns, batch.mask),
    )


@pytest.mark.clause("PEN-1")
@given(cs.penalty_batches())
def test_ppo_penalty_loss_matches_oracle(batch: cs.PenaltyBatch) -> None:
    result = ppo_ref.ppo_penalty_loss(batch.logp, batch.old_logp, batch.advantages, batch.mask, batch.beta)
    assert result.loss.dim() == 0 and result.kl.dim() == 0
    want_loss, want_kl = oracles.ppo_penalty_loss(
        batch.logp, batch.old_logp, batch.advantages, batch.mask, batch.beta
    )
    ratio_bound = math.exp(cs.LOG_RATIO_MAX)
    scale = ratio_bound * (5.0 + batch.beta)
    oracles.assert_close_to_oracle(result.loss, want_loss, batch.logp.dtype, scale=scale)
    oracles.assert_close_to_oracle(result.kl, want_kl, batch.logp.dtype, scale=ratio_bound)
    assert float(result.kl) >= 0.0


@pytest.mark.clause("PEN-2")
@given(
    st.floats(0.0, 100.0),
    st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.01 / 1.5, 0.015, 0.01])),
    st.one_of(st.just(0.01), st.floats(1e-4, 1.0)),
)
def test_update_penalty_beta_matches_oracle(beta: float, kl: float, target_kl: float) -> None:
    assert ppo_ref.update_penalty_beta(beta, kl, target_kl) == oracles.update_penalty_beta(
        beta, kl, target_kl
    )


@pytest.mark.clause("EV-1")
@given(cs.ev_batches())
def test_explained_variance_matches_oracle(batch: cs.EVBatch) -> None:
    out = ppo_ref.explained_variance(batch.values, batch.returns, batch.mask)
    assert out.dim() == 0
    expected = oracles.explained_variance(batch.values, batch.returns, batch.mask)
    assume(not math.isnan(expected))  # constant returns: test_explained_variance_of_constant_returns
    # Var[R] close to 0 next to R^2 is ill-conditioned: the error scales with (max |R| + |V|)^2 / Var[R].
    var_returns = oracles.masked_var(batch.returns, batch.mask)
    largest = _scale(batch.values, batch.returns, mask=batch.mask)
    assume(var_returns > 1e-3 * max(1.0, largest) ** 2)
    oracles.assert_close_to_oracle(out, expected, batch.values.dtype, scale=4 * largest**2 / var_returns)


@pytest.mark.clause("EV-1")
@given(cs.ev_batches(constant_returns=True, dtypes=(torch.float64,)))
def test_explained_variance_of_constant_returns_is_nan(batch: cs.EVBatch) -> None:
    out = ppo_ref.explained_variance(batch.values, batch.returns, batch.mask)
    assert math.isnan(float(out))


@pytest.mark.clause("KLC-1")
@given(cs.kl_controller_cases())
def test_adaptive_kl_controller_matches_oracle(case: cs.KLControllerCase) -> None:
    controller = ppo_ref.AdaptiveKLController(case.init_kl_coef, case.target, case.horizon)
    assert controller.value == case.init_kl_coef
    expected = oracles.adaptive_kl_coefs(case.init_kl_coef, case.target, case.horizon, case.updates)
    for (kl, n_steps), want in zip(case.updates, expected, strict=True):
        got = controller.update(kl, n_steps)
        assert got == controller.value
        assert math.isclose(got, want, rel_tol=1e-12)


@pytest.mark.clause("KLC-2")
@given(cs.kl_coefs(), cs.kl_controller_cases())
def test_fixed_kl_controller_never_moves(kl_coef: float, case: cs.KLControllerCase) -> None:
    controller = ppo_ref.FixedKLController(kl_coef)
    for kl, n_steps in case.updates:
        assert controller.update(kl, n_steps) == kl_coef
    assert controller.value == kl_coef


# --- clause coverage ----------------------------------------------------------------------------

PROPERTY_MODULES = (
    "test_properties",
    "test_invariances",
    "test_gradients",
    "test_family_properties",
    "test_family_gradients",
)


def _property_clauses() -> set[str]:
    """Clause ids on the ``clause`` markers of the Hypothesis tests in the property modules."""
    import importlib

    covered: set[str] = set()
    for name in PROPERTY_MODULES:
        module = importlib.import_module(name)
        for attribute in vars(module).values():
            if not callable(attribute) or not getattr(attribute, "is_hypothesis_test", False):
                continue
            for mark in getattr(attribute, "pytestmark", []):
                if mark.name == "clause":
                    covered.update(mark.args)
    return covered


def test_every_clause_has_a_property() -> None:
    covered = _property_clauses()
    missing = [c for c in CLAUSES if c != "IN-2" and c not in covered]
    assert not missing, f"clauses without a Hypothesis property: {missing}"
    unknown = covered - set(CLAUSES)
    assert not unknown, f"markers name clauses that are not in the spec: {sorted(unknown)}"


def test_every_clause_of_the_written_spec_has_a_property() -> None:
    spec = Path(__file__).resolve().parent.parent / "spec" / "SPEC.md"
    if not spec.exists():
        pytest.skip("spec/SPEC.md is not written yet")
    families = "|".join(sorted({c.split("-")[0] for c in CLAUSES}, key=len, reverse=True))
    in_spec = set(re.findall(rf"\b(?:{families})-\d+\b", spec.read_text(encoding="utf-8")))
    assert in_spec, "no clause ids found in spec/SPEC.md"
    missing = sorted(in_spec - {"IN-2"} - _property_clauses())
    assert not missing, f"clauses of spec/SPEC.md without a Hypothesis property: {missing}"
