"""The conformance matrix's runs: the suite against one implementation, in that implementation's environment.

``mine`` runs in the main ``.venv``, a library in ``.envs/NAME/bin/python`` (built first with
``tools/thirdparty_envs.py NAME`` when missing and building is allowed). Each run is ``pytest
conformance/ --impl=NAME --conformance-report=...`` in the repository root; its report, with the wall
time, exit code and the adapter's metadata (``tools/conformance_matrix.py --describe NAME`` in the
same environment), goes to ``build/conformance-matrix/NAME.run.json``.

Hypothesis does not shrink failing examples (the suite's own default: ``conformance/support.py``'s
``examples()`` leaves out the shrink and explain phases); ``shrink=True`` passes
``--conformance-shrink`` to turn them back on. Verdicts are the same either way (the derandomized
examples are generated either way; a failing clause fails whether or not its example is then
minimised); failure messages show unshrunk examples.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent
REPORTS = REPO / "build" / "conformance-matrix"
SCRIPT = REPO / "tools" / "conformance_matrix.py"
ALL_NAMES = ("mine", "trl", "trl116", "verl", "openrlhf", "torchrl", "sb3", "skyrl", "rlinf", "swift")
"""ppo-ref, then the libraries: ``trl`` is TRL 1.12 (the last release with PPOTrainer), ``trl116`` TRL 1.16
(GRPOTrainer and RLOOTrainer: the family ops and the step tier)."""


def interpreter(name: str) -> Path:
    if name == "mine":
        venv = REPO / ".venv" / "bin" / "python"
        return venv if venv.exists() else Path(sys.executable)
    return REPO / ".envs" / name / "bin" / "python"


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TRL_EXPERIMENTAL_SILENCE"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    return env


def ensure_env(name: str, build: bool) -> float | None:
    """Seconds spent building ``.envs/NAME`` (None if it existed); SystemExit if missing and no build."""
    if interpreter(name).exists():
        return None
    if not build:
        raise SystemExit(
            f"{name}: no environment at .envs/{name}; build it with `python tools/thirdparty_envs.py {name}`"
        )
    print(f"[{name}] building .envs/{name} with tools/thirdparty_envs.py ...", flush=True)
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(REPO / "tools" / "thirdparty_envs.py"), name], cwd=REPO)
    if done.returncode != 0 or not interpreter(name).exists():
        raise SystemExit(f"{name}: building the environment failed (see .envs/logs/{name}.log)")
    return time.monotonic() - start


def suite_command(name: str, stem: Path, examples: int | None, shrink: bool = False) -> list[str]:
    """The pytest command that runs the suite for ``name``, its report at ``stem`` (.json, .md)."""
    command = [str(interpreter(name)), "-m", "pytest", "conformance/", "-q", "-p", "no:cacheprovider"]
    command += [f"--impl={name}", f"--conformance-report={stem}"]
    command += [f"--conformance-examples={examples}"] if examples is not None else []
    return command + (["--conformance-shrink"] if shrink else [])


def run_suite(
    name: str,
    examples: int | None,
    reports: Path,
    build_seconds: float | None = None,
    shrink: bool = False,
    metadata: bool = True,
) -> dict[str, Any]:
    """Run the suite for ``name``; return its report plus wall time, exit code and metadata."""
    reports.mkdir(parents=True, exist_ok=True)
    stem = reports / name
    for suffix in (".json", ".md"):
        stem.with_suffix(suffix).unlink(missing_ok=True)
    # The command runs in the repository root: a relative report path keeps the machine's absolute
    # path out of the reports and of the matrix rendered from them.
    shown_stem = stem.resolve().relative_to(REPO) if stem.resolve().is_relative_to(REPO) else stem
    command = suite_command(name, shown_stem, examples, shrink)
    print(f"[{name}] {' '.join(command[1:])}", flush=True)
    start = time.monotonic()
    with open(reports / f"{name}.log", "w", encoding="utf-8") as log:
        done = subprocess.run(command, cwd=REPO, env=child_env(), stdout=log, stderr=subprocess.STDOUT)
    wall = time.monotonic() - start
    report_file = stem.with_suffix(".json")
    if done.returncode not in (0, 1) or not report_file.exists():
        raise SystemExit(
            f"{name}: pytest exited with {done.returncode} and no usable report; see {reports / name}.log"
        )
    report: dict[str, Any] = json.loads(report_file.read_text(encoding="utf-8"))
    report["wall_seconds"] = round(wall, 1)
    report["exit_code"] = done.returncode
    report["examples"] = examples
    report["env_build_seconds"] = None if build_seconds is None else round(build_seconds, 1)
    report["metadata"] = describe_in_env(name) if metadata else {}
    summary = ", ".join(f"{n} {v}" for v, n in report["summary"].items() if n)
    print(f"[{name}] {wall:.1f} s, exit {done.returncode}: {summary}", flush=True)
    if metadata:  # a --check run (no metadata) must not replace the reports the docs are rendered from
        (reports / f"{name}.run.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def describe_in_env(name: str) -> dict[str, Any]:
    command = [str(interpreter(name)), str(SCRIPT), "--describe", name]
    done = subprocess.run(command, cwd=REPO, env=child_env(), capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-600:]}
    metadata: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return metadata


def load_reports(names: Iterable[str], reports: Path) -> dict[str, dict[str, Any]]:
    loaded = {}
    for name in names:
        path = reports / f"{name}.run.json"
        if not path.exists():
            raise SystemExit(f"{name}: no report at {path}; run `python tools/conformance_matrix.py {name}`")
        loaded[name] = json.loads(path.read_text(encoding="utf-8"))
    return loaded
