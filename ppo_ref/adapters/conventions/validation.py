"""Validation: checking an adapter's declared ``conventions`` mapping and normalising it.

:func:`convention_problems` lists every unknown key and invalid value at once (the suite reports
them as a failure of the contract); :func:`parse_conventions` turns a valid mapping into a
:class:`~.convention_set.ConventionSet` (old key names accepted through
:data:`CONVENTION_ALIASES`); :func:`declaration` writes one key and value back as the line to paste
into an adapter's mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from ppo_ref.adapters.conventions.catalogue import CONVENTIONS
from ppo_ref.adapters.conventions.convention_set import ConventionSet

__all__ = ["CONVENTION_ALIASES", "ConventionError", "convention_problems", "declaration", "parse_conventions"]

CONVENTION_ALIASES: Mapping[str, str] = MappingProxyType({"kl_estimators": "reward_kl_estimators"})
"""Old key names still accepted, and the key each one now is."""


class ConventionError(ValueError):
    """An adapter declared an unknown convention key or a value the key does not allow."""


def convention_problems(declared: object) -> list[str]:
    """Every problem with a declared ``conventions`` mapping (unknown keys, invalid values)."""
    if not isinstance(declared, Mapping):
        return [f"conventions: expected a Mapping[str, object], got {declared!r}"]
    problems = []
    renamed = [old for old in CONVENTION_ALIASES if old in declared and CONVENTION_ALIASES[old] in declared]
    problems += [
        f"conventions: both {old!r} and {CONVENTION_ALIASES[old]!r} declared ({old!r} is the old name of "
        f"{CONVENTION_ALIASES[old]!r}; keep one)"
        for old in renamed
    ]
    for declared_key, value in declared.items():
        key = CONVENTION_ALIASES.get(declared_key, declared_key)
        if key not in CONVENTIONS:
            problems.append(
                f"conventions: unknown key {key!r}; known keys are {sorted(CONVENTIONS)} "
                "(see ppo_ref.adapters.conventions.CONVENTIONS)"
            )
            continue
        try:
            CONVENTIONS[key].parse(value)
        except ValueError as error:
            problems.append(f"conventions[{key!r}]: {error} ({CONVENTIONS[key].allowed})")
    return problems


def parse_conventions(declared: Mapping[str, object]) -> ConventionSet:
    """Normalise a declared mapping; :class:`ConventionError` lists every problem at once."""
    problems = convention_problems(declared)
    if problems:
        raise ConventionError("; ".join(problems))
    parsed: dict[str, Any] = {}
    for key, value in declared.items():
        key = CONVENTION_ALIASES.get(key, key)
        parsed[key] = CONVENTIONS[key].parse(value)
    return replace(ConventionSet(), **parsed)


def declaration(key: str, value: object) -> str:
    """The line to paste into an adapter's ``conventions`` mapping for ``key`` declared ``value``.

    >>> declaration("dual_clip", 3.0), declaration("kl_clamp", {"k3": 10.0})
    ('"dual_clip": 3.0,', '"kl_clamp": {"k3": 10.0},')
    """
    if key not in CONVENTIONS:
        raise ValueError(f"key: unknown convention key {key!r}")

    def literal(item: object) -> str:
        if isinstance(item, str):
            return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(item, Mapping):
            return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in item.items()) + "}"
        if isinstance(item, (frozenset, set, tuple, list)):
            items = sorted(item) if isinstance(item, (frozenset, set)) else list(item)
            return "[" + ", ".join(literal(i) for i in items) + "]"
        return repr(item)

    return f"{literal(key)}: {literal(value)},"
