"""Where a third-party library's environment is, and what a test does when it is not built.

A test marked ``thirdparty`` runs code in ``.envs/NAME`` (built by ``python tools/thirdparty_envs.py
NAME``). Where that environment is missing the test skips, so that ``./dev test --all`` works on a
checkout without the environments; with ``PPO_REF_REQUIRE_ENVS=1`` (set by ``.ci/run``, which builds
every environment before the tests) a missing environment fails the test instead, so CI cannot pass
while silently skipping the third-party checks.

Two layers: :func:`thirdparty_python` (the helper the tests call) and :func:`pytest_runtest_makereport`
(imported by ``tests/conftest.py`` and ``bench/conftest.py``), which turns into a failure any skip of a
``thirdparty``-marked test whose reason names ``.envs/``, for a test that skips on its own
(``pytest.mark.skipif`` or its own ``pytest.skip``). ``tests/test_thirdparty_env.py`` tests both.

:func:`run_step_tier` runs the trainer-step tier against a built-in step runner in its environment and
parses the verdicts (the step-tier tests of TRL 1.12 and 1.16, verl, OpenRLHF, ms-swift and RLinf call
it).

:func:`import_without_library`, :func:`assert_names_the_env_commands` and :func:`run_json_in_env` are
the three steps every adapter test of a third-party library repeats: import the adapter with the
library made unimportable, check the error that names the commands, and run a script in the library's
environment that prints one JSON line; :func:`assert_loads_lazily` is the first two with the
adapter's declared conventions checked.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
REQUIRE_ENVS = "PPO_REF_REQUIRE_ENVS"
"""Set to ``1`` to fail, not skip, a test whose third-party environment is missing (``.ci/run``)."""


def envs_required(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``PPO_REF_REQUIRE_ENVS`` is on (``1``, ``true``, ``yes``; ``0``, empty or unset: off).

    >>> [envs_required({"PPO_REF_REQUIRE_ENVS": value}) for value in ("", "0", "1", "true")]
    [False, False, True, True]
    """
    value = (os.environ if environ is None else environ).get(REQUIRE_ENVS, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ValueError(f"{REQUIRE_ENVS}={value!r}: expected 1/true/yes or 0/false/no/empty")


def thirdparty_python(name: str, root: Path = REPO) -> Path:
    """``root/.envs/NAME/bin/python``; skips the calling test when it is missing, or fails it under
    ``PPO_REF_REQUIRE_ENVS=1``.

    ``name`` is an environment of ``tools/thirdparty_envs.py`` (``trl``, ``trl116``, ``verl``, ...).
    """
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"name must be an environment name like 'trl116', got {name!r}")
    python = root / ".envs" / name / "bin" / "python"
    if python.exists():
        return python
    reason = f"no environment .envs/{name} (build it with python tools/thirdparty_envs.py {name})"
    if envs_required():
        pytest.fail(f"{REQUIRE_ENVS}=1 and {reason}", pytrace=False)
    pytest.skip(reason)


def missing_env_failure(
    marked_thirdparty: bool, skip_reason: str, environ: Mapping[str, str] | None = None
) -> str | None:
    """The failure message that replaces a skip, or ``None`` to keep it: only for a ``thirdparty``
    test, only under ``PPO_REF_REQUIRE_ENVS=1``, and only when the reason names ``.envs/`` (a missing
    environment; a "not provided" skip stays a skip).

    >>> missing_env_failure(True, "no .envs/trl", {"PPO_REF_REQUIRE_ENVS": "1"})
    'PPO_REF_REQUIRE_ENVS=1 and a thirdparty test skipped for a missing environment: no .envs/trl'
    >>> missing_env_failure(True, "not provided: op 'gae'", {"PPO_REF_REQUIRE_ENVS": "1"}) is None
    True
    """
    if not marked_thirdparty or ".envs/" not in skip_reason or not envs_required(environ):
        return None
    return f"{REQUIRE_ENVS}=1 and a thirdparty test skipped for a missing environment: {skip_reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Turn the skip of a ``thirdparty`` test for a missing ``.envs/NAME`` into a failure under
    ``PPO_REF_REQUIRE_ENVS=1`` (:func:`missing_env_failure`)."""
    report = yield
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        message = missing_env_failure(item.get_closest_marker("thirdparty") is not None, reason)
        if message is not None:
            report.outcome = "failed"
            report.longrepr = message
    return report


def import_without_library(monkeypatch: pytest.MonkeyPatch, name: str, modules: Iterable[str]) -> ModuleType:
    """``ppo_ref.adapters.thirdparty.NAME`` imported afresh while each of ``modules`` is unimportable
    (``sys.modules[m] = None`` makes ``import m`` raise ImportError); ``monkeypatch`` undoes both."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.delitem(sys.modules, f"ppo_ref.adapters.thirdparty.{name}", raising=False)
    return importlib.import_module(f"ppo_ref.adapters.thirdparty.{name}")


def assert_names_the_env_commands(name: str, message: str) -> None:
    """``message`` is the one error of every adapter whose library is missing: it names the adapter and
    the commands that build its environment and run the suite there."""
    assert f"adapter {name!r} needs " in message
    assert f"python tools/thirdparty_envs.py {name}" in message
    assert f".envs/{name}/bin/python -m pytest conformance/ --impl={name}" in message


def assert_loads_lazily(
    monkeypatch: pytest.MonkeyPatch, name: str, adapter: str, modules: Iterable[str]
) -> None:
    """With ``modules`` unimportable, ``ppo_ref.adapters.thirdparty.NAME`` still imports, its class
    ``adapter`` declares only known conventions with a source for each, and ``get_adapter(NAME)``
    fails with the one missing-library message."""
    from ppo_ref.adapters import AdapterLoadError, get_adapter, parse_conventions

    declared = getattr(import_without_library(monkeypatch, name, modules), adapter)
    parse_conventions(declared.conventions)  # every declared key and value is known
    assert set(declared.convention_sources) == set(declared.conventions)
    with pytest.raises(AdapterLoadError) as raised:
        get_adapter(name)
    assert_names_the_env_commands(name, str(raised.value))


def run_json_in_env(name: str, script: str, timeout: float = 300) -> Any:
    """The JSON of the last line ``script`` prints, run by ``.envs/NAME``'s Python in the checkout
    (skips or fails where it is missing, as :func:`thirdparty_python`), one thread, without the
    caller's ``PYTHONPATH`` (the environment's own ppo-ref install is the one under test)."""
    python = thirdparty_python(name)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [str(python), "-c", script], cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


STEP_ENVIRONMENT: Mapping[str, str] = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
"""The environment the step-tier tests run a library's interpreter in: offline, one thread."""


def run_step_check(name: str, script: str, timeout: float = 900) -> dict[str, Any]:
    """The measurements a step test's check script prints as JSON on its ``RESULT`` line, run by
    ``.envs/NAME``'s Python in the checkout under :data:`STEP_ENVIRONMENT` (skips or fails where the
    environment is missing, as :func:`thirdparty_python`); fails with the output's tail where no such
    line comes. The script imports :mod:`step_formula` (``tests/env_helpers``, put on its path)."""
    helpers = str(REPO / "tests" / "env_helpers")
    path = os.pathsep.join(p for p in (helpers, STEP_ENVIRONMENT.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [str(thirdparty_python(name)), "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**STEP_ENVIRONMENT, "PYTHONPATH": path},
        timeout=timeout,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT")), None)
    assert line is not None, done.stdout[-2000:] + done.stderr[-2000:]
    result: dict[str, Any] = json.loads(line[len("RESULT") :])
    return result


STEP_PLUGIN = ("-p", "no:ppo_ref_conformance", "-p", "conformance.plugin")
"""The checkout's plugin (``conformance.plugin``), not the one an editable install of another
checkout names."""


@dataclass(frozen=True)
class StepTierRun:
    """What ``conformance/test_step_tier.py --impl=NAME`` printed, parsed."""

    failed: frozenset[str]
    """The failing tests' names (``test_step2_...[2]``)."""
    passed: int | None
    skipped: int | None
    stdout: str


def run_step_tier(
    name: str, *options: str, impl: str | None = None, environ: Mapping[str, str] = STEP_ENVIRONMENT
) -> StepTierRun:
    """The step tier against ``impl`` (default: the built-in runner ``name``) in ``.envs/NAME`` (skips
    or fails where it is missing, as :func:`thirdparty_python`), ``-q -p no:cacheprovider --tb=short``
    and ``options`` (a later ``--tb`` wins)."""
    command = [
        str(thirdparty_python(name)),
        "-m",
        "pytest",
        "conformance/test_step_tier.py",
        f"--impl={impl or name}",
    ]
    command += [*STEP_PLUGIN, "-q", "-p", "no:cacheprovider", "--tb=short", *options]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=dict(environ), timeout=900)
    failed = re.findall(r"^FAILED conformance/test_step_tier.py::(\S+)", done.stdout, re.MULTILINE)
    counts = {word: re.search(rf"(\d+) {word}", done.stdout) for word in ("passed", "skipped")}
    passed, skipped = (int(m.group(1)) if m else None for m in counts.values())
    return StepTierRun(frozenset(failed), passed, skipped, done.stdout)
