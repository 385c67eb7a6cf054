"""The inline-source helper (``ppo_ref/adapters/thirdparty/_inline.py``) that the TRL and SB3
adapters use to run a library's own inline math lines, on a throwaway fake library."""

from __future__ import annotations

import importlib
import sys
import textwrap
import traceback
import types
from pathlib import Path

import pytest

from ppo_ref.adapters.thirdparty import _inline
from ppo_ref.adapters.thirdparty._inline import InlineBlock, InlineSourceError, block_digest, locate

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
    frames = [(frame.filename, frame.lineno) for frame in traceback.extract_tb(raised.tb)]
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


def test_fixture_source_is_what_the_block_expects() -> None:
    """Guards the fixture itself: the pinned text is exactly the dedented source lines."""
    body = textwrap.dedent(TRAINER_SOURCE.split("# --- the math ---\n")[1].split("        # --- end")[0])
    assert body == MATH
