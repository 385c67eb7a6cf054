"""The conformance suite as a user installs it (issues 13, 24): build the wheel, install it in a fresh
virtual environment with the README's install lines (the extra ``conformance`` only, no trainer),
and run the documented commands (``python -m pytest`` and plain ``pytest``), ``run_conformance`` and
``check_op`` (``examples/test_my_losses.py``) against ``examples/my_ppo_adapter.py`` copied outside
the repository. The reports must be the
checkout's; the build prints no license deprecation warning; the install pulls none of the
trainer's packages, and ``ppo-ref train`` there says which extra it needs.

About 2 minutes the first time (creating the environment and installing torch and the wheel's
dependencies from pip's cache), most of it pip."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from conformance.cases import CASES_DIR, SPEC_VERSION
from tests.docs_text import all_text, commands, section
from tests.test_packaging import TRAINER_STACK

ROOT = Path(__file__).resolve().parent.parent
TORCH = "2.13.0"  # ./dev's pin: an unpinned torch would pull a multi-GB CUDA build
pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

COMMAND = ["-m", "pytest", "--pyargs", "ppo_ref_conformance", "--impl=my_ppo_adapter:make_adapter"]
"""The documented command (docs/ci.md, "In your own CI"), after the environment's python."""
OPTIONS = ["--conformance-examples=4", "-p", "no:cacheprovider"]


def _run(
    command: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0, f"{command}\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    return run


def _comparable_json(path: Path) -> dict[str, Any]:
    """The report without what differs between any two runs: the date and the command line."""
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    for key in ("date", "command"):
        assert report.pop(key)
    return report


def _comparable_markdown(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if not line.startswith(("| Date |", "| Command |"))]
    assert len(kept) == len(lines) - 2
    return kept


def _readme_install_lines() -> dict[str, list[str]]:
    """The README's install lines (section "Installing"), by what they do, split as the shell would."""
    lines = [shlex.split(line) for line in commands(section("Installing"))]
    by_role = {
        "torch": next(w for w in lines if "torch==" + TORCH in w and "--index-url" in w),
        "wheel": next(w for w in lines if w[3:4] == ["wheel"]),
        "install": next(w for w in lines if any(".whl[conformance]" in word for word in w)),
        "suite": next(w for w in lines if w[1:3] == ["-m", "pytest"]),
    }
    assert all(words[0] == "python" for words in by_role.values()), by_role
    return by_role


def test_the_wheel_installed_outside_the_checkout_runs_the_suite_and_writes_the_checkouts_report(
    tmp_path: Path,
) -> None:
    readme = _readme_install_lines()
    # Build from a copy of the sources, so that the build writes nothing into the checkout; the
    # README's line, without build isolation (which would fetch setuptools from an index).
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", *(p.name for p in ROOT.glob("*.py"))):
        shutil.copy2(ROOT / name, source / name)
    for name in ("ppo_ref", "conformance", "spec"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    assert readme["wheel"] == ["python", "-m", "pip", "wheel", "--no-deps", ".", "-w", "dist"]
    build = _run(
        [sys.executable, *readme["wheel"][1:5], "--no-build-isolation", *readme["wheel"][5:]], source
    )
    assert "project.license" not in build.stdout + build.stderr, "setuptools' license deprecation warning"
    (wheel,) = (source / "dist").glob("ppo_ref-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt")))
        wheel_metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert (
        "License-Expression: Apache-2.0\n" in wheel_metadata and "License-File: LICENSE\n" in wheel_metadata
    )
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    requires = [
        line.partition(" ")[2] for line in wheel_metadata.splitlines() if line.startswith("Requires-Dist:")
    ]
    base = {re.split(r"[<>=;\[ ]", r)[0] for r in requires if "extra ==" not in r}
    assert base == {"torch", "numpy"}, "the wheel's dependencies without an extra"
    assert not any(name.startswith("conformance/") for name in names), "a top-level conformance package"
    shipped_cases = {n.rsplit("/", 1)[1] for n in names if n.startswith("ppo_ref_conformance/spec/cases/")}
    assert shipped_cases == {path.name for path in CASES_DIR.glob("*.json")}
    assert "ppo_ref_conformance/spec/SPEC.md" in names and "ppo_ref_conformance/spec/CHANGELOG.md" in names
    assert "ppo_ref_conformance/plugin.py" in names and "ppo_ref_conformance/api.py" in names
    suite = {
        f"ppo_ref_conformance/{p.relative_to(source / 'conformance').as_posix()}"
        for p in (source / "conformance").rglob("*.py")
    }
    assert "ppo_ref_conformance/strategies/__init__.py" in suite
    assert suite - set(names) == set(), "modules of the suite (subpackages included) the wheel leaves out"
    assert "[pytest11]\nppo_ref_conformance = ppo_ref_conformance.plugin" in entry_points.decode()

    # A fresh environment, with the README's lines: torch first (the CPU build; this machine's pip
    # finds it without the README's --index-url), then the wheel with the extra conformance and
    # torch pinned again; the test tools at the checkout's versions.
    venv = tmp_path / "venv"
    _run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], tmp_path)
    python = str(venv / "bin" / "python")
    torch_line = readme["torch"][: readme["torch"].index("--index-url")]
    assert torch_line == ["python", "-m", "pip", "install", f"torch=={TORCH}"]
    _run([python, *torch_line[1:], "--quiet"], tmp_path)
    pins = [f"pytest=={metadata.version('pytest')}", f"hypothesis=={metadata.version('hypothesis')}"]
    assert readme["install"][1:] == [
        "-m",
        "pip",
        "install",
        f"dist/{wheel.name}[conformance]",
        f"torch=={TORCH}",
    ]
    _run([python, *readme["install"][1:], *pins, "--quiet"], source)
    # The suite-only install: none of the trainer's packages, and the command says which extra
    installed = {
        line.split("==")[0].split(" @ ")[0].lower()
        for line in _run([python, "-m", "pip", "freeze"], tmp_path).stdout.splitlines()
    }
    assert not TRAINER_STACK & installed, f"the suite-only install pulled {TRAINER_STACK & installed}"
    assert {"ppo-ref", "pytest", "hypothesis", "numpy"} <= installed
    train = subprocess.run(
        [str(venv / "bin" / "ppo-ref"), "train", "--out", str(tmp_path / "run")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert train.returncode == 2, train.stdout + train.stderr
    assert train.stderr.startswith("ppo-ref train: error: the trainer needs transformers, accelerate"), (
        train.stderr
    )
    assert 'pip install "ppo-ref[trainer]"' in train.stderr and "Traceback" not in train.stderr

    # The user's repository: their adapter and their check_op tests, nothing of ppo-ref's.
    user = tmp_path / "users_repo"
    user.mkdir()
    shutil.copy2(ROOT / "examples" / "my_ppo_adapter.py", user / "my_ppo_adapter.py")
    shutil.copy2(ROOT / "examples" / "test_my_losses.py", user / "test_my_losses.py")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PPO_REF_IMPL")}
    where = _run(
        [
            python,
            "-c",
            "import json, ppo_ref, ppo_ref_conformance.cases as c; "
            "print(json.dumps([ppo_ref.__file__, c.__file__, str(c.CASES_DIR), c.SPEC_VERSION]))",
        ],
        user,
        env,
    )
    ppo_ref_file, suite_file, cases_dir, installed_spec = json.loads(where.stdout)
    for path in (ppo_ref_file, suite_file, cases_dir):
        assert Path(path).is_relative_to(venv), f"{path} is not the installed package"
    assert installed_spec == SPEC_VERSION

    installed_run = _run([python, *COMMAND, *OPTIONS, "--conformance-report=installed"], user, env)
    assert "ppo-ref conformance: --impl=my_ppo_adapter:make_adapter -> my-trainer" in installed_run.stdout
    # The README's line (compact output), and the plain pytest script, which does not put the
    # current directory on sys.path: the suite does, for the adapter module found there.
    assert readme["suite"] == ["python", *COMMAND, "--conformance-output=compact"]
    compact = _run([python, *readme["suite"][1:], *OPTIONS], user, env)
    assert "passed" in compact.stdout.splitlines()[-1] and "failed" not in compact.stdout.splitlines()[-1]
    plain = _run(
        [str(venv / "bin" / "pytest"), *COMMAND[2:], *OPTIONS, "--conformance-report=plain"], user, env
    )
    assert "ppo-ref conformance: --impl=my_ppo_adapter:make_adapter -> my-trainer" in plain.stdout
    api = _run(
        [
            python,
            "-c",
            "from ppo_ref_conformance.api import run_conformance; "
            "r = run_conformance('my_ppo_adapter:make_adapter', report='api', examples=4); "
            "print(r.passed, r.exit_code, r.spec_version, r.clause('GAE-2').verdict)",
        ],
        user,
        env,
    )
    assert api.stdout.split()[-4:] == ["True", "0", SPEC_VERSION, "pass"]
    # check_op inside the user's own pytest run, as examples/test_my_losses.py's docstring types it
    own_tests = _run([python, "-m", "pytest", "test_my_losses.py", "-p", "no:cacheprovider"], user, env)
    assert own_tests.stdout.strip().splitlines()[-1].startswith("=") and " 2 passed" in own_tests.stdout
    # The README's example, as printed, on this adapter.
    example = re.search(r"From Python, `run_conformance`.*?```python\n(.*?)```", all_text(), flags=re.DOTALL)
    assert example is not None
    source = example.group(1).replace("mypkg.ppo_adapter:make_adapter", "my_ppo_adapter:make_adapter")
    printed = _run([python, "-c", source], user, env).stdout.splitlines()
    # pytest's own output, then the example's prints
    assert any(line.startswith(f"True {SPEC_VERSION} 0.") for line in printed), printed[-5:]
    assert printed[-1] == "declared convention"
    assert (user / "conformance-report.json").is_file() and (user / "conformance-report.md").is_file()

    # The same adapter from the checkout, as before the suite was installable.
    checkout_stem = tmp_path / "checkout"
    _run(
        [
            sys.executable,
            "-m",
            "pytest",
            "conformance/",
            "--impl=my_ppo_adapter:make_adapter",
            *OPTIONS,
            f"--conformance-report={checkout_stem}",
        ],
        ROOT,
        {**env, "PYTHONPATH": str(user)},
    )
    expected_json = _comparable_json(checkout_stem.with_suffix(".json"))
    verdicts = {entry["id"]: entry["verdict"] for entry in expected_json["clauses"]}
    assert verdicts["GAE-2"] == "pass" and verdicts["PG-3"] == "declared convention"
    assert verdicts["KL-1"] == "not provided" and verdicts["EV-1"] == "not applicable"
    assert expected_json["spec_version"] == SPEC_VERSION
    for stem in ("installed", "api", "plain"):
        assert _comparable_json(user / f"{stem}.json") == expected_json, stem
        assert _comparable_markdown(user / f"{stem}.md") == _comparable_markdown(
            checkout_stem.with_suffix(".md")
        )
