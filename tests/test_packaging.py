"""The installable conformance suite (issue 13): what the wheel is configured to ship, the spec's
version, when the pytest plugin wires the suite, the report's test ids, and ``run_conformance``.

The wheel itself is built, installed and run in ``tests/test_wheel_install.py`` (slow)."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import conformance
from conformance import plugin
from conformance.api import ClauseResult, ConformanceReport, run_conformance
from conformance.cases import CASES_DIR, SPEC_PATH, SPEC_VERSION, spec_clauses, spec_version
from conformance.report import suite_test_id

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_wheel_lists_every_package_of_ppo_ref_and_maps_the_suite_to_ppo_ref_conformance() -> None:
    setuptools = PYPROJECT["tool"]["setuptools"]
    packages = set(setuptools["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "ppo_ref").rglob("__init__.py")
    }
    assert on_disk - packages == set(), "packages under ppo_ref/ that the wheel would leave out"
    suite = {
        ".".join(("ppo_ref_conformance", *init.parent.relative_to(ROOT / "conformance").parts))
        for init in (ROOT / "conformance").rglob("__init__.py")
    }
    assert "ppo_ref_conformance.strategies" in suite  # a subpackage: the rglob looks below the top
    assert suite - packages == set(), "packages under conformance/ that the wheel would leave out"
    assert "conformance" not in packages and not any(p.startswith("conformance.") for p in packages)
    assert setuptools["package-dir"]["ppo_ref_conformance"] == "conformance"
    assert setuptools["package-dir"]["ppo_ref_conformance.spec"] == "spec"
    assert setuptools["package-data"]["ppo_ref_conformance.spec.cases"] == ["*.json"]
    assert "SPEC.md" in setuptools["package-data"]["ppo_ref_conformance.spec"]
    extra = {
        requirement.split(">")[0]
        for requirement in PYPROJECT["project"]["optional-dependencies"]["conformance"]
    }
    assert extra == {"pytest", "hypothesis"}, (
        "what the installed suite imports besides ppo-ref's dependencies"
    )
    entry = PYPROJECT["project"]["entry-points"]["pytest11"]
    assert entry == {plugin.ENTRY_POINT: "ppo_ref_conformance.plugin"}


TRAINER_STACK = {"transformers", "accelerate", "matplotlib", "safetensors"}
"""What ``ppo-ref train`` needs beyond the base install: the extra ``trainer`` (issue 24)."""


def _names(requirements: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9._-]+(\[[a-z,]+\])?", r).group(0) for r in requirements}  # type: ignore[union-attr]


def test_the_base_install_is_the_math_and_the_suite_and_the_trainer_is_an_extra() -> None:
    project = PYPROJECT["project"]
    extras = project["optional-dependencies"]
    assert _names(project["dependencies"]) == {"torch", "numpy"}
    assert _names(extras["trainer"]) == TRAINER_STACK
    # ./dev setup installs .[dev,real]: both bring the trainer (its tests, the smollm2 task)
    assert "ppo-ref[trainer]" in extras["dev"] and "ppo-ref[trainer]" in extras["real"]
    assert not TRAINER_STACK & (_names(extras["conformance"]) | _names(extras["dev"]))  # one place


def _top_level_imports(path: Path) -> set[str]:
    """The top-level package of every import at module level (not inside a function or
    ``if TYPE_CHECKING:``): what importing the module needs installed."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
    return names


def test_the_suite_and_the_math_import_nothing_of_the_trainer_at_module_level() -> None:
    """The suite-only install (no extra ``trainer``) can import the suite, the adapters' registry
    and the math: their module-level imports name none of the trainer's packages, nor the trainer
    or the tasks (which import them). tests/test_wheel_install.py runs the suite so installed."""
    files = [*(ROOT / "conformance").rglob("*.py"), *(ROOT / "ppo_ref").glob("*.py")]
    files += [
        *(ROOT / "ppo_ref" / "adapters").glob("*.py"),
        *(ROOT / "ppo_ref" / "adapters" / "conventions").glob("*.py"),
    ]
    files.remove(ROOT / "ppo_ref" / "cli.py")  # the command: it checks for the extra first
    assert len(files) > 40
    for path in files:
        for name in _top_level_imports(path):
            top = name.split(".")[0]
            assert top not in TRAINER_STACK, f"{path.relative_to(ROOT)} imports {name} at module level"
            assert not name.startswith(("ppo_ref.trainer", "ppo_ref.tasks")), (
                f"{path.relative_to(ROOT)}: {name}"
            )


def test_the_license_is_an_spdx_expression_with_its_file() -> None:
    """The current form (setuptools >= 77), so that a build prints no ``project.license`` warning;
    tests/test_wheel_install.py checks the build's output and the wheel's metadata."""
    from importlib import metadata

    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").split()[:4] == [
        "Apache",
        "License",
        "Version",
        "2.0,",
    ]
    assert PYPROJECT["build-system"]["requires"] == ["setuptools>=77"]
    installed = tuple(int(part) for part in metadata.version("setuptools").split(".")[:2])
    assert installed >= (77, 0), "the venv's setuptools cannot build the current license form"


def test_the_spec_has_a_version_and_the_changelog_describes_it() -> None:
    assert SPEC_VERSION == spec_version(SPEC_PATH)
    assert SPEC_PATH.read_text(encoding="utf-8").splitlines()[2].startswith(f"Spec version: {SPEC_VERSION} ")
    changelog = (SPEC_PATH.parent / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = [line.split()[1] for line in changelog.splitlines() if line.startswith("## ")]
    assert versions[0] == SPEC_VERSION, "the newest changelog entry is not the spec's version"
    assert versions == [
        "1.9.0",
        "1.8.0",
        "1.7.0",
        "1.6.0",
        "1.5.0",
        "1.4.0",
        "1.3.0",
        "1.2.0",
        "1.1.0",
        "1.0.0",
    ]
    # 1.0.0 had 33 clauses; 1.1.0 added the PPO-family prefixes, and nothing else.
    clauses = list(spec_clauses())
    family = ("GRP-", "AGG-", "CLIP-", "GSPO-", "CISPO-", "KLL-", "IS-", "RPP-")
    # 1.4.0 split PG-6 (PG-7: the step-0 identity) and added the edge clauses (issue 20)
    assert len([c for c in clauses if not c.startswith((*family, "ROB-", "STEP-", "EDGE-"))]) == 34
    section = changelog.split("## 1.1.0", 1)[1].split("## 1.0.0", 1)[0]
    for prefix in family:
        assert f"{prefix}1" in section, f"{prefix} clauses are not in the 1.1.0 entry"
    # 1.2.0 added the robustness clauses (issue 11).
    robustness = changelog.split("## 1.2.0", 1)[1].split("## 1.1.0", 1)[0]
    assert "ROB-1" in robustness
    assert [c for c in clauses if c.startswith("ROB-")] == ["ROB-1", "ROB-2", "ROB-3", "ROB-4"]
    # 1.3.0 added the trainer-step tier (issue 14).
    newest = changelog.split("## 1.3.0", 1)[1].split("## 1.2.0", 1)[0]
    assert "STEP-1" in newest
    assert [c for c in clauses if c.startswith("STEP-")] == [f"STEP-{i}" for i in range(1, 9)]
    # 1.4.0 added the edge clauses (issue 20).
    edge = changelog.split("## 1.4.0", 1)[1].split("## 1.3.0", 1)[0]
    assert "EDGE-1" in edge and "PG-7" in edge
    assert [c for c in clauses if c.startswith("EDGE-")] == ["EDGE-1", "EDGE-2", "EDGE-3"]
    # 1.5.0 let GSPO-3 and STEP-5 accept a declared convention (issue 23).
    conventions = changelog.split("## 1.5.0", 1)[1].split("## 1.4.0", 1)[0]
    assert "gspo_clipfrac" in conventions and "truncation_convention" in conventions
    # 1.6.0 let STEP-5 be not provided for a library without truncation handling (issue 28).
    not_provided = changelog.split("## 1.6.0", 1)[1].split("## 1.5.0", 1)[0]
    assert "truncation_not_provided" in not_provided
    # 1.7.0 added STEP-6, gradient accumulation (issue 22).
    accumulation = changelog.split("## 1.7.0", 1)[1].split("## 1.6.0", 1)[0]
    assert "STEP-6" in accumulation and "accumulation_not_provided" in accumulation
    # 1.8.0 added STEP-7, left padding on the other position scheme (issue 22).
    positions = changelog.split("## 1.8.0", 1)[1].split("## 1.7.0", 1)[0]
    assert "STEP-7" in positions and "with_family" in positions and "family_not_provided" in positions
    # 1.9.0 added STEP-8, a rollout sampled with top-k or top-p (issue 22).
    sampling = changelog.split("## 1.9.0", 1)[1].split("## 1.8.0", 1)[0]
    assert "STEP-8" in sampling and "sampling_convention" in sampling and "sampling_not_provided" in sampling


def test_spec_version_rejects_a_spec_without_a_version_line(tmp_path: Path) -> None:
    spec = tmp_path / "SPEC.md"
    spec.write_text("# A spec\n\nSpec version 1.1.0 (no colon)\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"spec_path: .* has no 'Spec version: X.Y.Z' line"):
        spec_version(spec)
    spec.write_text("# A spec\n\nSpec version: 2.0.1\n", encoding="utf-8")
    assert spec_version(spec) == "2.0.1"
    with pytest.raises(ValueError, match=r"spec_path: expected a pathlib.Path"):
        spec_version(str(spec))  # type: ignore[arg-type]


def test_the_suite_reads_the_checkouts_spec_and_cases() -> None:
    assert SPEC_PATH == ROOT / "spec" / "SPEC.md"
    assert CASES_DIR == ROOT / "spec" / "cases"
    assert plugin.SUITE_DIR == ROOT / "conformance" == Path(conformance.__file__).resolve().parent


@pytest.mark.parametrize(
    ("args", "pyargs", "selected"),
    [
        (["tests"], False, False),
        (["tests/test_spec_cases.py::test_x"], False, False),
        (["conformance"], False, True),
        (["conformance/"], False, True),
        (["conformance/test_gae.py::test_holes_and_padding_are_skipped"], False, True),
        (["tests", "conformance"], False, True),  # pytest's testpaths: `pytest` runs both
        (["."], False, True),
        (["conformance"], True, True),  # --pyargs conformance, the checkout's name
        (["ppo_ref"], True, False),
        (["no_such_module_anywhere"], True, False),
        (["README.md"], False, False),
    ],
)
def test_the_plugin_wires_the_suite_only_when_the_run_collects_it(
    args: list[str], pyargs: bool, selected: bool
) -> None:
    assert plugin.suite_selected(args, pyargs, ROOT) is selected


def test_report_ids_are_the_suites_own_whatever_the_node_id() -> None:
    path = plugin.SUITE_DIR / "test_gae.py"
    expected = "conformance/test_gae.py::test_x[a/b::c]"
    assert suite_test_id(path, "conformance/test_gae.py::test_x[a/b::c]") == expected
    # installed, pytest's node id depends on where it ran; the report's id does not
    assert suite_test_id(path, "../venv/lib/ppo_ref_conformance/test_gae.py::test_x[a/b::c]") == expected
    assert suite_test_id(ROOT / "tests" / "test_gae_bitwise.py", "tests/test_gae_bitwise.py::t") is None
    with pytest.raises(ValueError, match=r"path: expected a pathlib.Path"):
        suite_test_id("conformance/test_gae.py", "x::y")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"nodeid: expected a non-empty string"):
        suite_test_id(path, "")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"impl": ""}, "impl: expected a non-empty adapter name"),
        ({"impl": "no-such-adapter"}, "impl: .*available adapters: mine"),
        ({"impl": "mine", "examples": 0}, "examples: expected a positive integer"),
        ({"impl": "mine", "examples": True}, "examples: expected a positive integer"),
        ({"impl": "mine", "output": "short"}, "output: expected 'compact' or 'full'"),
        ({"impl": "mine", "pytest_args": "-x"}, "pytest_args: expected a sequence of strings"),
        ({"impl": "mine", "report": 3}, "report: expected a path stem"),
    ],
)
def test_run_conformance_rejects_bad_arguments_before_running(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        run_conformance(**kwargs)  # type: ignore[arg-type]


def test_the_report_object_rejects_what_is_not_a_report(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"data: expected a mapping"):
        ConformanceReport.from_dict([])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"data: not a conformance report"):
        ConformanceReport.from_dict({"implementation": {}})
    with pytest.raises(ValueError, match=r"entry: unknown verdict 'maybe'"):
        ClauseResult.from_dict({"verdict": "maybe"})
    with pytest.raises(ValueError, match=r"path: .* is not a file"):
        ConformanceReport.from_json(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match=r"path: .* is not JSON"):
        ConformanceReport.from_json(tmp_path / "bad.json")


# The inference is off so the undeclared clip-fraction rule stays a FAIL with a message and a
# reproduction (on, PG-3 would be "matches undeclared convention": tests/test_conformance_cli.py).
_API_SCRIPT = """
import json, sys
from conformance.api import run_conformance
report = run_conformance(
    "tests.example_adapter:make_wrong_adapter", report=sys.argv[1], examples=4,
    pytest_args=["-q", "-k", "test_contract or test_policy_loss", "--conformance-inference=off"],
)
print(json.dumps({"verdicts": report.verdicts(), "exit": report.exit_code, "passed": report.passed,
                  "spec": report.spec_version, "ppo_ref": report.ppo_ref_version,
                  "failures": [c.id for c in report.failures()],
                  "pg3": [report.clause("PG-3").first_failure, report.clause("PG-3").reproduction],
                  "markdown_same": report.to_markdown() == report.markdown_path.read_text()}))
"""


@pytest.mark.multiprocess  # the suite runs in pytest.main, in a fresh Python
def test_run_conformance_returns_the_report_the_command_line_writes(tmp_path: Path) -> None:
    stem = tmp_path / "api"
    run = subprocess.run(
        [sys.executable, "-c", _API_SCRIPT, str(stem)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    written = json.loads(stem.with_name("api.json").read_text(encoding="utf-8"))
    assert result["verdicts"] == {entry["id"]: entry["verdict"] for entry in written["clauses"]}
    assert result["exit"] == 1 and result["passed"] is False
    assert result["verdicts"]["PG-3"] == "fail" and result["verdicts"]["PG-1"] == "pass"
    assert result["verdicts"]["GAE-1"] == "not run"  # -k kept two files of the suite
    assert result["failures"] == ["CONTRACT", "PG-3"]
    message, reproduction = result["pg3"]
    assert message and "impl = get_adapter('tests.example_adapter:make_wrong_adapter')" in reproduction
    assert result["spec"] == SPEC_VERSION == written["spec_version"]
    assert result["ppo_ref"] == written["ppo_ref_version"]
    assert result["markdown_same"] is True
    assert f"| Spec | {SPEC_VERSION} " in stem.with_name("api.md").read_text(encoding="utf-8")


_MODULES_SCRIPT = """
import json, sys, pytest
code = pytest.main(sys.argv[1:] + ["-p", "no:cacheprovider", "--conformance-examples=2"])
print(json.dumps({"code": int(code), "modules": sorted(m for m in sys.modules if "conformance" in m)}))
"""


@pytest.mark.multiprocess  # runs pytest in a fresh Python, twice
def test_the_checkout_loads_one_copy_of_the_suite_and_tests_alone_load_none() -> None:
    def modules(*args: str) -> tuple[str, list[str]]:
        run = subprocess.run(
            [sys.executable, "-c", _MODULES_SCRIPT, *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        result = json.loads(run.stdout.strip().splitlines()[-1])
        assert result["code"] == 0, run.stdout[-3000:] + run.stderr[-3000:]
        return run.stdout, result["modules"]

    out, loaded = modules("conformance/test_contract.py", "conformance/test_kl.py")
    assert out.count("ppo-ref conformance: --impl=mine -> mine") == 1
    # The tests and the hooks share conformance.*; the entry point's light plugin is the only
    # module under the installed name.
    assert {"conformance.hooks", "conformance.support", "conformance.test_kl"} <= set(loaded)
    assert [m for m in loaded if m.startswith("ppo_ref_conformance")] in (
        [],
        ["ppo_ref_conformance", "ppo_ref_conformance.plugin"],
    )
    out, loaded = modules("tests/test_spec_cases.py", "-k", "GAE-2")
    assert "ppo-ref conformance:" not in out
    assert "conformance.hooks" not in loaded


def test_the_plugin_puts_the_invocation_dir_on_sys_path_for_an_adapter_module_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain ``pytest`` (unlike ``python -m pytest``) leaves the current directory off ``sys.path``."""
    (tmp_path / "adapter_here_xyz.py").write_text("def make():\n    return None\n", encoding="utf-8")
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert plugin.adapter_dir_on_path("adapter_here_xyz:make", tmp_path) is True
    assert sys.path[0] == str(tmp_path)
    assert plugin.adapter_dir_on_path("adapter_here_xyz:make", tmp_path) is False  # importable now
    assert plugin.adapter_dir_on_path("mine", tmp_path) is False  # a name, not a module
    assert plugin.adapter_dir_on_path("json:loads", tmp_path) is False  # importable anyway
    assert plugin.adapter_dir_on_path("not_here_xyz:make", tmp_path) is False  # not in the directory
    assert sys.path.count(str(tmp_path)) == 1
    with pytest.raises(ValueError, match="impl, invocation_dir: expected a string and a Path"):
        plugin.adapter_dir_on_path("adapter_here_xyz:make", str(tmp_path))  # type: ignore[arg-type]


@pytest.mark.multiprocess  # the pytest script, in a fresh process
def test_plain_pytest_runs_the_suite_on_an_adapter_in_the_current_directory(tmp_path: Path) -> None:
    shutil.copy2(ROOT / "examples" / "my_ppo_adapter.py", tmp_path / "my_ppo_adapter.py")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PPO_REF_IMPL")}
    run = subprocess.run(
        [str(Path(sys.executable).with_name("pytest")), "--pyargs", "ppo_ref_conformance",
         "--impl=my_ppo_adapter:make_adapter", "--conformance-output=compact", "--conformance-examples=2",
         "-p", "no:cacheprovider"],
        cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "ppo-ref conformance: --impl=my_ppo_adapter:make_adapter -> my-trainer" in run.stdout
