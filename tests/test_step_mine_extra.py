"""ppo-ref's own step runner in the suite-only install (no extra ``trainer``): the step tier reports
it "not provided", naming the extra, instead of failing on a missing import."""

from __future__ import annotations

import pytest

import ppo_ref.trainer.requirements as requirements
from ppo_ref.adapters import get_adapter
from ppo_ref.adapters.step import step_runner


def test_without_the_trainer_extra_the_runner_is_unavailable_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(requirements, "missing_requirements", lambda: ["transformers", "accelerate"])
    with pytest.raises(ModuleNotFoundError, match=r"step runner is its trainer.*ppo-ref\[trainer\]"):
        step_runner(get_adapter("mine"))


def test_with_the_trainer_extra_the_runner_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(requirements, "missing_requirements", lambda: [])
    assert step_runner(get_adapter("mine")) is not None
