"""Each vocabulary of the math layer is written once (issue 25).

The math modules export every vocabulary as a ``Literal`` and a tuple (``LOSS_AGGREGATIONS``,
``GROUP_METHODS``, ``KL_ESTIMATORS``, ...). Outside the math layer no tuple, list, set or
``Literal`` may spell out two or more strings of one vocabulary: the trainer's config, the
conventions, the suite's strategies, the tools and the benchmarks import the math's names instead,
so adding a mode edits one line.

Two kinds of place may still name several members, because what they state is not the vocabulary
but a fact about something else:

- a third-party adapter (``ppo_ref/adapters/thirdparty/``) declares which modes *that library*
  implements, each cited to its code; a new mode in ppo-ref is not one the library gains;
- :data:`ALLOWED` lists the other sites with the fact each states (a clause that holds for some
  members only, an inference candidate that is not a member of the math vocabulary's order).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

MATH_VOCABULARIES = {
    "ppo_ref.aggregation": ("LOSS_AGGREGATIONS",),
    "ppo_ref.group": ("GROUP_METHODS", "STD_SCOPES", "SINGLETON_RULES"),
    "ppo_ref.kl": ("KL_ESTIMATORS",),
    "ppo_ref.kl_loss": ("KL_LOSS_ESTIMATORS",),
    "ppo_ref.correction": ("CORRECTION_LEVELS", "CORRECTION_MODES"),
    "ppo_ref.losses": ("VALUE_CLIP_FORMS",),
    "ppo_ref.masked": ("EPS_PLACEMENTS",),
}
"""The math layer's vocabularies: module -> the tuples it exports (each derived from a ``Literal``)."""

SCANNED = ("ppo_ref/adapters", "ppo_ref/trainer", "ppo_ref/cli.py", "conformance", "tools", "bench")
"""Everything outside the math layer that ships or runs (the tests' own cases are data, not copies)."""

EXEMPT = ("ppo_ref/adapters/thirdparty",)
"""Third-party adapters: their tuples declare what a library implements (see the module docstring)."""

ALLOWED = {
    (
        "conformance/test_family_advantages.py",
        ("dr_grpo", "rloo"),
    ): "GRP-4's rule for the methods without a std",
    (
        "conformance/test_family_correction.py",
        ("sequence", "sequence-geometric"),
    ): "IS-2: the sequence levels",
    ("conformance/test_kl.py", ("k1", "k3")): "KL-1: the estimators unbiased for KL(pi||ref)",
    ("ppo_ref/adapters/conventions/inferable.py", ("k1", "neg-k1", "k2")): "approx_kl inference candidates",
    ("bench/family/cases.py", ("k3", "k3+")): "the KL-loss estimators GRPO trainers use, benchmarked",
    ("bench/family/openrlhf.py", ("token-mean", "seq-mean-token-mean")): "the modes OpenRLHF's side has",
}
"""(file, the strings) -> the fact the site states."""


def _vocabularies() -> dict[str, frozenset[str]]:
    found: dict[str, frozenset[str]] = {}
    for module, names in MATH_VOCABULARIES.items():
        loaded = importlib.import_module(module)
        for name in names:
            found[f"{module}.{name}"] = frozenset(getattr(loaded, name))
    return found


def _string_groups(tree: ast.AST) -> list[tuple[int, tuple[str, ...]]]:
    """(line, the string constants) of every tuple, list, set and ``Literal[...]`` in ``tree``."""
    groups: set[tuple[int, tuple[str, ...]]] = set()  # a Literal's tuple is met twice: once here
    for node in ast.walk(tree):
        elements: list[ast.expr] | None = None
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            elements = node.elts
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "Literal"
        ):
            elements = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if elements:
            strings = tuple(
                e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
            if len(strings) >= 2:
                groups.add((node.lineno, strings))
    return sorted(groups)


def vocabulary_copies(root: Path = REPO) -> list[str]:
    """``file:line: VOCABULARY [members]`` for every group of two or more members of one math
    vocabulary outside the math layer, the exempt adapters and :data:`ALLOWED`."""
    vocabularies = _vocabularies()
    copies = []
    for scanned in SCANNED:
        base = root / scanned
        paths = [base] if base.is_file() else sorted(base.rglob("*.py"))
        for path in paths:
            relative = path.relative_to(root).as_posix()
            if relative.startswith(EXEMPT):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), relative)
            for line, strings in _string_groups(tree):
                if (relative, strings) in ALLOWED:
                    continue
                named = [name for name, members in vocabularies.items() if len(set(strings) & members) >= 2]
                if named:
                    copies.append(f"{relative}:{line}: {list(strings)} (members of {', '.join(named)})")
    return copies


def test_each_math_vocabulary_is_a_literal_and_its_tuple() -> None:
    import typing

    for module, names in MATH_VOCABULARIES.items():
        loaded = importlib.import_module(module)
        for name in names:
            literals = [
                value
                for value in vars(loaded).values()
                if typing.get_origin(value) is typing.Literal
                and typing.get_args(value) == getattr(loaded, name)
            ]
            assert literals, f"{module}.{name} is not the get_args of a Literal of its module"


def test_no_vocabulary_is_written_outside_the_math_layer() -> None:
    copies = vocabulary_copies()
    assert not copies, "import the math layer's vocabulary instead:\n" + "\n".join(copies)


def test_every_allowed_site_still_exists() -> None:
    for (relative, strings), fact in ALLOWED.items():
        groups = _string_groups(ast.parse((REPO / relative).read_text(encoding="utf-8")))
        assert any(found == strings for _line, found in groups), f"{relative}: {strings} ({fact}) is gone"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('MODES = ("token-mean", "seq-mean-token-sum")', 1),
        ('x: Literal["k1", "k2", "k3"] = "k1"', 1),
        ('MODES = {"grpo", "rloo"}', 1),
        ('ONE = ("token-mean", "other")', 0),
        ("from ppo_ref.kl import KL_ESTIMATORS", 0),
    ],
)
def test_the_scan_finds_a_copy(tmp_path: Path, source: str, expected: int) -> None:
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "example.py").write_text(source + "\n", encoding="utf-8")
    assert len(vocabulary_copies(tmp_path)) == expected
