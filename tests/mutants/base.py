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

from ppo_ref.adapters import ReferenceAdapter

__all__ = ["MutantAdapter", "MutantSpec", "bool_mask", "ratio_and_advantages", "work_dtype"]

Inputs = Callable[[], dict[str, Any]]


@dataclass(frozen=True)
class MutantSpec:
    """One mutant.

    Attributes:
        name: short id, ``<bug>-<what>`` (the adapter is named ``mutant:<name>``).
        bug: the row id in ``known-bugs.md`` (``A1``, ``C8``, ...).
        op: the adapter op the bug lives in.
        description: one line: the mistake, in the words of the code.
        trigger: None when the bug shows on nearly every input; otherwise the inputs that expose it
            (the mutant agrees with ``mine`` elsewhere).
        function: the buggy op, with the signature of the reference function of the same name.
        shows_on: keyword arguments of ``op`` on which the mutant disagrees with ``mine``.
        hides_on: for a mutant with a trigger, keyword arguments without the trigger on which it
            agrees with ``mine`` (as close to ``shows_on`` as possible).
    """

    name: str
    bug: str
    op: str
    description: str
    trigger: str | None
    function: Callable[..., Any]
    shows_on: Inputs
    hides_on: Inputs | None = None

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-G]\d+[a-z]?", self.bug):
            raise ValueError(f"bug: expected a known-bugs row id such as 'C8', got {self.bug!r}")
        if (self.trigger is None) != (self.hides_on is None):
            raise ValueError(f"{self.name}: a trigger and a hiding input go together")

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
        self.provenance = f"{mine.provenance}; except {spec.op}: {spec.description} (known-bugs {spec.bug})"
        self.ops: frozenset[str] = mine.ops
        self.conventions: Mapping[str, object] = mine.conventions
        for op in mine.ops:
            setattr(self, op, getattr(mine, op))
        setattr(self, spec.op, spec.function)

    def __repr__(self) -> str:
        return f"MutantAdapter({self.name!r})"


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
