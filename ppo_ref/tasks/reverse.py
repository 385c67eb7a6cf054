"""``reverse``: RL with a verifier. The prompt is four digits and ``=``; the answer is them reversed.

``"1234="`` asks for ``"4321"``. The supervised warm-up gives 60% of its answers one wrong digit,
so the warmed-up policy is right only part of the time and PPO has something to fix; the reward
is an exact-match check: 1.0 for the right answer, 0.0 for anything else.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from ppo_ref.tasks._checks import check_prompts_responses, check_seed
from ppo_ref.tasks.base import Task
from ppo_ref.tasks.char_task import build_char_task

__all__ = [
    "DIGIT_COUNT",
    "build_reverse",
    "exact_match_reward",
    "noisy_answer",
    "reverse_prompts",
    "reverse_well_formed",
]

DIGIT_COUNT = 4
EVAL_PROMPT_COUNT = 256
"""Prompts held out for evaluation, of the 10,000 possible ones; the rest are train prompts."""
SFT_ERROR_RATE = 0.6
"""Share of warm-up answers with exactly one wrong digit."""
MAX_NEW_TOKENS = 8
"""A right answer is 4 digits plus EOS."""

_PROMPT = re.compile(rf"[0-9]{{{DIGIT_COUNT}}}=")
_ANSWER = re.compile(rf"[0-9]{{{DIGIT_COUNT}}}")


def reverse_prompts(seed: int) -> tuple[list[str], list[str]]:
    """Every ``"dddd="`` prompt, shuffled by ``seed`` and split into (train, eval)."""
    check_seed(seed)
    prompts = [f"{number:0{DIGIT_COUNT}d}=" for number in range(10**DIGIT_COUNT)]
    random.Random(f"reverse/prompts/{seed}").shuffle(prompts)
    return prompts[EVAL_PROMPT_COUNT:], prompts[:EVAL_PROMPT_COUNT]


def _digits(prompt: str) -> str:
    if _PROMPT.fullmatch(prompt) is None:
        raise ValueError(f"prompts: expected {DIGIT_COUNT} digits and '=', got {prompt!r}")
    return prompt[:DIGIT_COUNT]


def exact_match_reward(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
    """1.0 when the response is exactly the prompt's digits reversed, else 0.0 (malformed included).

    ``exact_match_reward(["1234="], ["4321"]) == [1.0]``; ``"4322"``, ``"4321 "`` and ``"432"`` give
    0.0. A prompt that is not 4 digits and ``=`` is a ``ValueError``.
    """
    check_prompts_responses(prompts, responses)
    pairs = zip(prompts, responses, strict=True)
    return [1.0 if response == _digits(prompt)[::-1] else 0.0 for prompt, response in pairs]


def reverse_well_formed(prompt: str, response: str) -> bool:
    """True when the response is exactly 4 digits (right or wrong)."""
    check_prompts_responses([prompt], [response])
    return _ANSWER.fullmatch(response) is not None


def noisy_answer(prompt: str, rng: random.Random, error_rate: float = SFT_ERROR_RATE) -> str:
    """The reversed digits, with one digit replaced by a different one with probability ``error_rate``."""
    answer = list(_digits(prompt)[::-1])
    if rng.random() < error_rate:
        position = rng.randrange(DIGIT_COUNT)
        answer[position] = rng.choice([d for d in "0123456789" if d != answer[position]])
    return "".join(answer)


def build_reverse(seed: int, sft_steps: int = 400, sft_batch_size: int = 32, sft_lr: float = 3e-3) -> Task:
    """A tiny GPT-2 warmed up on noisy reversals, rewarded by :func:`exact_match_reward`."""

    def sft_texts(train_prompts: Sequence[str]) -> list[str]:
        rng = random.Random(f"reverse/sft/{seed}")
        return [
            prompt + noisy_answer(prompt, rng) for prompt in (rng.choice(train_prompts) for _ in range(8192))
        ]

    prompts = reverse_prompts(seed)
    return build_char_task(
        "reverse", seed, prompts, sft_texts, exact_match_reward, reverse_well_formed, MAX_NEW_TOKENS,
        sft_steps, sft_batch_size, sft_lr,
    )  # fmt: skip
