"""Value parsing: each parser turns one declared convention value into its normalised form.

A parser returns the value a :class:`~.convention_set.ConventionSet` field holds (a ``frozenset``
for a collection, a read-only mapping for a per-op or per-method choice, a ``float`` for a number)
or raises ``ValueError`` saying what was expected; the catalogue (:mod:`.catalogue`) gives each key
its parser, and :func:`~.validation.convention_problems` words the error with the key's name.
:func:`float32_ops` reads one normalised value back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from ppo_ref.adapters.base import OP_NAMES
from ppo_ref.adapters.conventions.choices import (
    COMPUTE_DTYPES,
    EDGE_INPUTS,
    GROUP_SINGLETONS,
    MASKED_FILLS,
    MASKED_OUTPUT_OPS,
)
from ppo_ref.group import GROUP_METHODS
from ppo_ref.kl import KL_ESTIMATORS

__all__ = [
    "choice",
    "float32_ops",
    "optional_number",
    "optional_positive",
    "parse_compute_dtype",
    "parse_edge_inputs",
    "parse_group_singleton",
    "parse_kl_clamp",
    "parse_masked_fill",
    "parse_off_mask_outputs",
    "parse_prefix_masks",
    "positive",
    "subset",
]


def choice(*options: object) -> Callable[[object], object]:
    """A parser accepting exactly one of ``options`` (``None`` where it is one; never a bool)."""

    def parse(value: object) -> object:
        if value not in options or isinstance(value, bool):
            raise ValueError(f"expected one of {list(options)}, got {value!r}")
        return value

    return parse


def positive(value: object, minimum: float = 0.0) -> float:
    """A finite number > ``minimum``, as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"expected a finite number > {minimum}, got {value!r}")
    if value <= minimum:
        raise ValueError(f"expected a number > {minimum}, got {value!r}")
    return float(value)


def optional_positive(minimum: float) -> Callable[[object], object]:
    """A parser accepting ``None`` or a finite number > ``minimum``."""

    def parse(value: object) -> object:
        return None if value is None else positive(value, minimum)

    return parse


def subset(options: tuple[str, ...], allow_empty: bool) -> Callable[[object], object]:
    """A parser accepting a collection (not a string) of names from ``options``, as a frozenset;
    empty only with ``allow_empty``."""

    def parse(value: object) -> object:
        if isinstance(value, str) or not isinstance(value, Iterable):
            raise ValueError(f"expected a collection of names from {list(options)}, got {value!r}")
        items = list(value)
        unknown = [item for item in items if item not in options]
        if unknown:
            raise ValueError(f"unknown names {unknown}; expected names from {list(options)}")
        if not items and not allow_empty:
            raise ValueError(f"expected at least one of {list(options)}, got an empty collection")
        return frozenset(items)

    return parse


def optional_number(value: object) -> object:
    """``None`` or a finite number >= 0 (as a float)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"expected None or a finite number >= 0, got {value!r}")
    if value < 0:
        raise ValueError(f"expected a number >= 0, got {value!r}")
    return float(value)


def parse_kl_clamp(value: object) -> object:
    """``kl_clamp``: ``None`` (no clamp), one bound for every estimator, or {estimator: bound}."""
    if value is None:
        return MappingProxyType({})
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in KL_ESTIMATORS]
        if unknown:
            raise ValueError(f"unknown estimators {unknown}; expected keys from {list(KL_ESTIMATORS)}")
        return MappingProxyType({k: positive(v) for k, v in sorted(value.items())})
    bound = positive(value)
    return MappingProxyType(dict.fromkeys(KL_ESTIMATORS, bound))


def parse_masked_fill(value: object) -> object:
    """``masked_fill``: one of :data:`MASKED_FILLS` or a finite number (the pad value)."""
    if isinstance(value, str):
        if value not in MASKED_FILLS:
            raise ValueError(f"expected one of {list(MASKED_FILLS)} or a finite number, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"expected one of {list(MASKED_FILLS)} or a finite number, got {value!r}")
    return float(value)


def parse_edge_inputs(value: object) -> object:
    """``edge_inputs``: ``'all'``, ``'none'`` or a collection of :data:`EDGE_INPUTS`."""
    if value == "all":
        return frozenset(EDGE_INPUTS)
    if value == "none":
        return frozenset()
    return subset(EDGE_INPUTS, allow_empty=True)(value)


def parse_prefix_masks(value: object) -> object:
    """``prefix_masks``: ``'all'`` or a collection of op names."""
    if value == "all":
        return frozenset(OP_NAMES)
    return subset(OP_NAMES, allow_empty=True)(value)


def parse_group_singleton(value: object) -> object:
    """``group_singleton``: one rule, or {method: rule} (every rule ``'zero'`` reads as ``'zero'``)."""
    rule = choice(*GROUP_SINGLETONS)
    if not isinstance(value, Mapping):
        return rule(value)
    unknown = [m for m in value if m not in GROUP_METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; expected keys from {list(GROUP_METHODS)}")
    rules = {str(m): str(rule(r)) for m, r in sorted(value.items())}
    if set(rules.values()) <= {"zero"}:
        return "zero"
    return MappingProxyType(rules)


def parse_compute_dtype(value: object) -> object:
    """``compute_dtype``: one dtype, or {op: dtype} (every dtype float64 reads as ``'float64'``)."""
    if isinstance(value, Mapping):
        unknown = [op for op in value if op not in OP_NAMES]
        if unknown:
            raise ValueError(f"unknown ops {unknown}; expected op names from {list(OP_NAMES)}")
        bad = {op: d for op, d in value.items() if d not in COMPUTE_DTYPES}
        if bad:
            raise ValueError(f"expected dtypes from {list(COMPUTE_DTYPES)}, got {bad}")
        chosen = {op: str(d) for op, d in sorted(value.items())}
        if set(chosen.values()) <= {"float64"}:
            return "float64"
        return MappingProxyType(chosen)
    return choice(*COMPUTE_DTYPES)(value)


def float32_ops(compute_dtype: object) -> frozenset[str]:
    """The ops a normalised ``compute_dtype`` value declares computed in float32.

    >>> sorted(float32_ops(MappingProxyType({"kl_penalty": "float32", "gae": "float64"})))
    ['kl_penalty']
    >>> float32_ops("float64")
    frozenset()
    """
    if isinstance(compute_dtype, Mapping):
        return frozenset(op for op, d in compute_dtype.items() if d == "float32")
    return frozenset(OP_NAMES) if compute_dtype == "float32" else frozenset()


def parse_off_mask_outputs(value: object) -> object:
    """``off_mask_outputs``: ``'zero'``, ``'unspecified'`` or a collection of masked-output ops."""
    if value == "zero":
        return frozenset()
    if value == "unspecified":
        return frozenset(MASKED_OUTPUT_OPS)
    return subset(MASKED_OUTPUT_OPS, allow_empty=True)(value)
