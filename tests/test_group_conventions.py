"""The group-advantage convention keys of issue 11: ``group_singleton`` per method and
``constant_groups`` (a constant group's advantages are 0 up to the rounding of its mean)."""

from __future__ import annotations

import pytest
import torch

from conformance.variant import ReferenceVariant
from ppo_ref.adapters import parse_conventions
from ppo_ref.adapters.conventions import ConventionError, constant_group_bound, singleton_rule


def test_group_singleton_takes_one_rule_per_method() -> None:
    c = parse_conventions({"group_singleton": {"grpo": "raw-score", "rloo": "zero"}})
    assert singleton_rule(c.group_singleton, "grpo") == "raw-score"
    assert singleton_rule(c.group_singleton, "rloo") == "zero"
    assert singleton_rule(c.group_singleton, "dr_grpo") == "zero"  # left out: the reference
    assert parse_conventions({"group_singleton": {"rloo": "zero"}}).group_singleton == "zero"
    for bad in ({"ppo": "zero"}, {"grpo": "nan"}):
        with pytest.raises(ConventionError):
            parse_conventions({"group_singleton": bad})


def test_the_variant_applies_each_methods_singleton_rule() -> None:
    scores = torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64)
    ids = torch.tensor([0, 1, 1])
    variant = ReferenceVariant(parse_conventions({"group_singleton": {"grpo": "raw-score", "rloo": "zero"}}))
    grpo = variant.group_advantages(scores, ids, "grpo", eps=0.0)
    rloo = variant.group_advantages(scores, ids, "rloo")
    assert float(grpo[0]) == 3.0  # raw score: mean 0, std 1
    assert float(rloo[0]) == 0.0
    assert rloo[1:].tolist() == [-1.0, 1.0]


def test_constant_groups_rounding_bounds_the_mean_rounding_and_the_reference_stays_exact() -> None:
    scores = torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64)
    ids = torch.zeros(3, dtype=torch.long)
    rounded = scores - scores.sum() / 3  # what r - mean gives: -1.39e-17, not 0
    assert bool((rounded != 0).all())
    assert bool((rounded.abs() <= constant_group_bound(scores, 3)).all())
    assert constant_group_bound(scores, 3) < 1e-15  # a real baseline error would not hide in it
    c = parse_conventions({"constant_groups": "rounding"})
    assert c.clauses() == {"GRP-3": ["constant_groups='rounding'"], "GRP-4": ["constant_groups='rounding'"]}
    for method in ("grpo", "dr_grpo", "rloo"):  # the variant changes no value: still exactly 0
        assert ReferenceVariant(c).group_advantages(scores, ids, method).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ConventionError):
        parse_conventions({"constant_groups": "approximately"})
    with pytest.raises(ValueError, match="group_size"):
        constant_group_bound(scores, 0)


def test_constant_group_bound_covers_grpo_dividing_the_mean_rounding_by_std_plus_eps() -> None:
    # issue 28: rlinf's and verl's (r - mean) / (std + 1e-6) on three scores of -0.2 (float64) give
    # 2.8e-11, the mean's rounding over the eps: above the plain bound, inside the std_eps one
    scores = torch.tensor([-0.2, -0.2, -0.2], dtype=torch.float64)
    mean = scores.mean()
    got = (scores - mean) / (scores.std() + 1e-6)
    assert float(got.abs().max()) > 1e-11
    assert float(got.abs().max()) > constant_group_bound(scores, 3)
    assert bool((got.abs() <= constant_group_bound(scores, 3, std_eps=1e-6)).all())
    # still tight: a baseline off by one part in 1e6 of the score is not hidden
    assert constant_group_bound(scores, 3, std_eps=1e-6) < 1e-9
    assert constant_group_bound(scores, 3, std_eps=10.0) == constant_group_bound(scores, 3)
    with pytest.raises(ValueError, match="std_eps"):
        constant_group_bound(scores, 3, std_eps=0.0)


def test_the_verl_adapter_passes_the_engines_row_count_for_the_dr_grpo_mode_only() -> None:
    from ppo_ref.adapters.thirdparty.verl_family import engine_row_count

    mask = torch.tensor([[1, 1], [0, 0], [1, 0]])  # one row without an action token
    assert engine_row_count(mask, "seq-mean-token-sum-norm", None) == 3  # B: every row, as verl's engine
    assert engine_row_count(mask, "seq-mean-token-sum-norm", 8) == 8  # a whole-batch count wins
    for loss_agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        assert engine_row_count(mask, loss_agg, None) is None  # verl counts R itself
    assert engine_row_count(torch.zeros(0, 2), "seq-mean-token-sum-norm", None) is None
