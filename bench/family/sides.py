"""The PPO-family benchmark's sides: which module builds the cases of each (ppo-ref and each library).

``mine`` is ppo-ref (:mod:`bench.family.mine`); ``verl``, ``openrlhf``, ``skyrl`` and ``trl116`` are
the libraries, each built in its own ``.envs/NAME`` (:mod:`bench.family.verl`, ...). A library's
second implementation of an op gets its own label (verl's Python-loop ``grpo``/``rloo``
estimators, the defaults of its ``adv_estimator``, are ``verl-loop``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from torch import Tensor

from bench.family.cases import Case, Shapes, make_data
from bench.family.mine import mine_cases
from bench.family.openrlhf import openrlhf_cases
from bench.family.skyrl import skyrl_cases
from bench.family.trl116 import trl116_cases
from bench.family.verl import verl_cases

SIDES = ("mine", "verl", "openrlhf", "skyrl", "trl116")
LIBRARIES = SIDES[1:]

BUILDERS: dict[str, Callable[[dict[str, Tensor]], list[Case]]] = {
    "mine": mine_cases,
    "verl": verl_cases,
    "openrlhf": openrlhf_cases,
    "skyrl": skyrl_cases,
    "trl116": trl116_cases,
}


def cases_for(side: str, shapes: Shapes) -> dict[tuple[str, str], Case]:
    """Every case of ``side`` at ``shapes``, by (key, label)."""
    if side not in BUILDERS:
        raise ValueError(f"side: expected one of {SIDES}, got {side!r}")
    return {(case.key, case.label): case for case in BUILDERS[side](make_data(shapes))}


def iter_keys(side: str, shapes: Shapes) -> Iterator[tuple[str, str]]:
    """(key, label) of every case of ``side`` (builds the inputs; for test parametrisation)."""
    yield from cases_for(side, shapes)
