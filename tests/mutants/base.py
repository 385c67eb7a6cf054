"""What a mutant is: a spec (which bug, which op, when it shows) and the adapter it builds.

A :class:`MutantAdapter` has the name ``mutant:<NAME>`` and otherwise the version, provenance, ops
and (empty) conventions of the built-in ``mine`` adapter; every op is the reference function
except the one the spec replaces.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ppo_ref.adapters import ReferenceAdapter, convention_problems

__all__ = ["MutantAdapter", "MutantSpec", "bool_mask", "ratio_and_advantages", "work_dtype"]

Inputs = Callable[[], dict[str, Any]]

CLAUSE_ID = re.compile(r"[A-Z]{2,6}-\d+")
"""A spec clause id: ``GAE-2``, ``GRP-3``, ``CISPO-1``."""
BUG_ID = re.compile(rf"[A-G]\d+[a-z]?|[A-Za-z][A-Za-z0-9_.-]*?(-PR)?#\d+|{CLAUSE_ID.pattern}")
"""``MutantSpec.bug``: a bug-catalogue row id, ``<project>#<n>`` / ``<project>-PR#<n>``, or a clause id."""


@dataclass(frozen=True)
class MutantSpec:
    """One mutant.

    Attributes:
        name: short id, ``<bug>-<what>`` (the adapter is named ``mutant:<name>``).
        bug: where the bug comes from, in one of three forms: a row id of the bug catalogue
            ``docs/bug-catalogue.md`` (``A1``, ``C8``, ``D6b``); an upstream issue or pull request,
            ``<project>#<number>`` or ``<project>-PR#<number>`` (``verl#7321``, ``TRL#3823``,
            ``SkyRL-PR#1928``, ``ms-swift#10117``); or the id of the spec clause whose stated
            pitfall it is, for a mistake the clause names without an upstream report (``GRP-2``).
        op: the adapter op the bug lives in.
        description: one line: the mistake, in the words of the code.
        trigger: None when the bug shows on nearly every input; otherwise the inputs that expose it
            (the mutant agrees with ``mine`` elsewhere).
        function: the buggy op, with the signature of the reference function of the same name.
        shows_on: keyword arguments of ``op`` on which the mutant disagrees with ``mine``.
        hides_on: for a mutant with a trigger, keyword arguments without the trigger on which it
            agrees with ``mine`` (as close to ``shows_on`` as possible).
        clause: the spec clause whose statement the bug breaks (``GRP-3``), where recorded.
        convention: for a mutant that implements a declarable convention exactly (issue 20), the
            declaration that makes it conform (``{"dual_clip": 3.0}``): the suite's inference must
            give its clauses ``matches undeclared convention`` naming these keys, not a FAIL.
    """

    name: str
    bug: str
    op: str
    description: str
    trigger: str | None
    function: Callable[..., Any]
    shows_on: Inputs
    hides_on: Inputs | None = None
    clause: str | None = None
    convention: Mapping[str, object] | None = None

    def __post_init__(self) -> None:
        if not BUG_ID.fullmatch(self.bug):
            raise ValueError(
                "bug: expected a bug-catalogue row id ('C8'), an upstream reference ('verl#7321', "
                f"'SkyRL-PR#1928') or a spec clause id ('GRP-2'), got {self.bug!r}"
            )
        if self.clause is not None and not CLAUSE_ID.fullmatch(self.clause):
            raise ValueError(f"clause: expected a spec clause id such as 'GRP-3', got {self.clause!r}")
        if (self.trigger is None) != (self.hides_on is None):
            raise ValueError(f"{self.name}: a trigger and a hiding input go together")
        if self.convention is not None:
            problems = convention_problems(self.convention)
            if problems or not self.convention:
                found = problems or "got {}"
                raise ValueError(f"{self.name}: convention: expected a valid declaration, {found}")

    @property
    def attribute(self) -> str:
        """The name of this mutant's factory in ``tests.mutants.zoo.FACTORIES``."""
        return re.sub(r"\W", "_", self.name)

    @property
    def impl(self) -> str:
        """The ``--impl`` value that selects this mutant."""
        return f"tests.mutants.zoo:FACTORIES.{self.attribute}"

    def make(self) -> MutantAdapter:
        """A fresh adapter: ``mine`` with this spec's op replaced."""
        return MutantAdapter(self)


class MutantAdapter:
    """``mine`` with one op replaced by a mutant's buggy version."""

    def __init__(self, spec: MutantSpec) -> None:
        mine = ReferenceAdapter()
        if spec.op not in mine.ops:
            raise ValueError(f"op: expected one of {sorted(mine.ops)}, got {spec.op!r}")
        self.spec = spec
        self.name = f"mutant:{spec.name}"
        self.version = mine.version
        self.provenance = f"{mine.provenance}; except {spec.op}: {spec.description} ({_source(spec.bug)})"
        self.ops: frozenset[str] = mine.ops
        self.conventions: Mapping[str, object] = mine.conventions
        for op in mine.ops:
            setattr(self, op, getattr(mine, op))
        setattr(self, spec.op, spec.function)

    def __repr__(self) -> str:
        return f"MutantAdapter({self.name!r})"


def _source(bug: str) -> str:
    """How the provenance cites a bug: its bug-catalogue row, upstream reference or spec clause."""
    if "#" in bug:
        return bug
    if CLAUSE_ID.fullmatch(bug):
        return f"spec {bug}"
    return f"bug {bug} of docs/bug-catalogue.md"


def bool_mask(mask: Tensor) -> Tensor:
    """The mask as bool (True on action tokens)."""
    return mask if mask.dtype == torch.bool else mask != 0


def work_dtype(*tensors: Tensor) -> torch.dtype:
    """float32, or float64 when an input is float64 (the dtype every trainer here computes in)."""
    dtype = torch.float32
    for tensor in tensors:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def ratio_and_advantages(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(bool mask, ratio, advantages) with masked-out entries replaced by 0 before any arithmetic."""
    keep = bool_mask(mask)
    dtype = work_dtype(logp, old_logp)
    zero = torch.zeros((), dtype=dtype)
    log_ratio = torch.where(keep, logp.to(dtype), zero) - torch.where(keep, old_logp.to(dtype), zero)
    return keep, torch.exp(log_ratio), torch.where(keep, advantages.to(dtype), zero)
