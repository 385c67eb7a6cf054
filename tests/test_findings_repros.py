"""The findings' reproductions: standalone, run by ``tools/run_findings_repros.py``, with an upstream text.

Fast tests: the runner's verdicts on throw-away scripts (a finding that reproduces, one that no
longer does, a script importing ppo-ref, one importing a helper next to it), and the committed
scripts' own form (an interpreter named, no import of ppo-ref or of a ``_`` helper, an upstream text
per trainer-path/non-default/metrics-only finding). Third-party tests (``.envs/NAME``): every module
a reproduction or a trainer-step runner imports from its library imports in that library's
environment, so a missing dependency (verl's ``aiohttp`` for ``verl.experimental.reward_loop``) shows
as a failed import here rather than as a crash in the middle of a reproduction.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.thirdparty_env import thirdparty_python
from tools.matrix.findings import FINDINGS_FILES, load_findings

REPO = Path(__file__).resolve().parents[1]
REPRO = REPO / "findings" / "repro"
UPSTREAM = REPO / "findings" / "upstream"
SCRIPTED_REACHES = ("trainer-path", "non-default", "metrics-only")


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


runner = _load("run_findings_repros", REPO / "tools" / "run_findings_repros.py")


def _imported_modules(path: Path) -> set[str]:
    """Every module the file imports: ``import``/``from`` statements and ``import_module("...")``
    string literals (how the step runners import the library lazily)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
    return found


def _fake_repo(tmp_path: Path, body: str, helper: str | None = None) -> Path:
    """A repository root with one reproduction whose interpreter is this Python."""
    folder = tmp_path / "findings" / "repro"
    folder.mkdir(parents=True)
    (tmp_path / ".envs" / "here" / "bin").mkdir(parents=True)
    (tmp_path / ".envs" / "here" / "bin" / "python").symlink_to(sys.executable)
    if helper is not None:
        (folder / "_helper.py").write_text(helper, encoding="utf-8")
    script = folder / "lib-finding.py"
    script.write_text(f'"""Run with .envs/here/bin/python."""\n{body}\n', encoding="utf-8")
    return script


@pytest.mark.parametrize(
    ("body", "helper", "rc", "verdict"),
    [
        ("import sys\nprint('expected 0 got 1')\nsys.exit(1)", None, 1, "reproduces"),
        ("print('expected 0 got 0')", None, 0, "no longer reproduces"),
        ("import sys\nsys.exit(1 if __name__ == '__main__' else 5)", None, 1, "reproduces"),
        ("raise RuntimeError('boom')", None, 2, "crashed (rc 2)"),  # not Python's 1
        (
            "import sys, types\nsys.modules['ppo_ref.math'] = types.ModuleType('x')\nsys.exit(1)",
            None,
            3,
            "imported ppo_ref",
        ),
        (
            "import sys\nsys.path.insert(0, __file__.rsplit('/', 1)[0])\nimport _helper\nsys.exit(1)",
            "VALUE = 1\n",
            4,
            "imported a repro helper",
        ),
    ],
)
def test_the_runner_says_what_happened(
    tmp_path: Path, body: str, helper: str | None, rc: int, verdict: str
) -> None:
    outcome = runner.run(_fake_repo(tmp_path, body, helper), root=tmp_path)
    assert (outcome.rc, outcome.verdict) == (rc, verdict)
    assert outcome.ok == (rc == 1)


def test_bad_patterns_and_scripts_without_an_interpreter_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="patterns"):
        runner.scripts(["no-such-finding"])
    script = tmp_path / "x.py"
    script.write_text("print(1)\n", encoding="utf-8")
    with pytest.raises(ValueError, match="script"):
        runner.interpreter(script)


def test_every_reproduction_is_standalone() -> None:
    """No committed script imports ppo-ref or a ``_`` helper module, and each names its interpreter."""
    every = runner.scripts([])
    assert len(every) >= 20
    for script in every:
        runner.interpreter(script)
        imported = _imported_modules(script)
        assert not {m for m in imported if m.split(".")[0] == "ppo_ref"}, script.name
        assert not {
            m for m in imported if m.startswith("_") and (REPRO / f"{m.split('.')[0]}.py").exists()
        }, script.name
    assert not sorted(p.name for p in REPRO.glob("_*.py")), "helpers a script would need beside it"


def test_every_scripted_finding_has_a_reproduction_and_an_upstream_text() -> None:
    """A trainer-path, non-default or metrics-only finding has its script and
    ``findings/upstream/<id>.md``, a text ready to file (title, versions, reproduction, expected and
    got, related upstream threads)."""
    found = load_findings(list(FINDINGS_FILES))
    scripted = [f for f in found.values() if f.reach in SCRIPTED_REACHES]
    assert len(scripted) >= 20
    for finding in scripted:
        assert (REPO / finding.reproduction).is_file(), finding.id
        text = UPSTREAM / f"{finding.id}.md"
        assert text.is_file(), f"{finding.id}: no {text.relative_to(REPO)}"
        body = text.read_text(encoding="utf-8")
        assert body.startswith("# "), finding.id
        for part in ("Versions", "Reproduction", "Expected", "Related upstream"):
            assert part in body, f"{finding.id}: its upstream text has no {part!r} part"


def _library_modules() -> dict[str, set[str]]:
    """Environment -> the third-party modules its reproductions and step runners import."""
    by_env: dict[str, set[str]] = {}
    stdlib = set(sys.stdlib_module_names)
    for script in runner.scripts([]):
        env = runner.interpreter(script).split("/")[1]
        by_env.setdefault(env, set()).update(
            m for m in _imported_modules(script) if m.split(".")[0] not in stdlib
        )
    # trl_step.py holds TRL 1.16's GRPO runner and TRL 1.12's PPO runner (TRL removed PPO in 1.13).
    runners = {
        ("verl_step.py", "verl"): "",
        ("trl_step.py", "trl"): "",
        ("trl_step.py", "trl116"): "trl.experimental.ppo",
        ("openrlhf_step.py", "openrlhf"): "",
        ("openrlhf_standins.py", "openrlhf"): "",
        ("swift_step.py", "swift"): "",
        ("rlinf_step.py", "rlinf"): "",
        ("skyrl_step.py", "skyrl"): "",
    }
    for (name, env), absent in runners.items():
        modules = _imported_modules(REPO / "ppo_ref" / "adapters" / "thirdparty" / name)
        library = {
            m
            for m in modules
            if m.split(".")[0]
            in (
                "verl",
                "trl",
                "transformers",
                "accelerate",
                "datasets",
                "openrlhf",
                "deepspeed",
                "swift",
                "rlinf",
                "skyrl",
            )
        }
        by_env.setdefault(env, set()).update(m for m in library if not (absent and m.startswith(absent)))
    return by_env


PROBE = """
import importlib, sys
# OpenRLHF and skyrl import flash_attn (and OpenRLHF vllm) at top level, which need CUDA to
# install: the OpenRLHF adapter's allow-listed stubs stand in for exactly those (as each script's own).
if sys.argv[1] in ("openrlhf", "skyrl"):
    from ppo_ref.adapters.thirdparty import _openrlhf_stubs
    _openrlhf_stubs.install()
# skyrl 0.4.0 on Python 3.11: skyrl/tinker/types.py (imported by skyrl/backends/__init__.py) needs
# typing_extensions.TypedDict in pydantic; each script imports it with that binding first, as here.
if sys.argv[1] == "skyrl":
    import typing, typing_extensions
    _td = typing.TypedDict
    typing.TypedDict = typing_extensions.TypedDict
    try:
        import skyrl.tinker.types
    finally:
        typing.TypedDict = _td
failed = []
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
    except Exception as error:
        failed.append(f"{name}: {type(error).__name__}: {error}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


@pytest.mark.thirdparty
@pytest.mark.parametrize("env", sorted(_library_modules()))
def test_what_the_reproductions_and_runners_drive_imports(env: str) -> None:
    python = thirdparty_python(env)
    modules = sorted(_library_modules()[env])
    done = subprocess.run([str(python), "-c", PROBE, env, *modules], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, f".envs/{env} cannot import:\n{done.stdout}{done.stderr[-2000:]}"
