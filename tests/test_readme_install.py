"""The documentation's install and CI commands, as a user copies them (issue 24): torch pinned
wherever a pip line of the README or a docs page installs it, the suite's example commands with
compact output, the README's install section's wheel name matching the package, and the trainer-step
page naming every built-in runner (the text is read through ``tests/docs_text.py``, issue 29).

The install section's commands themselves run in ``tests/test_wheel_install.py`` (slow): the built
wheel, installed with the extra ``conformance`` only, in a fresh virtual environment.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from ppo_ref.adapters.step import BUILTIN_STEP_RUNNERS
from tests.docs_text import all_text, commands, section

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

ROOT = Path(__file__).resolve().parent.parent
TEXT = all_text()  # README.md and every page of docs/
_PIN = re.search(r'TORCH_VERSION="\$\{PPO_REF_TORCH:-([0-9.]+)\}"', (ROOT / "dev").read_text())
assert _PIN is not None, "./dev's torch pin"
TORCH = _PIN.group(1)
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


def test_every_documented_pip_line_that_installs_torch_or_ppo_ref_pins_torch() -> None:
    installs = [c for c in commands(TEXT) if "pip install" in c]
    assert installs, "no pip install line found"
    checked = 0
    for line in installs:
        words = shlex.split(line)
        names = [w for w in words[words.index("install") + 1 :] if not w.startswith("-")]
        if not any(re.match(r"(torch|ppo-ref|ppo_ref|dist/ppo_ref)\b", n) for n in names):
            continue
        checked += 1
        torch = [n for n in names if re.match(r"torch\b", n)]
        assert torch == [f"torch=={TORCH}"], f"{line!r}: torch is not pinned to ./dev's {TORCH}"
    assert checked >= 3  # the install section's two and the CI job's two


def test_the_suites_example_commands_for_a_users_adapter_show_compact_output() -> None:
    users = [c for c in commands(TEXT) if re.search(r"--impl=(my_ppo_adapter|mypkg\.)", c)]
    assert len(users) >= 5
    for line in users:
        if "pytest" in line:
            assert "--conformance-output=compact" in line, line


def test_the_install_section_builds_and_installs_this_versions_wheel() -> None:
    install = section("Installing")
    lines = commands(install)
    wheel = f"dist/ppo_ref-{VERSION}-py3-none-any.whl"
    assert f"python -m pip install torch=={TORCH} --index-url https://download.pytorch.org/whl/cpu" in lines
    assert "python -m pip wheel --no-deps . -w dist" in lines
    assert f'python -m pip install "{wheel}[conformance]" torch=={TORCH}' in lines
    assert any(line.startswith("python -m pytest --pyargs ppo_ref_conformance") for line in lines)
    for extra in ("conformance", "trainer"):
        assert f'"ppo-ref[{extra}]"' in install
    assert "python -m pytest" in install and "plain `pytest`" in install  # item e: both documented


def test_the_step_tier_section_names_every_built_in_step_runner() -> None:
    text = section("The trainer-step tier: one step of a library's own training code", subsections=False)
    for name, target in BUILTIN_STEP_RUNNERS.items():
        module = target.partition(":")[0]
        assert f"--impl={name} " in text or module in text, name
    assert not re.search(r"verl[^.]*\bno runner", text), "the section says verl has no step runner"
