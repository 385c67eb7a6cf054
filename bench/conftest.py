"""Benchmarks of ppo-ref, side by side with other PPO implementations (issue 6).

Kept out of the default test run (pyproject ``testpaths``). ``pytest bench/ --bench-impl=NAME``
times the ops of one adapter (``mine`` by default; a third-party one runs in that library's own
environment, see ``tools/run_bench.py``). CI runs ``pytest bench/ --benchmark-disable`` once so the
benchmarks cannot rot.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from ppo_ref.adapters import get_adapter
from ppo_ref.adapters.base import Adapter

_TESTS = Path(__file__).resolve().parent.parent / "tests"
if getattr(sys.modules.get("tests"), "__path__", None) != [str(_TESTS)]:
    # verl's and OpenRLHF's environments install a top-level ``tests`` package of their own, which
    # shadows the checkout's (a namespace package: no __init__.py); bind the name to the checkout's
    # folder so that tests.thirdparty_env and tests.oracles import from here in every environment.
    sys.modules["tests"] = types.ModuleType("tests")
    sys.modules["tests"].__path__ = [str(_TESTS)]

# A thirdparty test skipped for a missing .envs/NAME fails instead under PPO_REF_REQUIRE_ENVS=1 (CI).
from tests.thirdparty_env import pytest_runtest_makereport  # noqa: E402

__all__ = ["adapter", "pytest_runtest_makereport", "require"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench-impl",
        default="mine",
        help="adapter whose ops the primitive benchmarks time (default: mine)",
    )


@pytest.fixture(scope="session")
def adapter(request: pytest.FixtureRequest) -> Adapter:
    return get_adapter(str(request.config.getoption("--bench-impl")))


def require(adapter: Adapter, op: str) -> None:
    if op not in adapter.ops:
        pytest.skip(f"{adapter.name} does not provide {op}")
