"""``length``: answer in exactly five words.

The prompt is a topic and a colon (``"rain:"``); a response is a few words from a fixed list, each
after a space, and a full stop: ``" red sun big sky sea."``. The supervised warm-up writes 2 to 8
random words, so the warmed-up policy scores 3/7 on average; the reward
``clip(1 - |words - 5| / 3, -1, 1)`` peaks at exactly five words.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from ppo_ref.tasks._checks import check_prompts_responses, check_seed
from ppo_ref.tasks.base import Task
from ppo_ref.tasks.char_task import build_char_task

__all__ = [
    "TARGET_WORDS",
    "TOPICS",
    "WORDS",
    "build_length",
    "length_prompts",
    "length_well_formed",
    "word_count_reward",
]

TARGET_WORDS = 5
WORDS: tuple[str, ...] = (
    "cat", "dog", "sun", "red", "big", "run", "sky", "sea", "tree", "bird", "fish", "blue",
    "old", "new", "hot", "cold", "rain", "wind", "star", "moon", "road", "home", "king", "song",
)  # fmt: skip
TOPICS: tuple[str, ...] = (
    "spring", "summer", "winter", "autumn", "music", "cities", "rivers", "forests",
    "oceans", "sports", "food", "travel", "school", "family", "friends", "space",
    "history", "art", "science", "games", "books", "movies", "weather", "animals",
    "flowers", "trains", "stars", "coffee", "tea", "night", "morning", "gardens",
)  # fmt: skip
EVAL_PROMPT_COUNT = 8
"""Topics held out for evaluation, of 32."""
SFT_WORD_COUNTS = range(2, 9)
"""The warm-up answers have 2 to 8 words, uniformly."""
MAX_NEW_TOKENS = 48
"""The longest warm-up answer (8 four-letter words) is 41 characters plus EOS."""

_RESPONSE = re.compile(r"( [a-z]+)+\.")


def length_prompts(seed: int) -> tuple[list[str], list[str]]:
    """The ``"{topic}:"`` prompts, shuffled by ``seed`` and split into (train, eval)."""
    check_seed(seed)
    prompts = [f"{topic}:" for topic in TOPICS]
    random.Random(f"length/prompts/{seed}").shuffle(prompts)
    return prompts[EVAL_PROMPT_COUNT:], prompts[:EVAL_PROMPT_COUNT]


def _words(response: str) -> list[str] | None:
    if _RESPONSE.fullmatch(response) is None:
        return None
    return response[:-1].split(" ")[1:]


def word_count_reward(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
    """``clip(1 - |n - 5| / 3, -1, 1)`` for a response of n lowercase words; -1.0 if malformed.

    A response is well shaped when it is words of lowercase letters, each after one space, ending
    with a full stop; unknown words still count (:func:`length_well_formed` reports them). Examples:
    ``" a b c d e."`` scores 1.0, ``" a b."`` 0.0, ``" a b c d e"`` (no full stop) -1.0.
    """
    check_prompts_responses(prompts, responses)
    scores: list[float] = []
    for response in responses:
        words = _words(response)
        if words is None:
            scores.append(-1.0)
        else:
            scores.append(max(-1.0, min(1.0, 1.0 - abs(len(words) - TARGET_WORDS) / 3.0)))
    return scores


def length_well_formed(prompt: str, response: str) -> bool:
    """True when the response is well shaped (see :func:`word_count_reward`) and uses only known words."""
    check_prompts_responses([prompt], [response])
    words = _words(response)
    return words is not None and all(word in WORDS for word in words)


def _sft_texts(prompts: Sequence[str], count: int, rng: random.Random) -> list[str]:
    texts = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.choice(SFT_WORD_COUNTS))]
        texts.append(f"{rng.choice(prompts)} {' '.join(words)}.")
    return texts


def build_length(seed: int, sft_steps: int = 400, sft_batch_size: int = 32, sft_lr: float = 6e-3) -> Task:
    """A tiny GPT-2 warmed up on 2-8 word answers, rewarded by :func:`word_count_reward`."""

    def sft_texts(train_prompts: Sequence[str]) -> list[str]:
        return _sft_texts(train_prompts, 4096, random.Random(f"length/sft/{seed}"))

    prompts = length_prompts(seed)
    return build_char_task(
        "length", seed, prompts, sft_texts, word_count_reward, length_well_formed, MAX_NEW_TOKENS,
        sft_steps, sft_batch_size, sft_lr,
    )  # fmt: skip
