"""The clause maps: which spec clauses a declared convention value touches.

The report lists, under each clause, the declared conventions that change its expected values or
narrow what it checks (:meth:`~.convention_set.ConventionSet.clauses`). Each catalogue entry
(:mod:`.catalogue`) gives its key a function from the normalised value to those clause ids; the
functions and the per-op and per-option maps they read are here. :data:`OP_CLAUSES` is derived
from the op registry (:data:`ppo_ref.ops.OPS`). The others restate, as a chosen subset, what the
suite's ``clause`` and ``needs`` markers say (``conformance/``); they are not derived from them,
because the math and the adapters never import the suite and the report lists a missing option
under the clause that checks it only. ``tests/test_convention_clauses.py`` checks the narrowing
keys' maps against the markers: each clause named for a missing option is a clause of a test that
needs that option.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from ppo_ref.adapters.base import OP_NAMES
from ppo_ref.adapters.conventions.choices import MASKED_OUTPUT_OPS
from ppo_ref.adapters.conventions.parsing import float32_ops
from ppo_ref.kl import KL_ESTIMATORS
from ppo_ref.ops import OPS

__all__ = [
    "AGGREGATION_CLAUSES",
    "OFF_MASK_CLAUSES",
    "OPTION_CLAUSES",
    "OP_CLAUSES",
    "PREFIX_MASK_CLAUSES",
    "compute_dtype_clauses",
    "kl_clauses",
    "masked_fill_clauses",
    "missing",
    "off_mask_clauses",
    "prefix_mask_clauses",
    "static",
    "statistic_clauses",
]

OP_CLAUSES: Mapping[str, tuple[str, ...]] = MappingProxyType({op.name: op.clauses for op in OPS.values()})
"""The clauses whose tests call each op (for the report rows a per-op convention touches)."""
PREFIX_MASK_CLAUSES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "masked_mean": ("MASK-1",),
        "masked_whiten": ("MASK-2", "MASK-3"),
        "kl_penalty": ("KL-1", "KL-2", "KL-3"),
        "token_rewards": ("RWD-1", "RWD-2"),
        "gae": ("GAE-2", "RPP-1"),
        "policy_loss": ("PG-1", "PG-2", "PG-3", "PG-5", "PG-6", "PG-7"),
        "value_loss": ("VF-1", "VF-2"),
    }
)
"""Op -> the clauses a ``prefix_masks`` declaration for it touches (they draw hole-free masks)."""
OFF_MASK_CLAUSES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "masked_whiten": ("MASK-3", "RPP-1", "RPP-2"),
        "kl_penalty": ("KL-1", "KL-2", "KL-3"),
        "token_rewards": ("RWD-1", "RWD-3"),
        "gae": ("GAE-2", "GAE-4", "RPP-1"),
        "rollout_correction": ("IS-3",),
    }
)
"""Op -> the clauses an ``off_mask_outputs`` declaration for it touches (its outputs off the mask
are not compared)."""
AGGREGATION_CLAUSES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "token-mean": ("PG-2",),
        "seq-mean-token-mean": ("PG-2",),
        "seq-mean-token-sum": ("PG-2",),
        "seq-mean-token-sum-norm": ("AGG-1",),
    }
)
"""Loss aggregation -> the clause reported when ``loss_aggregations`` leaves it out."""
OPTION_CLAUSES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "clip_eps_high": ("CLIP-1", "CLIP-3"),
        "dual_clip": ("CLIP-2", "CLIP-3"),
        "counts": ("AGG-1", "AGG-2", "AGG-3"),
    }
)
"""``policy_loss`` option -> the clauses reported when ``policy_loss_options`` leaves it out."""


def static(*clause_ids: str) -> Callable[[object], tuple[str, ...]]:
    """The same clauses whatever the value (a key that changes one formula)."""
    return lambda _value: clause_ids


def kl_clauses(estimators: object) -> tuple[str, ...]:
    """KL-n of each estimator named (k1 -> KL-1, ...), and RWD-1, whose rewards carry the KL."""
    names = estimators if isinstance(estimators, Iterable) else ()
    return (*(f"KL-{KL_ESTIMATORS.index(k) + 1}" for k in sorted(names)), "RWD-1")


def statistic_clauses(statistics: object) -> tuple[str, ...]:
    """``unmasked_statistics``: the clause of each statistic named (PG-3, PG-5), and IN-1."""
    names = statistics if isinstance(statistics, Iterable) else ()
    by_name = {"clipfrac": "PG-3", "approx_kl": "PG-5"}
    return (*(by_name[s] for s in sorted(names)), "IN-1")


def missing(
    options: tuple[str, ...], by_option: Mapping[str, tuple[str, ...]]
) -> Callable[[object], tuple[str, ...]]:
    """Clauses of the options a declared subset leaves out (a narrowing key touches only those)."""

    def clauses(value: object) -> tuple[str, ...]:
        kept = set(value) if isinstance(value, Iterable) and not isinstance(value, str) else set(options)
        return tuple(dict.fromkeys(c for option in options if option not in kept for c in by_option[option]))

    return clauses


def masked_fill_clauses(value: object) -> tuple[str, ...]:
    """A pad value or zeros narrow IN-1 (only that value is written there); ``finite`` is the default
    and ``any`` widens the check, so neither marks IN-1 as a declared convention."""
    return () if value in ("any", "finite") else ("IN-1",)


def prefix_mask_clauses(value: object) -> tuple[str, ...]:
    """``prefix_masks``: the hole checks (:data:`PREFIX_MASK_CLAUSES`) of the ops named."""
    ops = value if isinstance(value, Iterable) and not isinstance(value, str) else ()
    return tuple(dict.fromkeys(c for op in OP_NAMES if op in ops for c in PREFIX_MASK_CLAUSES.get(op, ())))


def compute_dtype_clauses(value: object) -> tuple[str, ...]:
    """``compute_dtype``: every clause of the ops declared computed in float32."""
    ops = float32_ops(value)
    return tuple(dict.fromkeys(c for op in OP_NAMES if op in ops for c in OP_CLAUSES.get(op, ())))


def off_mask_clauses(value: object) -> tuple[str, ...]:
    """``off_mask_outputs``: the off-mask checks (:data:`OFF_MASK_CLAUSES`) of the ops named."""
    ops = value if isinstance(value, Iterable) and not isinstance(value, str) else ()
    return tuple(dict.fromkeys(c for op in MASKED_OUTPUT_OPS if op in ops for c in OFF_MASK_CLAUSES[op]))
