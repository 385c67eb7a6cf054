"""tests/env_helpers/step_formula.py, the formula side of the third-party step tests, checked here
in the main environment (the step tests run it only inside the libraries' environments)."""

from __future__ import annotations

import pytest
import torch

from ppo_ref.adapters.step import example_batch
from tests.env_helpers.step_formula import (
    completion_logprobs,
    group_advantages,
    ratio_one_surrogate,
    refusals,
)


def _run(batch: object, *, loss_mode: str = "token-mean", micro_batches: int = 1) -> None:
    if loss_mode != "token-mean":
        raise ValueError(f"loss_mode: expected 'token-mean', got {loss_mode!r}")
    if micro_batches == 3:
        raise ValueError("micro_batches: 3 does not divide 8 rows")


def test_refusals_name_each_refused_argument_in_order_and_skip_accepted_calls() -> None:
    calls = ({"loss_mode": "bnpo"}, {}, {"micro_batches": 3}, {"micro_batches": 2})
    assert refusals(_run, None, calls) == ["loss_mode", "micro_batches"]


def test_group_advantages_are_centred_and_scaled_per_group() -> None:
    batch = example_batch(budget=6, prompt_length=9)
    advantages = group_advantages(batch, 1e-6).view(-1, batch.group_size)
    scores = torch.tensor(batch.scores).view(-1, batch.group_size)
    assert advantages.sum(dim=1).abs().max() < 1e-6
    expected = (scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-6)
    assert torch.equal(advantages, expected)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=example_batch().vocab_size, n_layer=1, n_head=2, n_embd=8, n_positions=32)
    return GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("per_token", [True, False])
def test_the_surrogate_at_ratio_one_weighs_rows_as_its_mode_says(
    model: torch.nn.Module, per_token: bool
) -> None:
    """Token-mean: each token 1/N; seq-mean-token-mean: each row 1/m, its tokens 1/|c_i| of that."""
    batch = example_batch(budget=6, prompt_length=9)
    advantages = group_advantages(batch, 1e-6)
    rows = range(2, 6)
    loss, value = ratio_one_surrogate(model, batch, advantages, rows, per_token)
    lengths = {i: len(batch.completions[i]) for i in rows}
    logprobs = {i: completion_logprobs(model, batch, i).detach() for i in rows}
    if per_token:
        tokens = sum(lengths.values())
        expected = -sum(float(advantages[i]) * float(logprobs[i].sum()) for i in rows) / tokens
        expected_value = -sum(float(advantages[i]) * lengths[i] for i in rows) / tokens
    else:
        expected = -sum(float(advantages[i]) * float(logprobs[i].mean()) for i in rows) / len(rows)
        expected_value = -sum(float(advantages[i]) for i in rows) / len(rows)
    assert abs(loss.item() - expected) < 1e-6 and abs(value - expected_value) < 1e-12
    assert loss.requires_grad  # the loss a step test differentiates
