"""Convention inference (issue 20): a failing value clause is re-run under the declarable
alternatives, so a legitimate convention the adapter did not declare is reported as one.

When a test of a value clause fails, :class:`Inference` re-runs it with the reference variant of
each alternative the failing ops allow (:data:`ppo_ref.adapters.conventions.INFERABLE`, each on top
of what the adapter declares): every value of each key alone, then pairs of keys of the same op
among those whose alternative changed the failure. When one makes the failing test pass, every
test of its clauses that calls one of those ops is re-run under it too (the hand cases and the
properties; those that passed with :data:`CHECK_EXAMPLES` examples, those that failed with the
session's count). Only if they all pass is the alternative a :class:`Match`: the verdict of those
clauses becomes ``matches undeclared convention``, with the declaration to paste. A clause no
alternative explains keeps its FAIL.

Keys that only widen a tolerance or change the inputs drawn are never a match; they are suggested
(:class:`Suggestion`) when the failing test passes with them: ``compute_dtype`` (the float32
tolerance), ``constant_groups='rounding'``, ``masked_fill='finite'`` (no NaN or inf in masked-out
slots) and ``prefix_masks`` (masks without holes).

The cost is bounded: only failing value tests are re-run, a test whose clauses already have an
answer is not re-run, and the passing tests of a clause are re-run with a few examples. The session
reports how many re-runs it made and how long they took (:attr:`Inference.reruns`,
:attr:`Inference.seconds`).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import settings

from ppo_ref.adapters import Adapter, ConventionSet
from ppo_ref.adapters.conventions import CONVENTIONS, INFERABLE, OP_CLAUSES, declaration

from . import support
from .strategies import declared_inputs
from .support import Context, compared_adapter
from .variant import ReferenceVariant

__all__ = ["CHECK_EXAMPLES", "Alternative", "Inference", "Match", "Suggestion", "inferable_clause"]

CHECK_EXAMPLES = 5
"""Hypothesis examples per property when a test that passed is re-run under an alternative."""

GENERIC_CLAUSES = frozenset({"IN-1"})
"""Clauses that hold for every op (with the robustness clauses ROB-*): a match there is checked on
the op's own clauses too."""

MATCH = "matches undeclared convention"

SKIPPED = "skipped: "
"""How :meth:`Inference._run` starts the result of a test skipped under an alternative."""
"""The verdict of a clause whose failures an alternative explains."""


def inferable_clause(clause: str) -> bool:
    """Whether inference applies to ``clause``: a clause of an op (not the contract or the
    trainer-step tier). Robustness clauses compare with the reference variant too, so an undeclared
    convention fails them as well; junk that reaches a result is never explained by one."""
    return clause != "CONTRACT" and not clause.startswith("STEP-")


@dataclass(frozen=True)
class Alternative:
    """Convention keys declared on top of the adapter's, as (key, value) pairs in the order tried."""

    declared: tuple[tuple[str, object], ...]

    def __hash__(self) -> int:  # a value may be a mapping ({"k3": 10.0})
        return hash(tuple(self.declarations()))

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(key for key, _ in self.declared)

    def declarations(self) -> list[str]:
        """The lines to paste into the adapter's ``conventions`` mapping."""
        return [declaration(key, value) for key, value in self.declared]

    def reasons(self) -> list[str]:
        """Why each key is a legitimate convention: its meaning and where it is seen (CONVENTIONS)."""
        return [
            f"{key}: {CONVENTIONS[key].meaning} (seen in {CONVENTIONS[key].seen_in})" for key in self.keys
        ]

    def apply(self, conventions: ConventionSet) -> ConventionSet:
        values: dict[str, Any] = {key: CONVENTIONS[key].parse(value) for key, value in self.declared}
        return replace(conventions, **values)


@dataclass(frozen=True)
class Match:
    """An alternative under which every test of ``clauses`` that calls one of ``ops`` passes."""

    alternative: Alternative
    clauses: tuple[str, ...]
    ops: tuple[str, ...]


@dataclass(frozen=True)
class Suggestion:
    """A key that widens a tolerance or changes the inputs, under which the failing test passes."""

    key: str
    value: object
    why: str

    def declaration(self) -> str:
        return declaration(self.key, self.value)


_REFUSES_FLOAT64 = "the op raises on float64 inputs and returns on the same inputs in float32"


def _refusal_told(suggestion: Suggestion) -> Suggestion:
    """``suggestion`` as found by the re-run just made: a ``compute_dtype`` under which the op was
    given float32 inputs because it refused float64 ones says so (float64 is then an input the
    library's pipeline never makes, not a rounding difference)."""
    if suggestion.key != "compute_dtype" or not support.refused_float64():
        return suggestion
    why = (
        f"{_REFUSES_FLOAT64}; if the library's pipeline gives it float32, declare it (the suite then gives "
        "it float32 where it refuses float64, and compares at the float32 tolerance)"
    )
    return replace(suggestion, why=why)


@dataclass(frozen=True)
class _Setting:
    """How one re-run is made: the conventions, and the inputs drawn."""

    conventions: ConventionSet
    masked_fill: str | float
    holes: bool | None = None  # None: as the conventions and the test's clauses say (drawn_inputs)


def _item_ops(item: pytest.Item) -> tuple[str, ...]:
    return tuple(dict.fromkeys(op for marker in item.iter_markers("ops") for op in marker.args))


def _item_clauses(item: pytest.Item) -> tuple[str, ...]:
    return tuple(dict.fromkeys(c for marker in item.iter_markers("clause") for c in marker.args))


@contextlib.contextmanager
def _examples(function: Any, count: int | None) -> Iterator[None]:
    """Run a Hypothesis test with at most ``count`` examples (None: as it is)."""
    current = getattr(function, "_hypothesis_internal_use_settings", None)
    if count is None or current is None or current.max_examples <= count:
        yield
        return
    function._hypothesis_internal_use_settings = settings(current, max_examples=count)
    try:
        yield
    finally:
        function._hypothesis_internal_use_settings = current


@dataclass(eq=False)
class Inference:
    """Re-runs failing value tests under the declarable alternatives (module docstring)."""

    adapter: Adapter
    context: Context
    items: Callable[[], Sequence[pytest.Item]]
    failed: set[str] = field(default_factory=set)
    reruns: int = 0
    seconds: float = 0.0
    _groups: dict[tuple[frozenset[str], tuple[str, ...]], Match | None] = field(default_factory=dict)
    _verified: dict[Alternative, set[str]] = field(default_factory=dict)

    # --- running one test under a setting ---

    def _context(self, conventions: ConventionSet) -> Context:
        if conventions == self.context.conventions:
            return self.context
        adapter = compared_adapter(self.adapter, conventions)
        return Context(adapter, self.context.impl, conventions, ReferenceVariant(conventions))

    def _run(self, item: pytest.Item, setting: _Setting, examples: int | None) -> str | None:
        """None when ``item`` passes under ``setting``, :data:`SKIPPED` and the reason when it is
        skipped (a case the alternative leaves undefined is not applicable under it, as it would be
        declared), else its failure's first line. A test that cannot be re-run (an argument other
        than ``ctx`` and its parameters) fails."""
        if item.get_closest_marker("skip") is not None:
            return None
        function = getattr(item, "obj", None)
        if function is None:
            return "cannot be re-run"
        params: Mapping[str, object] = getattr(getattr(item, "callspec", None), "params", {})
        ctx = self._context(setting.conventions)
        kwargs: dict[str, object] = {}
        for name in inspect.signature(function).parameters:
            if name == "ctx":
                kwargs[name] = ctx
            elif name in params:
                kwargs[name] = params[name]
            else:
                return f"cannot be re-run (argument {name!r})"
        inputs = support.drawn_inputs(setting.conventions, _item_ops(item), _item_clauses(item))
        inputs["masked_fill"] = setting.masked_fill
        if setting.holes is not None:
            inputs["holes"] = setting.holes
        self.reruns += 1
        start = time.monotonic()
        support.configure_precision(setting.conventions.float32_ops)
        support.begin_test()
        try:
            with declared_inputs(**inputs), _examples(function, examples), support.inference_rerun():
                function(**kwargs)
        except pytest.skip.Exception as skipped:
            return f"{SKIPPED}{skipped}"
        except (Exception, pytest.fail.Exception) as error:  # it failed (pytest.fail is no Exception)
            text = str(error).strip().splitlines()
            return text[0] if text else type(error).__name__
        finally:
            support.configure_precision(self.context.conventions.float32_ops)
            self.seconds += time.monotonic() - start
        return None

    def _plain(self, conventions: ConventionSet) -> _Setting:
        return _Setting(conventions, conventions.masked_fill)

    # --- the alternatives ---

    def _singles(self, ops: Iterable[str]) -> list[Alternative]:
        declared = self.context.conventions
        wanted = set(ops)
        found = []
        for key, inferable in INFERABLE.items():
            if not wanted & set(inferable.ops):
                continue
            for value in inferable.values:
                if CONVENTIONS[key].parse(value) != getattr(declared, key):
                    found.append(Alternative(((key, value),)))
        return found

    def _pairs(self, changed: Sequence[Alternative], ops: Iterable[str]) -> list[Alternative]:
        wanted = set(ops)
        pairs = []
        for first, second in itertools.combinations(changed, 2):
            (k1, _), (k2, _) = first.declared[0], second.declared[0]
            if k1 != k2 and wanted & set(INFERABLE[k1].ops) & set(INFERABLE[k2].ops):
                pairs.append(Alternative(first.declared + second.declared))
        return pairs

    def _scope(self, clauses: frozenset[str], ops: tuple[str, ...]) -> list[pytest.Item]:
        """The tests of ``clauses`` that call one of ``ops`` (all of them: run or still to run)."""
        return [
            item
            for item in self.items()
            if clauses & set(_item_clauses(item)) and (not _item_ops(item) or set(_item_ops(item)) & set(ops))
        ]

    def _clause_passes(self, alternative: Alternative, clauses: frozenset[str], ops: tuple[str, ...]) -> bool:
        """Every test of ``clauses`` that calls one of ``ops`` passes under ``alternative``. For the
        clauses that hold for many ops (IN-1 and the robustness clauses, whose cases of one op are
        few), the op's own clauses must pass too: a hand case can agree with a convention by chance."""
        if all(c.startswith("ROB-") or c in GENERIC_CLAUSES for c in clauses):
            clauses = clauses | {c for op in ops for c in OP_CLAUSES.get(op, ())}
        setting = self._plain(alternative.apply(self.context.conventions))
        verified = self._verified.setdefault(alternative, set())
        ran = False  # at least one test of the scope must pass under it, not only skip
        for other in self._scope(clauses, ops):
            if other.nodeid in verified:
                ran = True
                continue
            count = None if other.nodeid in self.failed else CHECK_EXAMPLES
            result = self._run(other, setting, count)
            if result is not None and not result.startswith(SKIPPED):
                return False
            if result is None:
                verified.add(other.nodeid)
                ran = True
        return ran

    def explain(self, item: pytest.Item) -> Match | None:
        """The alternative that explains the failure of ``item`` (a failing test), or None."""
        self.failed.add(item.nodeid)
        clauses = frozenset(c for c in _item_clauses(item) if inferable_clause(c))
        ops = _item_ops(item)
        if not clauses or not ops or len(clauses) != len(_item_clauses(item)):
            return None
        group = (clauses, tuple(sorted(ops)))  # IN-1 of one op is not IN-1 of another
        if group in self._groups:
            known = self._groups[group]
            if known is not None and item.nodeid in self._verified.get(known.alternative, set()):
                return known
            if known is not None:  # not checked under it yet (skipped there, or out of its scope)
                failure = self._run(
                    item, self._plain(known.alternative.apply(self.context.conventions)), None
                )
                return known if failure is None or failure.startswith(SKIPPED) else None
            if known is None:
                return None
        match = self._search(item, clauses, ops)
        self._groups[group] = match
        return match

    def _search(self, item: pytest.Item, clauses: frozenset[str], ops: tuple[str, ...]) -> Match | None:
        declared = self._run(item, self._plain(self.context.conventions), None)
        if declared is None or declared.startswith(SKIPPED):
            return None  # it passes when re-run: nothing to explain (a flaky test stays failed)
        changed: list[Alternative] = []
        singles = self._singles(ops)
        for alternative in singles:
            failure, match = self._try(item, alternative, clauses, ops)
            if match is not None:
                return match
            if failure != declared:
                changed.append(alternative)
        dependent = [a for a in singles if INFERABLE[a.keys[0]].requires in {c.keys[0] for c in changed}]
        for alternative in self._pairs([*changed, *(a for a in dependent if a not in changed)], ops):
            match = self._try(item, alternative, clauses, ops)[1]
            if match is not None:
                return match
        return None

    def _try(
        self, item: pytest.Item, alternative: Alternative, clauses: frozenset[str], ops: tuple[str, ...]
    ) -> tuple[str | None, Match | None]:
        """Re-run ``item`` under ``alternative``: its failure (``None`` where it passed, noted as
        verified), and the match it makes where it passes or skips and explains the clauses."""
        failure = self._run(item, self._plain(alternative.apply(self.context.conventions)), None)
        if failure is None or failure.startswith(SKIPPED):
            if failure is None:
                self._verified.setdefault(alternative, set()).add(item.nodeid)
            if self._clause_passes(alternative, clauses, ops):
                return failure, Match(alternative, tuple(sorted(clauses)), ops)
        return failure, None

    # --- the suggestions ---

    def suggest(self, item: pytest.Item) -> list[Suggestion]:
        """Keys that widen a tolerance or change the inputs under which the failing ``item`` passes."""
        declared = self.context.conventions
        ops = _item_ops(item)
        if not ops or not any(inferable_clause(c) for c in _item_clauses(item)):
            return []
        tries: list[tuple[Suggestion, _Setting]] = []
        if declared.masked_fill == "any":
            why = (
                "the failure needs NaN or inf in masked-out slots; if the library's pipeline never puts them "
                "there, declare it (the robustness clauses ROB-* keep checking them)"
            )
            tries.append((Suggestion("masked_fill", "finite", why), _Setting(declared, "finite")))
        if support.drawn_inputs(declared, ops, _item_clauses(item))["holes"]:
            value = sorted(set(declared.prefix_masks) | set(ops))
            why = (
                "the failure needs holes in the mask; if the library's masks are a prefix of each row, "
                "declare it"
            )
            tries.append(
                (Suggestion("prefix_masks", value, why), _Setting(declared, declared.masked_fill, False))
            )
        if not set(ops) <= declared.float32_ops:
            dtypes = {op: "float32" for op in sorted(set(ops) | declared.float32_ops)}
            why = (
                "the difference is within float32 rounding; if the library computes in float32, declare it "
                "(float64 inputs are then compared at the float32 tolerance)"
            )
            parsed: Any = CONVENTIONS["compute_dtype"].parse(dtypes)
            wider = replace(declared, compute_dtype=parsed)
            tries.append((Suggestion("compute_dtype", dtypes, why), self._plain(wider)))
        if "group_advantages" in ops and declared.constant_groups == "exact":
            why = (
                "constant groups keep the rounding of their mean; if the library has no special case, "
                "declare it"
            )
            conventions = replace(declared, constant_groups="rounding")
            tries.append((Suggestion("constant_groups", "rounding", why), self._plain(conventions)))
        found = [_refusal_told(s) for s, setting in tries if self._run(item, setting, None) is None]
        if found or set(ops) <= declared.float32_ops:
            return found
        return self._with_float32(item, ops)

    def _with_float32(self, item: pytest.Item, ops: tuple[str, ...]) -> list[Suggestion]:
        """A value convention together with the float32 tolerance (issue 28: a library that computes
        in float32 and has its own epsilon fails on either alone): the first single alternative under
        which the failing test passes once ``compute_dtype`` widens the tolerance too, as two
        suggestions (never a match: the tolerance key is one of them)."""
        declared = self.context.conventions
        dtypes = {op: "float32" for op in sorted(set(ops) | declared.float32_ops)}
        parsed: Any = CONVENTIONS["compute_dtype"].parse(dtypes)
        for alternative in self._singles(ops):
            setting = self._plain(replace(alternative.apply(declared), compute_dtype=parsed))
            if self._run(item, setting, None) is not None:
                continue
            other = " ".join(d.rstrip(",") for d in alternative.declarations())
            tail = "float32 rounding plus a convention; declare both if the library computes in float32"
            if support.refused_float64():
                tail = f"{_REFUSES_FLOAT64}, plus a convention; declare both if its pipeline gives it float32"
            return [
                Suggestion("compute_dtype", dtypes, f"passes only together with {other}: {tail}"),
                *(
                    Suggestion(key, value, f"passes only together with the compute_dtype above: {tail}")
                    for key, value in alternative.declared
                ),
            ]
        return []
