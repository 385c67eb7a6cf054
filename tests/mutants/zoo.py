"""The registry of mutants: ``MUTANTS`` (name -> spec) and ``FACTORIES`` (one factory per mutant).

``--impl=tests.mutants.zoo:FACTORIES.<attribute>`` selects a mutant in the conformance suite, the
attribute being the mutant's name with ``-`` replaced by ``_`` (``MutantSpec.impl`` spells it).
"""

from __future__ import annotations

from types import SimpleNamespace

from tests.mutants import (
    aggregation_mutants,
    correction_mutants,
    family_loss_mutants,
    gae_mutants,
    group_mutants,
    kl_loss_mutants,
    kl_mutants,
    logprob_mutants,
    policy_mutants,
    rpp_mutants,
    value_mutants,
)
from tests.mutants.base import MutantSpec

__all__ = ["FACTORIES", "MUTANTS"]

MUTANTS: dict[str, MutantSpec] = {
    spec.name: spec
    for module in (
        logprob_mutants,
        kl_mutants,
        gae_mutants,
        policy_mutants,
        value_mutants,
        group_mutants,
        aggregation_mutants,
        family_loss_mutants,
        kl_loss_mutants,
        correction_mutants,
        rpp_mutants,
    )
    for spec in module.SPECS
}

if len({spec.attribute for spec in MUTANTS.values()}) != len(MUTANTS):
    raise RuntimeError("two mutants share a factory attribute name")

FACTORIES = SimpleNamespace(**{spec.attribute: spec.make for spec in MUTANTS.values()})
