"""Shared pytest configuration for ppo-ref's own tests.

Loads the Hypothesis profile (``HYPOTHESIS_PROFILE`` = ``default``, derandomized, or ``thorough``)
and registers the ``clause`` marker that ties a test to the spec clauses it exercises. Under
``PPO_REF_REQUIRE_ENVS=1`` a ``thirdparty`` test that skips for a missing ``.envs/NAME`` fails
(``tests/thirdparty_env.py``).
"""

from __future__ import annotations

import pytest

# The repository root (pytest's ``pythonpath``) holds the ``conformance`` package, whose strategies
# the tests share.
from conformance.strategies import register_profiles

# A thirdparty test skipped for a missing .envs/NAME fails instead under PPO_REF_REQUIRE_ENVS=1 (CI).
from tests.thirdparty_env import pytest_runtest_makereport

register_profiles()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "clause(*ids): the spec clauses (e.g. GAE-2) a test exercises")


__all__ = ["pytest_runtest_makereport"]
