"""``check_op`` (issue 25, Deliver 4): one function checked from inside the user's own pytest run.

The fast tests check the arguments (each refused with a ValueError naming it, before anything runs)
and the lazy export. The ``multiprocess`` test runs ``examples/test_my_losses.py`` as its docstring
tells a user (``python -m pytest test_my_losses.py`` in a directory that holds it and
``my_ppo_adapter.py``), then a user's test file whose loss clips at the wrong bound: the check must
fail on the clip clauses with the compact message and a reproduction that imports the user's
function, and leave the user's Hypothesis profile loaded."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import conformance
import ppo_ref
from conformance.check import OpCheck, OpConformanceError, check_op

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"op": "policy_losses", "fn": ppo_ref.policy_loss}, r"^op: expected one of \['token_logprobs'"),
        ({"op": "gae", "fn": "ppo_ref.gae"}, r"^fn: expected a callable .* got str"),
        ({"op": "gae", "fn": ppo_ref.gae, "conventions": ["gae_whitening"]}, r"^conventions: expected a map"),
        ({"op": "gae", "fn": ppo_ref.gae, "conventions": {"no_such_key": 1}}, r"^conventions: .*no_such_key"),
        ({"op": "gae", "fn": ppo_ref.gae, "name": " "}, r"^name: expected a non-empty str"),
        ({"op": "gae", "fn": ppo_ref.gae, "raise_on_failure": 1}, r"^raise_on_failure: expected a bool"),
        ({"op": "gae", "fn": ppo_ref.gae, "pytest_args": "-x"}, r"^pytest_args: expected a sequence of str"),
        ({"op": "gae", "fn": ppo_ref.gae, "examples": 0}, r"^examples: expected a positive integer"),
    ],
)
def test_bad_arguments_are_refused_naming_the_argument(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_op(**kwargs)  # type: ignore[arg-type]


def test_the_package_exports_check_op_lazily() -> None:
    assert conformance.check_op is check_op
    assert conformance.OpCheck is OpCheck and conformance.OpConformanceError is OpConformanceError
    assert issubclass(OpConformanceError, AssertionError)  # pytest reports it as a failing test
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        conformance.nothing  # noqa: B018


_USERS_TESTS = """
import torch
from types import SimpleNamespace
from hypothesis import settings

from ppo_ref_conformance import OpConformanceError, check_op

import users_losses

settings.register_profile("users", max_examples=7)
settings.load_profile("users")


def test_a_loss_clipping_at_the_wrong_bound_fails_on_the_clip_clauses():
    try:
        conventions = {"loss_aggregations": ["token-mean"]}
        check_op("policy_loss", users_losses.loose_clip_loss, conventions=conventions)
    except OpConformanceError as error:
        check, message = error.check, str(error)
    else:
        raise AssertionError("check_op passed a loss that clips at 1.5 x eps")
    verdicts = check.verdicts()
    assert verdicts["CONTRACT"] == "pass" and verdicts["PG-1"] == "fail" and verdicts["CLIP-1"] == "fail"
    assert not {"GAE-1", "KL-1", "GRP-1"} & set(verdicts), "clauses of other ops are not the check's"
    assert set(check.report.verdicts()) > set(verdicts)  # the whole report is kept
    assert "FAIL (value) PG-1: The clipped objective and its slopes" in message
    assert "from users_losses import loose_clip_loss" in message
    declared = "conventions={'loss_aggregations': ['token-mean']}"
    build = f"impl = one_op_adapter('policy_loss', loose_clip_loss, {declared})"
    assert build in message and "impl.policy_loss(logp=" in message
    assert "impl = get_adapter(" not in message
    assert settings.get_current_profile_name() == "users" and settings().max_examples == 7


def test_the_reference_passes_and_returns_its_verdicts():
    from ppo_ref import group_advantages
    check = check_op("group_advantages", group_advantages)
    assert check.passed and check.verdicts()["GRP-1"] == "pass" and "GRP-4" in check.verdicts()
    assert all(v in ("pass", "not provided") for v in check.verdicts().values()), check.summary()
"""

_USERS_LOSSES = """
from ppo_ref import policy_loss


def loose_clip_loss(logp, old_logp, advantages, mask, clip_eps, loss_agg="token-mean", **options):
    return policy_loss(logp, old_logp, advantages, mask, 1.5 * clip_eps, loss_agg, **options)
"""


@pytest.mark.multiprocess  # pytest in a fresh Python, in a user's directory, twice
def test_check_op_in_a_users_pytest_run(tmp_path: Path) -> None:
    for name in ("my_ppo_adapter.py", "test_my_losses.py"):
        shutil.copy2(ROOT / "examples" / name, tmp_path / name)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    run = {"cwd": tmp_path, "capture_output": True, "text": True, "timeout": 900, "check": False}
    example = subprocess.run([*command, "test_my_losses.py"], **run)  # type: ignore[call-overload]
    assert example.returncode == 0, example.stdout[-4000:] + example.stderr[-2000:]
    assert example.stdout.strip().splitlines()[-1].startswith("2 passed"), example.stdout[-2000:]

    (tmp_path / "users_losses.py").write_text(_USERS_LOSSES, encoding="utf-8")
    (tmp_path / "test_users.py").write_text(_USERS_TESTS, encoding="utf-8")
    users = subprocess.run([*command, "test_users.py"], **run)  # type: ignore[call-overload]
    assert users.returncode == 0, users.stdout[-4000:] + users.stderr[-2000:]
    assert users.stdout.strip().splitlines()[-1].startswith("2 passed"), users.stdout[-2000:]
