"""The TRL, TorchRL and Stable-Baselines3 adapters, the inline-source helper and the conformance
matrix, checked in the main environment, where none of those libraries is installed."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

from ppo_ref.adapters import AdapterLoadError, get_adapter
from ppo_ref.adapters.thirdparty import _inline
from ppo_ref.adapters.thirdparty._inline import InlineBlock, InlineSourceError, block_digest, locate

REPO = Path(__file__).resolve().parent.parent
LIBRARY_MODULES = {
    "trl": ("trl", "trl.experimental.ppo.ppo_trainer"),
    "torchrl": ("torchrl", "torchrl.objectives.value.functional"),
    "sb3": ("stable_baselines3", "stable_baselines3.common.buffers"),
}


# --- lazy imports and the error when a library is missing -----------------------------------------


@pytest.mark.parametrize("name", sorted(LIBRARY_MODULES))
def test_adapter_modules_import_without_their_library(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for module in LIBRARY_MODULES[name]:
        monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    monkeypatch.delitem(sys.modules, f"ppo_ref.adapters.thirdparty.{name}", raising=False)
    module = importlib.import_module(f"ppo_ref.adapters.thirdparty.{name}")
    assert callable(module.make_adapter)


@pytest.mark.parametrize("name", sorted(LIBRARY_MODULES))
def test_missing_library_is_a_clear_error_naming_the_env_command(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in LIBRARY_MODULES[name]:
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(AdapterLoadError) as raised:
        get_adapter(name)
    message = str(raised.value)
    assert f"python tools/thirdparty_envs.py {name}" in message
    assert f".envs/{name}/bin/python -m pytest conformance/ --impl={name}" in message


# --- the inline-source helper ---------------------------------------------------------------------

TRAINER_SOURCE = """
SCALE = 10.0


class Trainer:
    def train(self, rewards):
        total = 0.0
        # --- the math ---
        doubled = [r * 2 for r in rewards]
        total = sum(doubled) * SCALE
        # --- end ---
        return total

    def noisy(self, x):
        y = x + 1
        y = x + 1
        return y
"""


@pytest.fixture
def trainer_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A throwaway 'library' module on sys.path, with a method holding inline math."""
    name = "fake_inline_library"
    (tmp_path / f"{name}.py").write_text(TRAINER_SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module(name)


MATH = "doubled = [r * 2 for r in rewards]\ntotal = sum(doubled) * SCALE\n"


def _math_block(digest: str | None = None) -> InlineBlock:
    return InlineBlock(
        "fake_inline_library",
        "Trainer.train",
        "doubled = [r * 2 for r in rewards]",
        "total = sum(doubled) * SCALE",
        block_digest(MATH) if digest is None else digest,
    )


def test_located_block_runs_the_library_lines_with_its_globals(trainer_module: types.ModuleType) -> None:
    located = locate(_math_block())
    assert located.source == MATH
    assert (located.start, located.end) == (9, 10)  # line numbers in the library file
    assert located.file == trainer_module.__file__
    namespace = located.run(rewards=[1.0, 2.5])
    assert namespace["doubled"] == [2.0, 5.0]
    assert namespace["total"] == 70.0  # SCALE comes from the library module's globals
    assert "total" not in vars(trainer_module)  # the module itself is not modified


def test_errors_inside_a_block_point_at_the_library_file(trainer_module: types.ModuleType) -> None:
    located = locate(_math_block())
    with pytest.raises(TypeError) as raised:
        located.run(rewards=[None])
    frames = [(frame.filename, frame.lineno) for frame in __import__("traceback").extract_tb(raised.tb)]
    assert (trainer_module.__file__, 9) in frames


def test_a_changed_source_fails_loudly(tmp_path: Path, trainer_module: types.ModuleType) -> None:
    pinned = _math_block()
    changed = TRAINER_SOURCE.replace("sum(doubled) * SCALE", "sum(doubled)  * SCALE")
    (tmp_path / "fake_inline_library.py").write_text(changed, encoding="utf-8")
    importlib.reload(trainer_module)
    with pytest.raises(InlineSourceError, match="not in the installed source"):
        locate(pinned)  # the last line is no longer there verbatim
    edited = TRAINER_SOURCE.replace(
        "[r * 2 for r in rewards]\n", "[r * 2 for r in rewards]\n        total += 1\n"
    )
    (tmp_path / "fake_inline_library.py").write_text(edited, encoding="utf-8")
    importlib.reload(trainer_module)
    with pytest.raises(
        InlineSourceError, match=f"no longer matches its pin \\(expected digest {pinned.digest}"
    ):
        locate(pinned)  # same anchors, a line added in between


def test_a_wrong_pin_never_runs(trainer_module: types.ModuleType) -> None:
    with pytest.raises(InlineSourceError, match="no longer matches its pin"):
        locate(_math_block(digest="0" * 16))


def test_missing_function_module_and_ambiguous_blocks_are_errors(trainer_module: types.ModuleType) -> None:
    with pytest.raises(InlineSourceError, match=r"has no 'Trainer\.fit'"):
        locate(InlineBlock("fake_inline_library", "Trainer.fit", "a", "b", "0" * 16))
    with pytest.raises(InlineSourceError, match="cannot import"):
        locate(InlineBlock("no_such_library_anywhere", "f", "a", "b", "0" * 16))
    line = "y = x + 1"
    with pytest.raises(InlineSourceError, match="occurs 2 times"):
        locate(InlineBlock("fake_inline_library", "Trainer.noisy", line, line, block_digest(line + "\n")))


def test_print_block_shows_lines_and_digest(
    trainer_module: types.ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _inline._print_block(
        [
            "fake_inline_library:Trainer.train",
            "doubled = [r * 2 for r in rewards]",
            "total = sum(doubled) * SCALE",
        ]
    )
    assert code == 0
    assert f"lines 9-10, digest {block_digest(MATH)}" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["trl", "sb3"])
def test_adapter_pins_are_well_formed(name: str) -> None:
    blocks = importlib.import_module(f"ppo_ref.adapters.thirdparty.{name}").BLOCKS
    assert blocks
    for block in blocks.values():
        assert len(block.digest) == _inline.DIGEST_LENGTH and int(block.digest, 16) >= 0
        assert block.first == block.first.strip() and block.last == block.last.strip()


# --- the matrix -----------------------------------------------------------------------------------


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location(
        "conformance_matrix", REPO / "tools" / "conformance_matrix.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _clause(clause: str, verdict: str, **extra: Any) -> dict[str, Any]:
    entry = {
        "id": clause,
        "title": f"title of {clause}",
        "verdict": verdict,
        "declared_conventions": [],
        "first_failure": "",
        "skip_reasons": [],
    }
    return {**entry, **extra}


def _report(
    name: str, clauses: list[dict[str, Any]], conventions: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "implementation": {
            "impl": name,
            "name": name,
            "version": "1.0",
            "provenance": f"{name} functions | with a pipe",
            "ops": ["gae"],
            "declared_conventions": conventions or {},
            "contract_problems": [],
        },
        "date": "2026-11-29 12:00 UTC",
        "python": "3.11.7",
        "command": f"pytest conformance/ --impl={name}",
        "summary": {"pass": 1, "fail": 1},
        "clauses": clauses,
        "wall_seconds": 12.3,
        "metadata": {
            "versions": {name: "1.0", "torch": "2.13.0+cpu"},
            "convention_sources": {"approx_kl": "lib/file.py Trainer.train: approxkl = ..."},
            "not_provided": {"entropy": "no such function"},
        },
    }


FINDINGS_TEXT = """# Findings

<a id="lib-gae-padding"></a>
### lib-gae-padding: the recursion reads padded values

Matrix cells: lib GAE-2, lib IN-1,
  lib GAE-4

```python
print("repro")  # lib GAE-1 here is code, not a cell
```

<a id="lib-approxkl"></a>
### lib-approxkl
Matrix cells: lib PG-5
"""

REPORTS = {
    "mine": _report("mine", [_clause("GAE-2", "pass"), _clause("PG-5", "pass"), _clause("ENT-1", "pass")]),
    "lib": _report(
        "lib",
        [
            _clause("GAE-2", "fail", first_failure="advantages differ"),
            _clause("PG-5", "declared convention", declared_conventions=["approx_kl='k2'"]),
            _clause("ENT-1", "not provided", skip_reasons=["not provided: op 'entropy' is not in the ops"]),
        ],
        {"approx_kl": "'k2'"},
    ),
}


def test_findings_map_cells_to_anchors() -> None:
    cells = _tool().parse_findings([FINDINGS_TEXT])
    assert cells == {
        ("lib", "GAE-2"): ["lib-gae-padding"],
        ("lib", "IN-1"): ["lib-gae-padding"],
        ("lib", "GAE-4"): ["lib-gae-padding"],
        ("lib", "PG-5"): ["lib-approxkl"],
    }


def test_matrix_links_failures_and_conventions() -> None:
    tool = _tool()
    matrix = tool.build_matrix(REPORTS, tool.parse_findings([FINDINGS_TEXT]))
    assert matrix["unexplained_failures"] == []
    rows = {row["id"]: row["verdicts"] for row in matrix["clauses"]}
    assert rows["GAE-2"]["lib"] == {
        "verdict": "fail",
        "findings": ["lib-gae-padding"],
        "detail": "advantages differ",
    }
    text = tool.render_markdown(matrix)
    assert (
        "| GAE-2 | title of GAE-2 | pass | **FAIL**: [lib-gae-padding](findings.md#lib-gae-padding) |" in text
    )
    assert "declared convention ([approx_kl](#lib-convention-approx-kl))" in text
    assert "<a id=\"lib-convention-approx-kl\"></a>`approx_kl='k2'`: lib/file.py Trainer.train" in text
    assert "[not provided](#lib-not-provided-ent-1)" in text
    assert "<a id=\"lib-not-provided-ent-1\"></a>ENT-1: not provided: op 'entropy' is not in the ops" in text
    assert "- op `entropy`: no such function" in text
    assert "lib functions \\| with a pipe" in text  # table-safe provenance
    assert "| `lib` | lib 1.0, torch 2.13.0+cpu | 2026-11-29 12:00 UTC | 12 s |" in text


def test_failure_without_a_finding_is_flagged() -> None:
    tool = _tool()
    matrix = tool.build_matrix(REPORTS, {})
    assert matrix["unexplained_failures"] == ["lib GAE-2"]
    assert "**FAIL** (no findings entry)" in tool.render_markdown(matrix)


def test_a_partial_run_keeps_the_other_columns() -> None:
    tool = _tool()
    findings = tool.parse_findings([FINDINGS_TEXT])
    full = json.loads(json.dumps(tool.build_matrix(REPORTS, findings)))
    updated = tool.build_matrix({"mine": REPORTS["mine"]}, findings, full)
    assert updated["implementations"] == ["mine", "lib"]
    assert updated["clauses"] == full["clauses"]


def test_check_mode_reports_changed_verdicts() -> None:
    tool = _tool()
    matrix = json.loads(json.dumps(tool.build_matrix(REPORTS, {})))
    assert tool.verdict_differences(matrix, REPORTS) == []
    changed = json.loads(json.dumps(REPORTS["lib"]))
    changed["clauses"][0] = _clause("GAE-2", "pass")
    assert tool.verdict_differences(matrix, {"lib": changed}) == ["lib GAE-2: committed 'fail', now 'pass'"]
    assert tool.verdict_differences(matrix, {"other": changed}) == ["other: not in the committed matrix"]


def test_check_mode_exit_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--check --render-only: reads saved reports, compares, writes nothing, exits 1 on a difference."""
    tool = _tool()
    reports = tmp_path / "reports"
    reports.mkdir()
    for name, report in REPORTS.items():
        (reports / f"{name}.run.json").write_text(json.dumps(report), encoding="utf-8")
    committed = tmp_path / "matrix.json"
    committed.write_text(json.dumps(tool.build_matrix(REPORTS, {})), encoding="utf-8")
    monkeypatch.setattr(tool, "MATRIX_JSON", committed)
    monkeypatch.setattr(tool, "REPO", tmp_path)
    monkeypatch.setattr(tool, "ALL_NAMES", ("mine", "lib"))
    before = committed.read_text(encoding="utf-8")
    args = ["--check", "--render-only", "--reports", str(reports), "mine", "lib"]
    assert tool.main(args) == 0
    changed = json.loads(json.dumps(REPORTS["lib"]))
    changed["clauses"][2] = _clause("ENT-1", "pass")
    (reports / "lib.run.json").write_text(json.dumps(changed), encoding="utf-8")
    assert tool.main(args) == 1
    assert committed.read_text(encoding="utf-8") == before


def test_fixture_source_is_what_the_block_expects() -> None:
    """Guards the fixture itself: the pinned text is exactly the dedented source lines."""
    body = textwrap.dedent(TRAINER_SOURCE.split("# --- the math ---\n")[1].split("        # --- end")[0])
    assert body == MATH
