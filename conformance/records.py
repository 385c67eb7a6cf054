"""What the conformance report keeps of one test: its id in the suite, its outcome, and its
failure's text split into the message (expected against got), the input it failed on and the
reproduction (:func:`parse_failure`; :func:`failure_lines` gives that text from the exception).

The records are made by the recorder (:class:`.report.ConformanceRecorder`), judged per clause by
:mod:`.verdicts` and summed up in the terminal by :mod:`.compact`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SUITE_DIR", "ParsedFailure", "TestRecord", "failure_lines", "parse_failure", "suite_test_id"]


@dataclass
class TestRecord:
    """The outcome of one test item (all phases folded): passed, failed or skipped, and why.

    A failure keeps its message (expected against got), the input it failed on and the whole
    reproduction (Python code), parsed from the failure's text by :func:`parse_failure`.
    """

    nodeid: str
    clauses: tuple[str, ...]
    outcome: str = "not run"
    message: str = ""
    ops: tuple[str, ...] = ()
    inputs: str = ""
    reproduction: str = ""
    declarations: tuple[str, ...] = ()
    """For a test a convention explains (outcome ``matched``): the lines to paste."""
    reasons: tuple[str, ...] = ()
    """Why each of those conventions is legitimate (its meaning and where it is seen)."""
    suggestions: tuple[str, ...] = ()
    """For a failing test: declarations that widen a tolerance or change the inputs, under which it
    passes (``declaration  # why``)."""
    step_conventions: tuple[tuple[str, str, str], ...] = ()
    """For a passing trainer-step test: the conventions its runner declares that the test applied,
    ``(key, value, source)`` (its ``record_property("step_convention", ...)``), which make the
    clause's verdict ``declared convention``."""


SUITE_DIR = Path(__file__).resolve().parent
"""The suite's directory (``conformance/`` in a checkout, ``ppo_ref_conformance/`` installed)."""


def suite_test_id(path: Path, nodeid: str) -> str | None:
    """A suite test's id in the report: ``conformance/FILE::NAME``, the same whether the suite ran
    from a checkout (where it is pytest's node id) or installed (where pytest's node id depends on
    the directory pytest ran in); None for a test outside the suite."""
    if not isinstance(path, Path):
        raise ValueError(f"path: expected a pathlib.Path, got {type(path).__name__}")
    if not isinstance(nodeid, str) or not nodeid:
        raise ValueError(f"nodeid: expected a non-empty string, got {nodeid!r}")
    try:
        relative = path.resolve().relative_to(SUITE_DIR)
    except ValueError:
        return None
    name = nodeid.split("::", 1)[1] if "::" in nodeid else nodeid
    return f"conformance/{relative.as_posix()}::{name}"


_MESSAGE_ENDS = (
    "assert ",
    "+  where",
    "Failing test case",
    "Falsifying example",
    "# The test",
    "where ",
    "reproduce:",
    "# --- reproduction",
    "Explanation:",
    "You can reproduce",
    "import torch",
)
_EXCEPTION_PREFIXES = ("AssertionError: ", "Failed: ")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][\w\[\], ]* = ")


@dataclass(frozen=True)
class ParsedFailure:
    """A failure's text split into what a reader needs: the message (expected against got), the
    input it failed on, and one whole reproduction (the last one noted: the failing call)."""

    message: str
    inputs: str
    reproduction: str


def _error_lines(text: str) -> list[str]:
    """The ``E`` lines of a pytest failure, stripped (the reproductions' code is flat)."""
    return [line[1:].strip() for line in text.splitlines() if line == "E" or line.startswith("E ")]


def _reproductions(lines: list[str]) -> list[list[str]]:
    """Every reproduction in the lines: Hypothesis notes (``# --- reproduction``) and hand cases
    (the code after ``reproduce:``, or a block that starts with ``import torch``)."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in lines:
        starts = line.startswith("# --- reproduction") or (line == "import torch" and current is None)
        if line == "reproduce:" or starts:
            current = [] if line == "reproduce:" else [line]
            blocks.append(current)
            continue
        if current is None:
            continue
        if not line or line.startswith(("assert ", "Explanation:", "You can reproduce", "Failing test case")):
            current = None
            continue
        if _looks_like_code(line):
            current.append(line)
        else:  # the next problem's message of a hand case: the block has ended
            current = None
    return [block for block in blocks if block]


def _looks_like_code(line: str) -> bool:
    return line.startswith(("import ", "from ", "print(", "#", "nan, inf")) or bool(_ASSIGNMENT.match(line))


def _input_lines(reproduction: list[str]) -> list[str]:
    """The lines of a reproduction that define the inputs and make the call."""
    keep = []
    for line in reproduction:
        if line.startswith(("args = ", "kwargs = ", "result = impl.")):
            keep.append(line)
        elif " = torch.tensor(" in line.split("#")[0] and not line.startswith(("impl", "reference")):
            keep.append(line)
    return keep


def parse_failure(text: str) -> ParsedFailure:
    """Split a failed conformance test's text (pytest's long representation) into message, input
    and reproduction. Nothing is cut: the message keeps every problem line, the reproduction all of
    its code."""
    lines = _error_lines(text)
    message: list[str] = []
    for line in lines:
        if line.startswith(_MESSAGE_ENDS):
            if message:
                break
            continue
        if line:
            message.append(line)
    if not message:
        message = lines[:1] or [line.strip() for line in text.splitlines() if line.strip()][-1:]
    if message:
        for prefix in _EXCEPTION_PREFIXES:
            message[0] = message[0].removeprefix(prefix)
    blocks = _reproductions(lines)
    reproduction = blocks[-1] if blocks else []
    inputs = _input_lines(reproduction)
    if not inputs:  # no reproduction: the example Hypothesis reports
        start = next((i for i, line in enumerate(lines) if line.startswith("Failing test case")), None)
        if start is not None:
            block = []
            for line in lines[start + 1 :]:
                if line == ")":
                    break
                block.append(line)
            inputs = block
    return ParsedFailure("\n".join(message), "\n".join(inputs), "\n".join(reproduction))


def failure_lines(error: BaseException) -> list[str]:
    """The text of a failure: ``Type: message`` and the exception's notes (Hypothesis' example, the
    reproductions). An exception group (several failing examples, a flaky failure) is replaced by
    its first leaf exception, with the group's notes after the leaf's: the report shows one whole
    failure, never only the group's border line ("Hypothesis found 2 distinct failures")."""
    if not isinstance(error, BaseException):
        raise ValueError(f"error: expected an exception, got {type(error).__name__}")
    notes = [str(note) for note in getattr(error, "__notes__", [])]
    inner = getattr(error, "exceptions", None)  # an ExceptionGroup (the backport's on Python 3.10)
    while isinstance(inner, tuple) and inner and isinstance(inner[0], BaseException):
        error = inner[0]
        notes = [str(note) for note in getattr(error, "__notes__", [])] + notes
        inner = getattr(error, "exceptions", None)
    return [f"{type(error).__name__}: {error}", *notes]
