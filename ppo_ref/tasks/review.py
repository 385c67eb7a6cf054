"""``positive-review`` and ``positive-review-rm``: steer short reviews towards positive adjectives.

Texts follow one grammar: a prompt ``"{det} {noun} was"`` (e.g. ``"the movie was"``) and a response
``" {adj} and {adj}."`` with adjectives from a lexicon of 8 positive (+1) and 8 negative (-1)
words. The supervised warm-up draws both adjectives uniformly from all 16, so the warmed-up policy
starts neutral (expected score 0).

* ``positive-review``: the reward is the rule score :func:`sentiment_score`.
* ``positive-review-rm``: the reward is a ``GPT2ForSequenceClassification`` trained first with a
  Bradley-Terry loss on generated preference pairs ranked by the rule score; the rule score stays
  available as ``Task.eval_reward_function`` (the true score, for evaluation only).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import NamedTuple

import torch

from ppo_ref.tasks._checks import check_prompts_responses, check_seed, check_texts
from ppo_ref.tasks.base import Task
from ppo_ref.tasks.char_task import build_char_task
from ppo_ref.tasks.models import (
    build_reward_model,
    reward_model_scores,
    tiny_gpt2_config,
    train_reward_model,
)

__all__ = [
    "DETERMINERS",
    "LEXICON",
    "NEGATIVE_ADJECTIVES",
    "NOUNS",
    "POSITIVE_ADJECTIVES",
    "PreferencePair",
    "build_positive_review",
    "build_positive_review_rm",
    "preference_pairs",
    "review_prompts",
    "review_well_formed",
    "sentiment_score",
]

POSITIVE_ADJECTIVES: tuple[str, ...] = ("good", "great", "nice", "fun", "lovely", "superb", "fine", "sweet")
NEGATIVE_ADJECTIVES: tuple[str, ...] = ("bad", "awful", "dull", "poor", "boring", "weak", "ugly", "bland")
LEXICON: dict[str, float] = {
    **{word: 1.0 for word in POSITIVE_ADJECTIVES},
    **{word: -1.0 for word in NEGATIVE_ADJECTIVES},
}
"""Adjective -> sentiment (+1 positive, -1 negative)."""
NOUNS: tuple[str, ...] = (
    "movie", "film", "book", "meal", "show", "game", "song", "play",
    "story", "cafe", "hotel", "album", "trip", "class", "team", "park",
)  # fmt: skip
DETERMINERS: tuple[str, ...] = ("the", "this", "that", "my", "our")
EVAL_PROMPT_COUNT = 16
"""Prompts held out for evaluation (of the 80 ``det noun was`` combinations)."""
MAX_NEW_TOKENS = 32
"""The longest well-formed response, ``" boring and boring."``, is 19 characters plus EOS."""

_RESPONSE = re.compile(r" ([a-z]+) and ([a-z]+)\.")


def review_prompts(seed: int) -> tuple[list[str], list[str]]:
    """All 80 ``"{det} {noun} was"`` prompts, shuffled by ``seed`` and split into (train, eval)."""
    check_seed(seed)
    prompts = [f"{det} {noun} was" for det in DETERMINERS for noun in NOUNS]
    random.Random(f"positive-review/prompts/{seed}").shuffle(prompts)
    return prompts[EVAL_PROMPT_COUNT:], prompts[:EVAL_PROMPT_COUNT]


def _adjectives(response: str) -> tuple[str, str] | None:
    match = _RESPONSE.fullmatch(response)
    if match is None or match.group(1) not in LEXICON or match.group(2) not in LEXICON:
        return None
    return match.group(1), match.group(2)


def review_well_formed(prompt: str, response: str) -> bool:
    """True when ``response`` is exactly ``" {adj} and {adj}."`` with both adjectives in the lexicon."""
    check_prompts_responses([prompt], [response])
    return _adjectives(response) is not None


def sentiment_score(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
    """Rule score in [-1, 1]: the mean lexicon value of the two adjectives; -1 for a malformed response.

    ``responses`` are the texts without EOS. Examples: ``" great and fun."`` scores 1.0,
    ``" great and dull."`` 0.0, ``" awful and dull."`` -1.0, and ``" grate and fun."``,
    ``" great and fun"`` (no full stop) or ``" great and fun. the"`` score -1.0.
    """
    check_prompts_responses(prompts, responses)
    scores: list[float] = []
    for response in responses:
        adjectives = _adjectives(response)
        scores.append(-1.0 if adjectives is None else (LEXICON[adjectives[0]] + LEXICON[adjectives[1]]) / 2)
    return scores


def _random_response(rng: random.Random) -> str:
    adjectives = list(LEXICON)
    return f" {rng.choice(adjectives)} and {rng.choice(adjectives)}."


def _sft_texts(prompts: Sequence[str], count: int, rng: random.Random) -> list[str]:
    return [rng.choice(prompts) + _random_response(rng) for _ in range(count)]


def _with_typo(response: str, rng: random.Random) -> str:
    """``response`` with one character substituted, deleted or inserted, so it no longer parses."""
    letters = "abcdefghijklmnopqrstuvwxyz ."
    while True:
        position = rng.randrange(len(response))
        kind = rng.choice(("substitute", "delete", "insert"))
        if kind == "substitute":
            changed = response[:position] + rng.choice(letters) + response[position + 1 :]
        elif kind == "delete":
            changed = response[:position] + response[position + 1 :]
        else:
            changed = response[:position] + rng.choice(letters) + response[position:]
        if changed and _adjectives(changed) is None:
            return changed


def _random_review(prompts: Sequence[str], typo_rate: float, rng: random.Random) -> tuple[str, str]:
    response = _random_response(rng)
    if rng.random() < typo_rate:
        response = _with_typo(response, rng)
    return rng.choice(prompts), response


class PreferencePair(NamedTuple):
    """One comparison: two responses to ``prompt``, ``chosen`` scoring strictly higher."""

    prompt: str
    chosen: str
    rejected: str


def preference_pairs(
    prompts: Sequence[str], count: int, seed: int, typo_rate: float = 0.15, contrast_rate: float = 0.5
) -> list[PreferencePair]:
    """``count`` preference pairs whose chosen response has the strictly higher :func:`sentiment_score`.

    A share ``contrast_rate`` of the pairs sets a response that scores above -1 against the same
    response with one typo (which makes it malformed), so the typo alone decides; the others are two
    independent responses with random adjectives, each with one typo with probability
    ``typo_rate``, redrawn when their scores are equal.
    """
    check_texts(prompts, "prompts")
    if len(prompts) == 0:
        raise ValueError("prompts: expected at least one prompt")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count: expected an int >= 1, got {count!r}")
    check_seed(seed)
    for name, rate in (("typo_rate", typo_rate), ("contrast_rate", contrast_rate)):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"{name}: expected a probability in [0, 1], got {rate!r}")
    rng = random.Random(f"positive-review/pairs/{seed}")
    pairs: list[PreferencePair] = []
    while len(pairs) < count:
        if rng.random() < contrast_rate:
            prompt, response = rng.choice(prompts), _random_response(rng)
            if sentiment_score([prompt], [response])[0] > -1.0:
                pairs.append(PreferencePair(prompt, response, _with_typo(response, rng)))
            continue
        prompt, first = _random_review(prompts, typo_rate, rng)
        _, second = _random_review([prompt], typo_rate, rng)
        first_score, second_score = sentiment_score([prompt, prompt], [first, second])
        if first_score > second_score:
            pairs.append(PreferencePair(prompt, first, second))
        elif second_score > first_score:
            pairs.append(PreferencePair(prompt, second, first))
    return pairs


def build_positive_review(
    seed: int, sft_steps: int = 400, sft_batch_size: int = 32, sft_lr: float = 6e-3
) -> Task:
    """The default task: a tiny GPT-2 warmed up on neutral reviews, rewarded by :func:`sentiment_score`."""

    def sft_texts(train_prompts: Sequence[str]) -> list[str]:
        return _sft_texts(train_prompts, 4096, random.Random(f"positive-review/sft/{seed}"))

    prompts = review_prompts(seed)
    return build_char_task(
        "positive-review", seed, prompts, sft_texts, sentiment_score, review_well_formed, MAX_NEW_TOKENS,
        sft_steps, sft_batch_size, sft_lr,
    )  # fmt: skip


def build_positive_review_rm(
    seed: int,
    sft_steps: int = 400,
    rm_steps: int = 400,
    rm_batch_size: int = 16,
    rm_lr: float = 3e-3,
) -> Task:
    """``positive-review`` with a learned reward: a Bradley-Terry reward model replaces the rule.

    The policy is the same warmed-up model as ``positive-review`` with the same seed. The reward
    model, of the policy's size but initialised on its own, trains on :func:`preference_pairs` over
    the train prompts; then its score head is rescaled so that its scores have standard deviation 1
    on warm-up texts (well-formed reviews with uniformly random adjectives).
    """
    base = build_positive_review(seed, sft_steps=sft_steps)
    reward_model = build_reward_model(tiny_gpt2_config(base.tokenizer), seed + 1)
    pairs = [
        (p.prompt + p.chosen, p.prompt + p.rejected) for p in preference_pairs(base.train_prompts, 8192, seed)
    ]
    train_reward_model(
        reward_model, base.tokenizer, pairs, steps=rm_steps, lr=rm_lr, seed=seed, batch_size=rm_batch_size
    )
    reference = _sft_texts(base.train_prompts, 512, random.Random(f"positive-review/rm-scale/{seed}"))
    spread = float(reward_model_scores(reward_model, base.tokenizer, reference).std())
    if spread > 0:
        with torch.no_grad():
            reward_model.score.weight.div_(spread)
    return Task(
        name="positive-review-rm",
        tokenizer=base.tokenizer,
        policy=base.policy,
        train_prompts=base.train_prompts,
        eval_prompts=base.eval_prompts,
        reward_model=reward_model,
        well_formed=review_well_formed,
        # A learned reward is a proxy the policy learns to exploit: at the default kl_coef 0.05,
        # seed 0, 40 iterations, the true score falls from -0.07 to -0.18, well-formed reviews from
        # 89% to 41%, KL reaches 8.7; at 0.2 the true score goes -0.07 -> 0.57, 86% well formed.
        config_overrides={"max_new_tokens": MAX_NEW_TOKENS, "kl_coef": 0.2},
        eval_reward_function=sentiment_score,
    )
