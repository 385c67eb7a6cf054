"""The PPO_REF_REQUIRE_ENVS switch (tests/thirdparty_env.py): a thirdparty test whose environment is
missing skips by default and fails under PPO_REF_REQUIRE_ENVS=1, as .ci/run sets it."""

from __future__ import annotations

import doctest
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import thirdparty_env
from tests.thirdparty_env import REQUIRE_ENVS, missing_env_failure, thirdparty_python

REPO = Path(__file__).resolve().parents[1]


def test_docstring_examples() -> None:
    failed, attempted = doctest.testmod(thirdparty_env)
    assert attempted >= 3 and failed == 0


def test_an_existing_environment_is_returned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = tmp_path / ".envs" / "lib" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    for value in ("", "1"):
        monkeypatch.setenv(REQUIRE_ENVS, value)
        assert thirdparty_python("lib", root=tmp_path) == python


def test_a_missing_environment_skips_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUIRE_ENVS, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"no environment \.envs/lib "):
        thirdparty_python("lib", root=tmp_path)


def test_a_missing_environment_fails_when_required(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_ENVS, "1")
    with pytest.raises(pytest.fail.Exception, match=r"PPO_REF_REQUIRE_ENVS=1 and no environment \.envs/lib "):
        thirdparty_python("lib", root=tmp_path)


def test_bad_inputs_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("", "../trl", ".lock"):
        with pytest.raises(ValueError, match="name"):
            thirdparty_python(name, root=tmp_path)
    monkeypatch.setenv(REQUIRE_ENVS, "maybe")
    with pytest.raises(ValueError, match=REQUIRE_ENVS):
        thirdparty_python("lib", root=tmp_path)


def test_only_a_missing_environment_skip_of_a_thirdparty_test_becomes_a_failure() -> None:
    on, off = {REQUIRE_ENVS: "1"}, {REQUIRE_ENVS: "0"}
    assert missing_env_failure(True, "no .envs/verl", on) == (
        "PPO_REF_REQUIRE_ENVS=1 and a thirdparty test skipped for a missing environment: no .envs/verl"
    )
    assert missing_env_failure(True, "no .envs/verl", off) is None
    assert missing_env_failure(False, "no .envs/verl", on) is None  # not marked thirdparty
    assert missing_env_failure(True, "not provided: op 'gae'", on) is None


def _report(reason: str, outcome: str = "skipped") -> pytest.TestReport:
    longrepr = ("t.py", 1, f"Skipped: {reason}") if outcome == "skipped" else None
    return pytest.TestReport("t.py::t", ("t.py", 1, "t"), {}, outcome, longrepr, "call")  # type: ignore[arg-type]


def _through_hook(report: pytest.TestReport, marked: bool) -> pytest.TestReport:
    item = SimpleNamespace(
        get_closest_marker=lambda name: object() if marked and name == "thirdparty" else None
    )
    wrapper = thirdparty_env.pytest_runtest_makereport(item, None)  # type: ignore[arg-type]
    next(wrapper)
    with pytest.raises(StopIteration) as stop:
        wrapper.send(report)
    result: pytest.TestReport = stop.value.value
    return result


def test_the_hook_turns_the_skip_into_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_ENVS, "1")
    failed = _through_hook(_report("no .envs/verl (build it)"), marked=True)
    expected = "PPO_REF_REQUIRE_ENVS=1 and a thirdparty test skipped for a missing environment: no .envs/verl"
    assert failed.failed and failed.longrepr == f"{expected} (build it)"
    assert _through_hook(_report("no .envs/verl (build it)"), marked=False).skipped
    assert _through_hook(_report("not provided: the adapter has no step runner"), marked=True).skipped
    assert _through_hook(_report("", outcome="passed"), marked=True).passed
    monkeypatch.setenv(REQUIRE_ENVS, "")
    assert _through_hook(_report("no .envs/verl (build it)"), marked=True).skipped


def test_tests_conftest_registers_the_hook(request: pytest.FixtureRequest) -> None:
    impls = request.config.pluginmanager.hook.pytest_runtest_makereport.get_hookimpls()
    assert any(impl.function is thirdparty_env.pytest_runtest_makereport for impl in impls)


SYNTHETIC = """
import pytest
from tests.thirdparty_env import thirdparty_python

@pytest.mark.thirdparty
def test_helper():
    thirdparty_python("no-such-environment")

@pytest.mark.thirdparty
@pytest.mark.skipif(True, reason="TRL's environment .envs/no-such-environment is not built")
def test_own_skipif():
    pass

@pytest.mark.thirdparty
def test_not_provided():
    pytest.skip("not provided: op 'gae' is not in the adapter's ops")

def test_unmarked():
    pytest.skip("no .envs/no-such-environment")
"""


@pytest.mark.multiprocess
def test_a_pytest_run_fails_on_missing_environments_only_when_required(tmp_path: Path) -> None:
    """End to end, in a pytest subprocess with bench/conftest.py's hook: by default all four skip;
    under PPO_REF_REQUIRE_ENVS=1 the two thirdparty tests skipped for a missing .envs/NAME fail, the
    "not provided" skip and the unmarked test's skip stay skips."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    thirdparty: needs .envs/NAME\n")
    (tmp_path / "conftest.py").write_text("from bench.conftest import pytest_runtest_makereport\n")
    (tmp_path / "test_synthetic.py").write_text(SYNTHETIC)
    base = {k: v for k, v in os.environ.items() if k != REQUIRE_ENVS}
    base["PYTHONPATH"] = str(REPO)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "--strict-markers"]
    default = subprocess.run(command, cwd=tmp_path, env=base, capture_output=True, text=True, timeout=300)
    assert default.returncode == 0 and "4 skipped" in default.stdout, default.stdout[-3000:]
    required = subprocess.run(
        command, cwd=tmp_path, env={**base, REQUIRE_ENVS: "1"}, capture_output=True, text=True, timeout=300
    )
    out = required.stdout
    assert required.returncode == 1, out[-3000:]
    # A skipif is decided at setup, so its replacement shows as an error, the helper's as a failure.
    assert "1 failed, 2 skipped, 1 error" in out, out[-3000:]
    assert "FAILED test_synthetic.py::test_helper" in out, out[-3000:]
    assert "ERROR test_synthetic.py::test_own_skipif" in out, out[-3000:]
    assert "SKIPPED [1] test_synthetic.py:16: not provided" in out, out[-3000:]
    assert "SKIPPED [1] test_synthetic.py:19: no .envs/no-such-environment" in out, out[-3000:]
