"""The contract gaps closed by issue 11, part 6: the new convention keys and their reference
variants, the comparison rules they change (precision, off-mask outputs, unreported statistics),
and the report's whole first failure. Hand-computed values throughout."""

from __future__ import annotations

import math
from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest
import torch

import ppo_ref
from conformance import support
from conformance.cases import Case
from conformance.report import failure_lines
from conformance.variant import ReferenceVariant
from ppo_ref.adapters import ReferenceAdapter, convention_problems, parse_conventions

F64 = torch.float64


# --- masked_whiten: where the epsilon goes -------------------------------------------------------


@pytest.mark.parametrize(
    ("placement", "scale"),
    [
        ("inside-sqrt", 1 / math.sqrt(1.0 + 0.25)),  # var 1 (unbiased), eps 0.25
        ("outside-sqrt", 1 / (1.0 + 0.25)),
        ("clamp", 1 / math.sqrt(1.0)),  # max(var, eps) = var
    ],
)
def test_masked_whiten_eps_placement(placement: str, scale: float) -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 9.0], dtype=F64)
    mask = torch.tensor([1, 1, 1, 0])
    got = ppo_ref.masked_whiten(x, mask, eps=0.25, eps_placement=placement)
    torch.testing.assert_close(got, torch.tensor([-scale, 0.0, scale, 0.0], dtype=F64))


def test_masked_whiten_clamp_floors_a_small_variance() -> None:
    x = torch.tensor([1.0, 1.0 + 1e-3], dtype=F64)  # unbiased var 5e-7 < eps 1e-4
    got = ppo_ref.masked_whiten(x, torch.tensor([1, 1]), eps=1e-4, eps_placement="clamp")
    torch.testing.assert_close(got, torch.tensor([-5e-4, 5e-4], dtype=F64) / math.sqrt(1e-4))


@pytest.mark.parametrize(
    ("keyword", "value"), [("eps", 0.0), ("eps", -1.0), ("eps", math.nan), ("eps", True)]
)
def test_masked_whiten_rejects_a_bad_eps(keyword: str, value: object) -> None:
    with pytest.raises(ValueError, match=r"^eps:"):
        ppo_ref.masked_whiten(torch.ones(3), torch.ones(3), **{keyword: value})  # type: ignore[arg-type]


def test_masked_whiten_rejects_an_unknown_placement() -> None:
    with pytest.raises(ValueError, match=r"^eps_placement:"):
        ppo_ref.masked_whiten(torch.ones(3), torch.ones(3), eps_placement="after")


# --- the new keys: parsing -----------------------------------------------------------------------


def test_kl_estimators_is_the_old_name_of_reward_kl_estimators() -> None:
    old = parse_conventions({"kl_estimators": ["k1", "k3"]})
    assert old.reward_kl_estimators == frozenset({"k1", "k3"}) == old.kl_estimators
    assert old.kl_loss_estimators == frozenset({"k1", "k2", "k3", "k3+"})  # the loss KL: its own key
    problems = convention_problems({"kl_estimators": ["k1"], "reward_kl_estimators": ["k1"]})
    assert problems and "old name" in problems[0]


def test_compute_dtype_values() -> None:
    assert parse_conventions({"compute_dtype": "float32"}).float32_ops >= {"gae", "policy_loss"}
    per_op = parse_conventions({"compute_dtype": {"kl_penalty": "float32", "gae": "float64"}})
    assert per_op.float32_ops == frozenset({"kl_penalty"})
    assert "KL-1" in per_op.clauses() and "GAE-1" not in per_op.clauses()
    assert parse_conventions({"compute_dtype": {"gae": "float64"}}).deviations() == {}
    assert convention_problems({"compute_dtype": "float16"})
    assert convention_problems({"compute_dtype": {"no_such_op": "float32"}})


def test_off_mask_outputs_values() -> None:
    assert parse_conventions({"off_mask_outputs": "zero"}).deviations() == {}
    everything = parse_conventions({"off_mask_outputs": "unspecified"}).off_mask_outputs
    assert everything == frozenset(
        {"masked_whiten", "kl_penalty", "token_rewards", "gae", "rollout_correction"}
    )
    assert convention_problems({"off_mask_outputs": ["policy_loss"]})  # no per-token output


# --- the reference variants ----------------------------------------------------------------------


def test_score_clip_clamps_the_score_before_it_is_added() -> None:
    variant = ReferenceVariant(parse_conventions({"score_clip": 10}))
    logp = torch.zeros(2, 2, dtype=F64)
    mask = torch.tensor([[1, 1], [1, 0]])
    rewards = variant.token_rewards(torch.tensor([25.0, -3.0], dtype=F64), logp, logp, mask, 0.1)
    torch.testing.assert_close(rewards, torch.tensor([[0.0, 10.0], [-3.0, 0.0]], dtype=F64))


def test_neg_k1_is_the_mean_log_ratio() -> None:
    logp = torch.tensor([[0.0, -1.0, 5.0]], dtype=F64)
    old = torch.tensor([[-0.5, -0.5, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0]])
    result = ReferenceVariant(parse_conventions({"approx_kl": "neg-k1"})).policy_loss(
        logp, old, torch.ones(1, 3, dtype=F64), mask, 0.2
    )
    assert result.approx_kl is not None
    assert float(result.approx_kl) == pytest.approx((0.5 - 0.5) / 2)  # mean(logp - old): (0.5, -0.5)
    k1 = ReferenceVariant(parse_conventions({"approx_kl": "k1"})).policy_loss(logp + 1, old, old, mask, 0.2)
    neg = ReferenceVariant(parse_conventions({"approx_kl": "neg-k1"})).policy_loss(
        logp + 1, old, old, mask, 0.2
    )
    assert k1.approx_kl is not None and neg.approx_kl is not None
    assert float(neg.approx_kl) == pytest.approx(-float(k1.approx_kl))


def test_clip_fraction_averaged_per_sequence() -> None:
    """Row 0: 1 of 1 token clipped; row 1: 0 of 3; row 2 empty. Token mean 1/4, sequence mean 1/2."""
    eps = 0.2
    logp = torch.tensor([[math.log(1.5), 0, 0], [0, 0, 0], [0, 0, 0]], dtype=F64)
    zeros = torch.zeros(3, 3, dtype=F64)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [0, 0, 0]])
    advantages = torch.ones(3, 3, dtype=F64)
    plain = ReferenceVariant().policy_loss(logp, zeros, advantages, mask, eps)
    per_sequence = ReferenceVariant(parse_conventions({"clipfrac_agg": "seq-mean-token-mean"})).policy_loss(
        logp, zeros, advantages, mask, eps
    )
    assert plain.clipfrac is not None and per_sequence.clipfrac is not None
    assert float(plain.clipfrac) == pytest.approx(0.25)
    assert float(per_sequence.clipfrac) == pytest.approx(0.5)
    torch.testing.assert_close(per_sequence.loss, plain.loss)  # the loss is unchanged


def test_whiten_eps_keys_reach_masked_whiten_and_gae_whitening() -> None:
    c = parse_conventions(
        {"whiten_eps": 0.25, "whiten_eps_placement": "outside-sqrt", "gae_whitening": "unbiased"}
    )
    variant = ReferenceVariant(c)
    x = torch.tensor([1.0, 2.0, 3.0, 9.0], dtype=F64)
    mask = torch.tensor([1, 1, 1, 0])
    torch.testing.assert_close(variant.masked_whiten(x, mask), torch.tensor([-0.8, 0.0, 0.8, 0.0], dtype=F64))
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=F64)
    values = torch.zeros(1, 3, dtype=F64)
    advantages, _ = variant.gae(rewards, values, torch.ones(1, 3), 1.0, 1.0)
    torch.testing.assert_close(advantages, torch.zeros(1, 3, dtype=F64))  # all equal: centred to 0


# --- how the suite compares ------------------------------------------------------------------------


class _Leaky:
    """gae right on the mask, 7 off it."""

    name, version, provenance = "leaky", "0", "test"
    ops = frozenset({"gae"})
    conventions = MappingProxyType({"off_mask_outputs": ["gae"], "compute_dtype": {"gae": "float32"}})

    @staticmethod
    def gae(rewards, values, mask, gamma, lam, last_values=None):  # type: ignore[no-untyped-def]
        advantages, returns = ppo_ref.gae(rewards, values, mask, gamma, lam)
        keep = mask != 0
        return torch.where(keep, advantages, 7.0), torch.where(keep, returns, 7.0)


def test_compared_adapter_zeroes_unspecified_off_mask_outputs_and_marks_float32() -> None:
    conventions = parse_conventions(_Leaky.conventions)
    compared: Any = support.compared_adapter(_Leaky(), conventions)
    support.configure_precision(conventions.float32_ops)
    try:
        assert support.tolerance(F64) == (1e-7, 1e-7)
        rewards = torch.tensor([[1.0, 0.0]], dtype=F64)
        advantages, returns = compared.gae(
            rewards, torch.zeros(1, 2, dtype=F64), torch.tensor([[1, 0]]), 1.0, 1.0
        )
        torch.testing.assert_close(advantages, torch.tensor([[1.0, 0.0]], dtype=F64))
        torch.testing.assert_close(returns, torch.tensor([[1.0, 0.0]], dtype=F64))
        assert support.tolerance(F64) == support.FLOAT32_COMPUTE_TOLERANCE  # gae was looked up
        assert support.computed_dtype(F64) == torch.float32
        support.begin_test()
        assert support.tolerance(F64) == (1e-7, 1e-7)
    finally:
        support.configure_precision(frozenset())
    assert support.compared_adapter(ReferenceAdapter(), parse_conventions({})).__class__ is ReferenceAdapter


def test_precision_case_widens_a_float64_case_of_a_float32_op() -> None:
    case = Case("GAE-1/x", "GAE-1", "gae", "d", "s", {}, {"advantages": [[200.0, "nan"]], "returns": [[1.0]]})
    ctx = SimpleNamespace(conventions=parse_conventions({"compute_dtype": "float32"}))
    widened = support.precision_case(ctx, case)  # type: ignore[arg-type]
    assert widened.atol == pytest.approx(1e-5 + 1e-5 * 200.0)
    same = support.precision_case(SimpleNamespace(conventions=parse_conventions({})), case)  # type: ignore[arg-type]
    assert same.atol == 1e-6


def test_one_rule_for_unreported_statistics() -> None:
    declared = SimpleNamespace(conventions=parse_conventions({"approx_kl": None}))
    result = SimpleNamespace(loss=1.0, clipfrac=0.5, approx_kl=0.1, ratio_mean=None)
    names = ["loss", "clipfrac", "approx_kl", "ratio_mean", "ratio_outside_frac"]
    # declared None: never checked, even when reported; optional: only when reported; others always
    assert support.checked_outputs(declared, "policy_loss", result, names) == ["loss", "clipfrac"]  # type: ignore[arg-type]
    plain = SimpleNamespace(conventions=parse_conventions({}))
    missing = SimpleNamespace(loss=1.0, clipfrac=None)
    assert support.checked_outputs(plain, "policy_loss", missing, names[:3]) == names[:3]  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match="declares the convention clipfrac: None"):
        support.statistic(missing, "clipfrac", "policy_loss")
    with pytest.raises(AssertionError, match="has no attribute 'approx_kl'"):
        support.statistic(missing, "approx_kl", "policy_loss")


# --- the report -------------------------------------------------------------------------------------


class _Group(Exception):
    """An exception group as failure_lines sees one (``exceptions``; ExceptionGroup on Python 3.11+)."""

    def __init__(self, message: str, exceptions: list[BaseException]) -> None:
        super().__init__(message)
        self.exceptions = tuple(exceptions)


def test_failure_lines_report_the_first_failure_of_a_group_whole() -> None:
    first = AssertionError("loss: 1 of 1 entries differ; first at index (): got 2.0, expected 1.0")
    first.__notes__ = ["# --- reproduction ---"]  # type: ignore[attr-defined]  # add_note (3.11)
    group = _Group("Hypothesis found 2 distinct failures.", [first, ValueError("second")])
    group.__notes__ = ["Falsifying example: ..."]  # type: ignore[attr-defined]
    assert failure_lines(group) == [
        "AssertionError: loss: 1 of 1 entries differ; first at index (): got 2.0, expected 1.0",
        "# --- reproduction ---",
        "Falsifying example: ...",
    ]
    with pytest.raises(ValueError, match=r"^error:"):
        failure_lines("not an exception")  # type: ignore[arg-type]
