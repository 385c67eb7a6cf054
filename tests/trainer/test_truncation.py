"""The kept set of top-k / top-p sampling (ppo_ref.trainer.truncation): its count and its mass.

The rollout correction replays the sampler's kept set by its size, so these must agree with what
the sampler draws from (``sampling_logprob``): ``log q(y) = log p(y) - support_logmass`` on the set.
"""

from __future__ import annotations

import math

import pytest
import torch

from ppo_ref.trainer.generation import sampling_logprob
from ppo_ref.trainer.truncation import kept_count, kept_in_sorted, support_logmass


def test_the_docstring_examples_by_hand() -> None:
    assert kept_in_sorted(torch.tensor([0.5, 0.3, 0.2]), 0, 0.6).tolist() == [True, True, False]
    assert kept_in_sorted(torch.tensor([0.5, 0.3, 0.2]), 1, 1.0).tolist() == [True, False, False]
    logits = torch.tensor([[2.0, 1.0, 0.0]])  # p = [0.665, 0.245, 0.090]
    assert kept_count(logits, 1.0, 0, 0.8).tolist() == [2]
    assert kept_count(logits, 1.0, 1, 1.0).tolist() == [1]
    assert kept_count(logits, 1.0, 0, 1.0).tolist() == [3]
    two = math.log((math.exp(2) + math.exp(1)) / (math.exp(2) + math.exp(1) + 1))
    assert float(support_logmass(logits, torch.tensor([2]), 1.0)) == pytest.approx(two, abs=1e-7)
    assert two == pytest.approx(-0.0943, abs=1e-4)
    assert float(support_logmass(logits, torch.tensor([3]), 1.0)) == 0.0  # exactly: the whole vocabulary
    # A mass of exactly top_p before a token stops there (the smallest set reaching top_p).
    assert kept_in_sorted(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64), 0, 0.5).tolist() == [
        True,
        False,
        False,
    ]


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, 0, 0.7), (0.6, 4, 1.0), (1.4, 5, 0.9)])
def test_the_samplers_logprob_is_the_full_one_less_the_kept_logmass(
    temperature: float, top_k: int, top_p: float
) -> None:
    logits = torch.randn(64, 12, generator=torch.Generator().manual_seed(3)) * 2
    counts = kept_count(logits, temperature, top_k, top_p)
    assert bool((counts >= 1).all()) and bool((counts < 12).any())  # some step truncates
    full = torch.log_softmax(logits / temperature, dim=-1).double()
    ranks = full.argsort(dim=-1, descending=True).argsort(dim=-1)  # 0 = the most probable
    for token in range(12):
        tokens = torch.full((64,), token)
        q = sampling_logprob(logits, tokens, temperature, top_k, top_p)
        kept = ranks[:, token] < counts
        assert torch.equal(torch.isfinite(q), kept)  # the kept set is the `count` most probable
        expected = full[:, token] - support_logmass(logits, counts, temperature)
        assert torch.allclose(q[kept], expected[kept], atol=1e-6, rtol=0)


def test_the_logmass_follows_the_counts_over_any_batch_shape() -> None:
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0))
    counts = torch.randint(1, 8, (2, 3), generator=torch.Generator().manual_seed(1))
    got = support_logmass(logits, counts, 0.8)
    probs = torch.softmax(logits.double() / 0.8, dim=-1).sort(dim=-1, descending=True).values
    for i in range(2):
        for j in range(3):
            assert float(got[i, j]) == pytest.approx(
                math.log(float(probs[i, j, : counts[i, j]].sum())), abs=1e-6
            )


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: kept_count(torch.zeros(2, 3), 0.0, 0, 0.9), "temperature"),
        (lambda: kept_count(torch.zeros(2, 3), 1.0, -1, 0.9), "top_k"),
        (lambda: kept_count(torch.zeros(2, 3), 1.0, 2.5, 0.9), "top_k"),  # type: ignore[arg-type]
        (lambda: kept_count(torch.zeros(2, 3), 1.0, 0, 0.0), "top_p"),
        (lambda: kept_count(torch.zeros(2, 3), 1.0, 0, float("nan")), "top_p"),
        (lambda: kept_count(torch.zeros(()), 1.0, 0, 0.9), "logits"),
        (lambda: kept_in_sorted(torch.zeros(3), 0, 1.5), "top_p"),
        (lambda: support_logmass(torch.zeros(2, 3), torch.ones(2, dtype=torch.long), -1.0), "temperature"),
        (lambda: support_logmass(torch.zeros(2, 3), torch.ones(3, dtype=torch.long), 1.0), "counts"),
        (lambda: support_logmass(torch.zeros(2, 3), torch.ones(2), 1.0), "counts"),  # floats
        (lambda: support_logmass(torch.zeros(2, 3), torch.tensor([1, 4]), 1.0), "counts"),  # > V
        (lambda: support_logmass(torch.zeros(2, 3), torch.tensor([0, 1]), 1.0), "counts"),  # < 1
    ],
)
def test_bad_arguments_are_refused_by_name(call: object, argument: str) -> None:
    with pytest.raises(ValueError, match=f"^{argument}:"):
        call()  # type: ignore[operator]
