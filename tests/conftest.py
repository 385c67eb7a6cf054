"""Shared pytest configuration for ppo-ref's own tests.

Loads the Hypothesis profile (``HYPOTHESIS_PROFILE`` = ``default``, derandomized, or ``thorough``)
and registers the ``clause`` marker that ties a test to the spec clauses it exercises.
"""

from __future__ import annotations

import pytest

# The repository root (pytest's ``pythonpath``) holds the ``conformance`` package, whose strategies
# the tests share.
from conformance.strategies import register_profiles

register_profiles()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "clause(*ids): the spec clauses (e.g. GAE-2) a test exercises")
