"""The task registry and the builders: determinism, wiring, and the warmed-up models' quality."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import GPT2ForSequenceClassification, GPT2LMHeadModel

from ppo_ref.tasks import DEFAULT_TASK, TASKS, Task, get_task
from ppo_ref.tasks.length import build_length
from ppo_ref.tasks.models import reward_model_scores, sample_responses
from ppo_ref.tasks.reverse import build_reverse
from ppo_ref.tasks.review import (
    LEXICON,
    build_positive_review,
    build_positive_review_rm,
    preference_pairs,
    review_well_formed,
    sentiment_score,
)

QUICK: dict[str, Callable[[int], Task]] = {
    "positive-review": lambda seed: build_positive_review(seed, sft_steps=3),
    "positive-review-rm": lambda seed: build_positive_review_rm(seed, sft_steps=3, rm_steps=3),
    "reverse": lambda seed: build_reverse(seed, sft_steps=3),
    "length": lambda seed: build_length(seed, sft_steps=3),
}


def test_registry() -> None:
    offline = {"positive-review", "positive-review-rm", "reverse", "length"}
    assert set(TASKS) == offline | {"smollm2-sentiment"}  # the real-model preset (tests/reliability)
    assert set(QUICK) == offline
    assert DEFAULT_TASK == "positive-review"
    with pytest.raises(
        ValueError, match="length, positive-review, positive-review-rm, reverse, smollm2-sentiment"
    ):
        get_task("sentiment", 0)
    with pytest.raises(ValueError, match="seed"):
        get_task("reverse", -1)


def _parameters(model: Any) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=[pytest.mark.slow] if name.endswith("-rm") else []) for name in sorted(QUICK)],
)
def test_build_is_deterministic_and_wired(name: str) -> None:
    task, again, other = QUICK[name](0), QUICK[name](0), QUICK[name](1)
    assert task.name == name
    assert isinstance(task.policy, GPT2LMHeadModel) and not task.policy.training
    assert (list(task.train_prompts), list(task.eval_prompts)) == (
        list(again.train_prompts),
        list(again.eval_prompts),
    )
    assert list(task.train_prompts) != list(other.train_prompts)
    assert not set(task.train_prompts) & set(task.eval_prompts)
    for a, b in zip(_parameters(task.policy), _parameters(again.policy), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(task.policy.lm_head.weight, other.policy.lm_head.weight)
    # Scored either by a rule or by a reward model; the tokenizer pads on the left; prompts are known text.
    assert (task.reward_function is None) != (task.reward_model is None)
    assert (
        task.tokenizer.padding_side == "left" and task.tokenizer.pad_token_id != task.tokenizer.eos_token_id
    )
    for ids in task.tokenizer(list(task.eval_prompts))["input_ids"]:
        assert task.tokenizer.unk_token_id not in ids
    longest_prompt = max(len(p) for p in [*task.train_prompts, *task.eval_prompts])
    assert longest_prompt + task.config_overrides["max_new_tokens"] <= task.policy.config.n_positions
    assert task.well_formed is not None
    if task.reward_model is not None:
        assert isinstance(task.reward_model, GPT2ForSequenceClassification)
        assert task.reward_model.config.pad_token_id == task.tokenizer.pad_token_id
        assert task.eval_reward_function is sentiment_score
        for a, b in zip(_parameters(task.reward_model), _parameters(again.reward_model), strict=True):
            assert torch.equal(a, b)


def test_rm_task_shares_the_positive_review_policy() -> None:
    plain, with_rm = QUICK["positive-review"](2), QUICK["positive-review-rm"](2)
    for a, b in zip(_parameters(plain.policy), _parameters(with_rm.policy), strict=True):
        assert torch.equal(a, b)
    assert list(plain.eval_prompts) == list(with_rm.eval_prompts)


@pytest.fixture(scope="module")
def review_rm_task() -> Task:
    """The full default ``positive-review-rm`` build (its policy is the ``positive-review`` one)."""
    return get_task("positive-review-rm", 0)


@pytest.mark.slow
def test_warmed_up_review_policy_is_well_formed_and_neutral(review_rm_task: Task) -> None:
    task = review_rm_task
    prompts = [task.eval_prompts[i % len(task.eval_prompts)] for i in range(64)]
    responses, ended = sample_responses(task.policy, task.tokenizer, prompts, 32, temperature=1.0, seed=11)
    scores = [s if stop else -1.0 for s, stop in zip(sentiment_score(prompts, responses), ended, strict=True)]
    well_formed = [review_well_formed(p, r) and e for p, r, e in zip(prompts, responses, ended, strict=True)]
    well_formed_rate, mean_score = sum(well_formed) / 64, sum(scores) / 64
    print(
        f"warmed-up positive-review policy: well-formed {well_formed_rate:.3f}, mean score {mean_score:.3f}"
    )
    # Measured at build seed 0, sampling seed 11: well-formed 0.97, mean score -0.16 (with 256 samples
    # at sampling seed 1: 0.91 and -0.08).
    assert well_formed_rate >= 0.8
    assert -0.4 <= mean_score <= 0.2
    # Neutral means both kinds of review appear, not that the policy is confused.
    assert {1.0, -1.0} <= {s for s, w in zip(scores, well_formed, strict=True) if w}


def _held_out_agreement(task: Task, contrast_rate: float) -> tuple[float, float]:
    """Correlation with the rule score and pair accuracy over 300 pairs on prompts never trained on."""
    assert task.reward_model is not None
    pairs = preference_pairs(task.eval_prompts, 300, seed=999, contrast_rate=contrast_rate)
    prompts = [p.prompt for p in pairs] * 2
    responses = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    rule = torch.tensor(sentiment_score(prompts, responses))
    texts = [prompt + response for prompt, response in zip(prompts, responses, strict=True)]
    learned = reward_model_scores(task.reward_model, task.tokenizer, texts)
    correlation = float(torch.corrcoef(torch.stack([rule, learned]))[0, 1])
    accuracy = float((learned[:300] > learned[300:]).float().mean())
    return correlation, accuracy


@pytest.mark.slow
def test_reward_model_agrees_with_the_rule_on_held_out_pairs(review_rm_task: Task) -> None:
    # Independent random pairs, 15% of the responses with a typo: measured correlation 0.75, accuracy
    # 0.92 on an AMD EPYC; 0.66 and 0.87 on an Intel Xeon with AVX-512/AMX (the task's models train to
    # other weights there: float rounding differs by CPU). The bounds hold on both; a reward model that
    # learned nothing scores a correlation near 0 and an accuracy near 0.5.
    correlation, accuracy = _held_out_agreement(review_rm_task, contrast_rate=0.0)
    assert correlation >= 0.6
    assert accuracy >= 0.85
    # A response against the same one with a typo: the hard case, measured accuracy 0.64 on the EPYC,
    # 0.69 on the Xeon (chance 0.5).
    assert _held_out_agreement(review_rm_task, contrast_rate=1.0)[1] >= 0.58


@pytest.mark.slow
def test_reward_model_has_unit_spread_on_warm_up_texts(review_rm_task: Task) -> None:
    assert review_rm_task.reward_model is not None
    rng = random.Random(5)
    adjectives = sorted(LEXICON)
    texts = [
        f"{rng.choice(review_rm_task.eval_prompts)} {rng.choice(adjectives)} and {rng.choice(adjectives)}."
        for _ in range(512)
    ]
    spread = float(reward_model_scores(review_rm_task.reward_model, review_rm_task.tokenizer, texts).std())
    assert 0.8 < spread < 1.25  # exactly 1 on the build's own 512 texts from the train prompts
