"""Rule rewards and format checks of the built-in tasks, on hand-written examples."""

from __future__ import annotations

import random

import pytest

from ppo_ref.tasks.length import WORDS, length_prompts, length_well_formed, word_count_reward
from ppo_ref.tasks.reverse import exact_match_reward, noisy_answer, reverse_prompts, reverse_well_formed
from ppo_ref.tasks.review import (
    LEXICON,
    MAX_NEW_TOKENS,
    NEGATIVE_ADJECTIVES,
    POSITIVE_ADJECTIVES,
    preference_pairs,
    review_prompts,
    review_well_formed,
    sentiment_score,
)

P = "the movie was"


@pytest.mark.parametrize(
    ("response", "score", "well_formed"),
    [
        (" great and fun.", 1.0, True),
        (" great and dull.", 0.0, True),
        (" awful and great.", 0.0, True),
        (" awful and dull.", -1.0, True),
        (" grate and fun.", -1.0, False),  # typo: unknown adjective
        (" great and fun", -1.0, False),  # no full stop
        (" great and fun. the", -1.0, False),  # text after the end
        ("great and fun.", -1.0, False),  # missing leading space
        (" great and  fun.", -1.0, False),
        (" great.", -1.0, False),
        ("", -1.0, False),
    ],
)
def test_sentiment_score_and_well_formed(response: str, score: float, well_formed: bool) -> None:
    assert sentiment_score([P], [response]) == [score]
    assert review_well_formed(P, response) is well_formed


def test_lexicon_is_balanced() -> None:
    assert len(POSITIVE_ADJECTIVES) == len(NEGATIVE_ADJECTIVES) == 8
    assert sum(LEXICON.values()) == 0.0
    longest = max(LEXICON, key=len)
    assert len(f" {longest} and {longest}.") + 1 <= MAX_NEW_TOKENS  # + EOS


def test_review_prompts_split() -> None:
    train, held_out = review_prompts(0)
    assert len(train) == 64 and len(held_out) == 16 and not set(train) & set(held_out)
    assert review_prompts(0) == (train, held_out)
    assert review_prompts(1) != (train, held_out)


def test_preference_pairs_are_strictly_ordered() -> None:
    pairs = preference_pairs(["the movie was", "my book was"], 300, seed=3)
    assert len(pairs) == 300
    for pair in pairs:
        chosen, rejected = sentiment_score([pair.prompt] * 2, [pair.chosen, pair.rejected])
        assert chosen > rejected
    malformed = sum(not review_well_formed(p.prompt, p.rejected) for p in pairs)
    assert 0.4 * 300 < malformed < 0.8 * 300  # half are contrast pairs, plus random typos
    assert preference_pairs(["the movie was"], 5, seed=3) == preference_pairs(["the movie was"], 5, seed=3)


@pytest.mark.parametrize(
    ("prompt", "response", "score", "well_formed"),
    [
        ("1234=", "4321", 1.0, True),
        ("1234=", "4322", 0.0, True),
        ("1234=", "1234", 0.0, True),
        ("0070=", "0700", 1.0, True),
        ("1234=", "4321 ", 0.0, False),
        ("1234=", "432", 0.0, False),
        ("1234=", "43210", 0.0, False),
        ("1234=", "", 0.0, False),
    ],
)
def test_exact_match_reward(prompt: str, response: str, score: float, well_formed: bool) -> None:
    assert exact_match_reward([prompt], [response]) == [score]
    assert reverse_well_formed(prompt, response) is well_formed


def test_exact_match_rejects_foreign_prompt() -> None:
    with pytest.raises(ValueError, match="prompts"):
        exact_match_reward(["12a4="], ["4a21"])


def test_noisy_answer_has_at_most_one_wrong_digit() -> None:
    rng = random.Random(0)
    wrong = [
        sum(a != b for a, b in zip(noisy_answer("1234=", rng), "4321", strict=True)) for _ in range(2000)
    ]
    assert set(wrong) == {0, 1}
    assert 0.55 < sum(wrong) / len(wrong) < 0.65  # 60% of the warm-up answers are wrong


def test_reverse_prompts_split() -> None:
    train, held_out = reverse_prompts(0)
    assert len(held_out) == 256 and len(train) + len(held_out) == 10_000
    assert not set(train) & set(held_out)


@pytest.mark.parametrize(
    ("response", "score", "well_formed"),
    [
        (" cat dog sun red big.", 1.0, True),
        (" cat dog sun red.", 2 / 3, True),
        (" cat dog sun red big sky.", 2 / 3, True),
        (" cat dog.", 0.0, True),
        (" cat dog sun red big sky sea tree.", 0.0, True),
        (" cat.", -1 / 3, True),
        (" " + " ".join(["cat"] * 12) + ".", -1.0, True),  # clipped at -1
        (" cat dgo sun red big.", 1.0, False),  # unknown word still counts as a word
        (" cat dog sun red big", -1.0, False),  # no full stop
        (" cat  dog sun red big.", -1.0, False),
        (" Cat dog sun red big.", -1.0, False),
        ("", -1.0, False),
        (".", -1.0, False),
    ],
)
def test_word_count_reward(response: str, score: float, well_formed: bool) -> None:
    assert word_count_reward(["rain:"], [response]) == [pytest.approx(score)]
    assert length_well_formed("rain:", response) is well_formed


def test_length_prompts_and_words() -> None:
    train, held_out = length_prompts(0)
    assert len(train) == 24 and len(held_out) == 8 and not set(train) & set(held_out)
    assert all(word.isalpha() and word.islower() for word in WORDS)


@pytest.mark.parametrize("reward", [sentiment_score, exact_match_reward, word_count_reward])
def test_rewards_validate_arguments(reward: object) -> None:
    assert callable(reward)
    with pytest.raises(ValueError, match="responses"):
        reward(["1234="], [])
    with pytest.raises(ValueError, match="prompts"):
        reward("1234=", ["4321"])
    with pytest.raises(ValueError, match="responses"):
        reward(["1234="], [4321])
    assert reward([], []) == []
