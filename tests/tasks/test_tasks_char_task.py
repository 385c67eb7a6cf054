"""``build_char_task``, the one recipe behind the character-level tasks, with a made-up task."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from ppo_ref.tasks import Task
from ppo_ref.tasks.char_task import build_char_task


def _reward(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
    return [float(len(r)) for r in responses]


def _well_formed(prompt: str, response: str) -> bool:
    return response.endswith(".")


def _build(seed: int, seen: list[Sequence[str]]) -> Task:
    def sft_texts(train_prompts: Sequence[str]) -> list[str]:
        seen.append(list(train_prompts))
        return [p + " ab." for p in train_prompts] * 4

    return build_char_task(
        "made-up", seed, (["x:", "y:"], ["z:"]), sft_texts, _reward, _well_formed, 7,
        sft_steps=2, sft_batch_size=4, sft_lr=1e-3,
    )  # fmt: skip


def test_build_char_task_wires_the_task_and_warms_up_on_the_train_prompts() -> None:
    seen: list[Sequence[str]] = []
    task = _build(0, seen)
    assert seen == [["x:", "y:"]]  # the warm-up texts come from the train prompts only
    assert task.name == "made-up"
    assert (list(task.train_prompts), list(task.eval_prompts)) == (["x:", "y:"], ["z:"])
    assert task.reward_function is _reward and task.well_formed is _well_formed
    assert task.config_overrides == {"max_new_tokens": 7}
    assert task.tokenizer.padding_side == "left"
    same, other = _build(0, []), _build(1, [])
    weights = [p.detach() for p in task.policy.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(weights, same.policy.parameters(), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(weights, other.policy.parameters(), strict=True))


def test_build_char_task_checks_the_seed() -> None:
    with pytest.raises(ValueError, match="seed"):
        _build(-1, [])
