"""Argument checks shared by the built-in tasks (``ValueError`` naming the argument)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["check_prompts_responses", "check_seed", "check_texts"]


def check_seed(seed: object) -> int:
    """Check that ``seed`` is an int >= 0."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: expected an int >= 0, got {seed!r}")
    return seed


def check_texts(texts: object, name: str) -> Sequence[str]:
    """Check that ``texts`` is a sequence (not a single str) of str."""
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise ValueError(f"{name}: expected a sequence of str, got {type(texts).__name__}")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"{name}: entry {index} is a {type(text).__name__}, expected str")
    return texts


def check_prompts_responses(prompts: object, responses: object) -> None:
    """Check that ``prompts`` and ``responses`` are equally long sequences of str."""
    prompt_count = len(check_texts(prompts, "prompts"))
    response_count = len(check_texts(responses, "responses"))
    if prompt_count != response_count:
        raise ValueError(f"responses: expected one per prompt ({prompt_count}), got {response_count}")
