"""Fixtures of the trainer tests (helpers live in tiny_task.py; the fixtures in tests/model_fixtures.py)."""

from __future__ import annotations

from tests.model_fixtures import one_thread, out_dir

__all__ = ["one_thread", "out_dir"]
