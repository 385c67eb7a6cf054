"""Check one function against the spec, from inside your own pytest run, without writing an adapter.

    from ppo_ref_conformance import check_op          # installed (pip install "ppo-ref[conformance]")

    def test_my_policy_loss_conforms():
        check_op("policy_loss", my_policy_loss)

:func:`check_op` wraps the function in a one-op adapter (``ops = {op}``, the function as that op,
the ``conventions`` you pass) and runs the whole suite against it with :func:`.api.run_conformance`:
the same clauses, the same tests, the same verdicts (``pass``, ``declared convention``, ``matches
undeclared convention``, ``fail``, ``not provided``) and kinds (value, edge, robustness) as ``pytest
--pyargs ppo_ref_conformance --impl=...`` with an adapter that provides only that op. It keeps the
clauses that concern the op: the op's own clauses (its row of the op registry :data:`ppo_ref.ops.OPS`,
listed even when the adapter's declarations leave them ``not provided``), every other clause one of
whose tests ran (the masked-input, edge and robustness clauses that call the op), and ``CONTRACT``.
Any of those failing raises :class:`OpConformanceError` (an ``AssertionError``, so pytest reports it
as a failing test) whose message is one block per failing clause (its kind,
first failing test, expected against got, a reproduction); otherwise it returns
the :class:`OpCheck`.

The function's signature is the reference function's of the same name in :mod:`ppo_ref` (the
``*Op`` protocols of :mod:`ppo_ref.adapters.base`); ``conventions`` are the keys of
:mod:`ppo_ref.adapters.conventions` (e.g. ``{"loss_aggregations": ("token-mean",)}`` for a loss that
implements one aggregation). A failure's reproduction builds the wrapper with
:func:`one_op_adapter` from your function's import path when it has one (a module-level function of
an importable module), so it runs outside the check; ``impl.<op>`` is your function. Hypothesis'
settings profile is restored after the run (the suite loads its own), so the rest of your session
keeps yours.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType, SimpleNamespace
from typing import Any

from hypothesis import settings
from hypothesis.errors import InvalidArgument

from ppo_ref.adapters.conventions import convention_problems
from ppo_ref.ops import OP_NAMES, OPS

from .api import ClauseResult, ConformanceReport, run_conformance

__all__ = ["OneOpAdapter", "OpCheck", "OpConformanceError", "check_op", "one_op_adapter"]

_UNCHECKED = ("not provided", "not applicable", "not run")
"""Verdicts of a clause none of whose tests ran."""

_registered = SimpleNamespace()
"""The one-op adapters of the calls in progress, by key: ``--impl`` names them as
``<this module>:_registered.<key>`` (the registry resolves an importable ``module:attribute``)."""


class OneOpAdapter:
    """An adapter that provides one op: ``fn`` under the op's name (see :func:`check_op`)."""

    def __init__(self, op: str, fn: Callable[..., Any], conventions: Mapping[str, object], name: str) -> None:
        self.name = name
        self.version = str(getattr(fn, "__version__", "") or "unversioned")
        self.provenance = f"{op}: {_qualified_name(fn)} (wrapped by ppo_ref_conformance.check_op)"
        self.ops: frozenset[str] = frozenset({op})
        self.conventions: Mapping[str, object] = MappingProxyType(dict(conventions))
        setattr(self, op, fn)

    def __repr__(self) -> str:
        return f"OneOpAdapter(name={self.name!r}, ops={sorted(self.ops)})"


@dataclass(frozen=True)
class OpCheck:
    """What :func:`check_op` found: the clauses that concern the op, and the whole report."""

    op: str
    clauses: tuple[ClauseResult, ...]
    report: ConformanceReport
    conventions: Mapping[str, object]
    """The conventions declared for the op (``check_op``'s argument)."""
    module: str
    """The checked function's ``__module__`` (``?`` when it has none)."""
    qualname: str
    """The checked function's ``__qualname__`` (its type's name when it has none)."""

    @property
    def passed(self) -> bool:
        """No clause of :attr:`clauses` failed."""
        return not self.failures()

    def failures(self) -> tuple[ClauseResult, ...]:
        """The failing clauses, in the spec's order."""
        return tuple(c for c in self.clauses if c.verdict == "fail")

    def verdicts(self) -> dict[str, str]:
        """Clause id -> verdict, for :attr:`clauses`."""
        return {c.id: c.verdict for c in self.clauses}

    def summary(self) -> str:
        """One line per clause (id, kind, verdict, tests), then each failure's message and reproduction."""
        lines = [f"check_op({self.op!r}, {self.report.data['implementation']['provenance']}):"]
        for c in self.clauses:
            tests = f"{c.passed_tests} passed, {c.failed_tests} failed, {c.skipped_tests} skipped"
            lines.append(f"  {c.id:<9} {c.kind:<10} {c.verdict:<30} ({tests})")
        for c in self.failures():
            lines += ["", f"FAIL ({c.kind}) {c.id}: {c.title}", f"  test: {c.first_failure_test}"]
            lines += ["  " + line for line in c.first_failure.splitlines()]
            lines += ["  declaration that would pass it: " + s for s in c.suggestions]
            if c.reproduction:
                lines += ["  reproduction:"]
                lines += ["    " + line for line in self._reproduction(c.reproduction).splitlines()]
        return "\n".join(lines)

    def _reproduction(self, code: str) -> str:
        """``code`` with the wrapper built by :func:`one_op_adapter` from the checked function's import
        path where it has one (a module-level function of an importable module)."""
        module, qualname, target = self.module, self.qualname, f"{self.module}.{self.qualname}"
        importable = module not in ("?", "__main__") and "<" not in qualname and "." not in qualname
        build = f"one_op_adapter({self.op!r}, {qualname}, conventions={dict(self.conventions)!r})"
        lines = []
        for line in code.splitlines():
            if line.startswith("impl = get_adapter(") and importable:
                lines += [f"from {__name__} import one_op_adapter", f"from {module} import {qualname}"]
                lines.append(f"impl = {build}")
            elif line.startswith("impl = get_adapter("):
                lines += [f"# impl is {build}, {target} not importable: build it where the function is", line]
            else:
                lines.append(line)
        return "\n".join(lines)


class OpConformanceError(AssertionError):
    """A clause that concerns the op failed; ``check`` is the :class:`OpCheck` (``str()``: its summary)."""

    def __init__(self, check: OpCheck) -> None:
        super().__init__(check.summary())
        self.check = check


def _names(fn: Callable[..., Any]) -> tuple[str, str]:
    """``fn``'s module and qualified name (``?`` and its type's name where it has none)."""
    return getattr(fn, "__module__", None) or "?", getattr(fn, "__qualname__", None) or type(fn).__name__


def _qualified_name(fn: Callable[..., Any]) -> str:
    return ".".join(_names(fn))


def one_op_adapter(
    op: str,
    fn: Callable[..., Any],
    *,
    conventions: Mapping[str, object] | None = None,
    name: str | None = None,
) -> OneOpAdapter:
    """The adapter :func:`check_op` runs the suite on: ``fn`` as the op ``op``, nothing else.

    ``--impl`` cannot name it (it is built from a function object); a failure's reproduction builds it
    with this function. Raises ``ValueError`` for an unknown op, a non-callable ``fn``, conventions
    the suite does not know or an empty ``name``.
    """
    if not isinstance(op, str) or op not in OP_NAMES:
        raise ValueError(f"op: expected one of {list(OP_NAMES)}, got {op!r}")
    if not callable(fn):
        raise ValueError(f"fn: expected a callable (the function checked as {op!r}), got {type(fn).__name__}")
    declared: Mapping[str, object] = {} if conventions is None else conventions
    if not isinstance(declared, Mapping):
        raise ValueError(f"conventions: expected a mapping of convention keys, got {type(declared).__name__}")
    problems = convention_problems(declared)
    if problems:
        raise ValueError("conventions: " + "; ".join(problems))
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ValueError(f"name: expected a non-empty str or None, got {name!r}")
    return OneOpAdapter(op, fn, declared, name.strip() if name else _qualified_name(fn))


def check_op(
    op: str,
    fn: Callable[..., Any],
    *,
    conventions: Mapping[str, object] | None = None,
    name: str | None = None,
    examples: int | None = None,
    report: str | os.PathLike[str] | None = None,
    raise_on_failure: bool = True,
    pytest_args: Sequence[str] = (),
) -> OpCheck:
    """Run the conformance suite on ``fn`` as the op ``op`` (see the module docstring).

    ``op``: an op name of the adapter contract (:data:`ppo_ref.adapters.OP_NAMES`, e.g.
    ``"policy_loss"``, ``"gae"``, ``"group_advantages"``). ``fn``: the function, with the signature
    of ``ppo_ref.<op>``. ``conventions``: declared deviations, as an adapter's ``conventions``
    (default: none). ``name``: the implementation's name in the report (default: the function's
    qualified name). ``examples``, ``report``, ``pytest_args``: as :func:`.api.run_conformance`.
    ``raise_on_failure``: raise :class:`OpConformanceError` when a clause fails (default), else
    return the :class:`OpCheck` either way.

    Raises ``ValueError`` for a bad argument (an unknown op, a non-callable ``fn``, conventions the
    suite does not know), before anything runs.
    """
    if not isinstance(raise_on_failure, bool):
        raise ValueError(f"raise_on_failure: expected a bool, got {raise_on_failure!r}")
    # checked here, not only by run_conformance: "-q" is prepended below, which would split a str
    if isinstance(pytest_args, str) or not all(isinstance(a, str) for a in pytest_args):
        raise ValueError(f"pytest_args: expected a sequence of strings, got {pytest_args!r}")

    adapter = one_op_adapter(op, fn, conventions=conventions, name=name)
    key = f"adapter_{id(adapter):x}"
    setattr(_registered, key, adapter)
    profile = settings.get_current_profile_name()
    saved = {}
    for profile_name in dict.fromkeys((profile, "default")):
        try:
            saved[profile_name] = settings.get_profile(profile_name)
        except InvalidArgument:  # no such profile
            pass
    try:
        full = run_conformance(
            f"{__name__}:_registered.{key}",
            report=report,
            examples=examples,
            pytest_args=["-q", *pytest_args],
        )
    finally:
        delattr(_registered, key)
        for profile_name, profile_settings in saved.items():
            settings.register_profile(profile_name, profile_settings)
        settings.load_profile(profile)
    own = set(OPS[op].clauses)
    kept = tuple(c for c in full.clauses if c.id == "CONTRACT" or c.id in own or c.verdict not in _UNCHECKED)
    module, qualname = _names(fn)
    check = OpCheck(op, kept, full, dict(adapter.conventions), module, qualname)
    if raise_on_failure and not check.passed:
        raise OpConformanceError(check)
    return check
