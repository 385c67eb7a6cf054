"""Fixtures of the trainer tests (helpers live in tiny_task.py; fixtures shared beyond them in
tests/model_fixtures.py)."""

from __future__ import annotations

import pytest

from tests.model_fixtures import one_thread, out_dir

__all__ = ["no_work", "one_thread", "out_dir"]


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the CLI gets as far as building models (a bad config must stop before)."""

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("build_setup was called: the config error came too late")

    monkeypatch.setattr("ppo_ref.trainer.setup.build_setup", forbidden)
