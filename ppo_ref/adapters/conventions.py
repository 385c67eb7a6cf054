"""Declared conventions: the documented deviations an adapter may declare, and the reference
variants the conformance suite checks a declared convention against.

Real PPO implementations (TRL, verl, OpenRLHF, torchrl, stable-baselines3, skyrl-train, ...) differ
in defensible ways: the clip-fraction definition, biased whitening, a dual clip, the value-loss scale,
the approx-KL estimator, whitening inside GAE, ... Each entry's ``seen_in`` names the libraries and
functions that do it; ``docs/conformance-matrix.md`` shows which convention each third-party adapter
declares, and ``docs/findings.md`` the disagreements that are not conventions. An adapter declares
such choices in its ``conventions`` mapping, with keys and values from :data:`CONVENTIONS`; the
suite then compares the adapter with :class:`ReferenceVariant`, the reference functions with those
conventions applied, instead of the plain reference. Anything not declared must match the
reference: an undeclared deviation fails. An unknown key or an invalid value is itself a failure
(:func:`convention_problems`).

Some keys narrow what is checked instead of changing a formula (``kl_estimators``,
``loss_aggregations``, ``policy_loss_options``, ``value_clip_modes``, ``gae_bootstrap="none"``,
``clipfrac=None``, ``approx_kl=None``, and for the PPO-family ops ``group_methods``,
``group_std_scopes``, ``kl_loss_estimators``, ``correction_levels``, ``correction_modes``): the
checks that need the missing capability are skipped as "not provided". Features added to an
existing op after third-party adapters were written (the ``seq-mean-token-sum-norm`` mode, the
``clip_eps_high``, ``dual_clip`` and count keywords) are such capabilities, so an adapter that
predates them declares their absence and keeps its verdicts.

Every variant is built from the :mod:`ppo_ref` functions, with the conventions passed as their
keywords (``masked_whiten(unbiased=)``, ``policy_loss(dual_clip=)``, ``value_loss(clip_form=)``) or
applied to their inputs and outputs (a clamped KL estimate, a moved score, a scaled loss), never a
second copy of a formula; with no convention declared, each op of the variant *is* the reference
call. Each key's reference value is written once, in :data:`CONVENTIONS`; the defaults of
:class:`ConventionSet` read it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

import ppo_ref
from ppo_ref.adapters.base import OP_NAMES as _OP_NAMES
from ppo_ref.aggregation import LOSS_AGGREGATIONS
from ppo_ref.correction import CORRECTION_LEVELS, CORRECTION_MODES
from ppo_ref.group import GROUP_METHODS
from ppo_ref.group import STD_SCOPES as GROUP_STD_SCOPES
from ppo_ref.kl import KL_ESTIMATORS, last_action_index
from ppo_ref.kl_loss import KL_LOSS_ESTIMATORS
from ppo_ref.masked import EPS_PLACEMENTS, WHITEN_EPS
from ppo_ref.ops import OPS

__all__ = [
    "CISPO_BOUNDS",
    "CONSTANT_GROUPS",
    "CONVENTIONS",
    "CONVENTION_ALIASES",
    "CORRECTION_BOUNDS",
    "CORRECTION_LEVELS",
    "CORRECTION_MODES",
    "EDGE_INPUTS",
    "GROUP_METHODS",
    "GROUP_SINGLETONS",
    "GROUP_STD_SCOPES",
    "GSPO_CLIPFRACS",
    "INFERABLE",
    "KL_ESTIMATORS",
    "KL_LOSS_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "MASKED_OUTPUT_OPS",
    "OP_CLAUSES",
    "POLICY_LOSS_OPTIONS",
    "WHITEN_MODES",
    "Convention",
    "ConventionError",
    "ConventionSet",
    "ReferenceVariant",
    "VariantGSPOLoss",
    "VariantPolicyLoss",
    "constant_group_bound",
    "convention_problems",
    "declaration",
    "float32_ops",
    "parse_conventions",
    "singleton_rows",
    "singleton_rule",
    "with_value_slot",
]

POLICY_LOSS_OPTIONS: tuple[str, ...] = ("clip_eps_high", "dual_clip", "counts")
"""Keywords of ``policy_loss`` (and, for ``counts``, of every loss op) an adapter may lack:
``clip_eps_high`` (CLIP-1), ``dual_clip`` (CLIP-2), ``counts`` (``norm_constant``, ``token_count``,
``row_count``, and ``value_loss``'s ``loss_agg``: AGG-1..3)."""
GROUP_SINGLETONS: tuple[str, ...] = ("zero", "raw-score", "unguarded")
CONSTANT_GROUPS: tuple[str, ...] = ("exact", "rounding")
CISPO_BOUNDS: tuple[str, ...] = ("offsets", "absolute-cap")
GSPO_CLIPFRACS: tuple[str, ...] = ("sequences", "tokens")
CORRECTION_BOUNDS: tuple[str, ...] = ("truncate-low", "mask-open-low")
"""What ``rollout_correction`` does with ``low`` (an adapter may lack either): ``truncate-low``, a
``low`` in truncate mode raises the weights below it to it; ``mask-open-low``, mask mode without a
``low`` keeps every weight up to ``high``."""
POLICY_STATISTICS: tuple[str, ...] = ("clipfrac", "approx_kl")
VALUE_CLIP_MODES: tuple[str, ...] = ("clipped", "unclipped")
MASKED_FILLS: tuple[str, ...] = ("any", "finite", "zero")
"""What a library's own pipeline puts into the masked-out slots of an op's per-token inputs (besides
a number, its pad value): ``any`` (anything, NaN and +-inf included: ppo-ref declares it), ``finite``
(finite values of the same kind as the action tokens', e.g. a forward pass's log-probs at pad
tokens: the default, what every pipeline produces), ``zero``. The value clauses are checked on such
inputs; the robustness clauses (ROB-*) always write NaN, +-inf and arbitrary floats there."""
EDGE_INPUTS: tuple[str, ...] = ("holes", "empty_rows", "inf_logits")
"""Inputs some pipelines produce and most never do (issue 20): masks with ``holes`` (tool or
observation tokens inside a response: multi-turn agents), ``empty_rows`` (a row without an action
token, a batch or micro-batch without any, ``T = 0``), ``inf_logits`` (``-inf`` logits: banned
tokens). By default the value clauses never draw them and the edge clauses (kind ``edge``) do; an
adapter whose pipeline produces one declares it in ``edge_inputs`` and the clauses about it become
value clauses."""
CALL_CONTEXTS: tuple[str, ...] = ("none", "batch-token-count")
"""What the adapter passes a loss besides the contract's arguments, as the library's own engine does:
nothing (the reference), or the batch's action-token count (verl's engine passes the global batch's
token count to ``agg_loss``)."""
_PREFIX_MASK_CLAUSES: Mapping[str, tuple[str, ...]] = MappingProxyType(
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


class ConventionError(ValueError):
    """An adapter declared an unknown convention key or a value the key does not allow."""


# --- value parsers: return the normalised value or raise ValueError with what was expected ---


def _choice(*options: object) -> Callable[[object], object]:
    def parse(value: object) -> object:
        if value not in options or isinstance(value, bool):
            raise ValueError(f"expected one of {list(options)}, got {value!r}")
        return value

    return parse


def _positive(value: object, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"expected a finite number > {minimum}, got {value!r}")
    if value <= minimum:
        raise ValueError(f"expected a number > {minimum}, got {value!r}")
    return float(value)


def _optional_positive(minimum: float) -> Callable[[object], object]:
    def parse(value: object) -> object:
        return None if value is None else _positive(value, minimum)

    return parse


def _subset(options: tuple[str, ...], allow_empty: bool) -> Callable[[object], object]:
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


def _optional_number(value: object) -> object:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"expected None or a finite number >= 0, got {value!r}")
    if value < 0:
        raise ValueError(f"expected a number >= 0, got {value!r}")
    return float(value)


def _kl_clamp(value: object) -> object:
    if value is None:
        return MappingProxyType({})
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in KL_ESTIMATORS]
        if unknown:
            raise ValueError(f"unknown estimators {unknown}; expected keys from {list(KL_ESTIMATORS)}")
        return MappingProxyType({k: _positive(v) for k, v in sorted(value.items())})
    bound = _positive(value)
    return MappingProxyType(dict.fromkeys(KL_ESTIMATORS, bound))


def _masked_fill(value: object) -> object:
    if isinstance(value, str):
        if value not in MASKED_FILLS:
            raise ValueError(f"expected one of {list(MASKED_FILLS)} or a finite number, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"expected one of {list(MASKED_FILLS)} or a finite number, got {value!r}")
    return float(value)


def _edge_inputs(value: object) -> object:
    if value == "all":
        return frozenset(EDGE_INPUTS)
    if value == "none":
        return frozenset()
    return _subset(EDGE_INPUTS, allow_empty=True)(value)


def _masked_fill_clauses(value: object) -> tuple[str, ...]:
    """A pad value or zeros narrow IN-1 (only that value is written there); ``finite`` is the default
    and ``any`` widens the check, so neither marks IN-1 as a declared convention."""
    return () if value in ("any", "finite") else ("IN-1",)


def _prefix_masks(value: object) -> object:
    if value == "all":
        return frozenset(_OP_NAMES)
    return _subset(_OP_NAMES, allow_empty=True)(value)


def _prefix_mask_clauses(value: object) -> tuple[str, ...]:
    ops = value if isinstance(value, Iterable) and not isinstance(value, str) else ()
    return tuple(dict.fromkeys(c for op in _OP_NAMES if op in ops for c in _PREFIX_MASK_CLAUSES.get(op, ())))


def _group_singleton(value: object) -> object:
    choice = _choice(*GROUP_SINGLETONS)
    if not isinstance(value, Mapping):
        return choice(value)
    unknown = [m for m in value if m not in GROUP_METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; expected keys from {list(GROUP_METHODS)}")
    rules = {str(m): str(choice(r)) for m, r in sorted(value.items())}
    if set(rules.values()) <= {"zero"}:
        return "zero"
    return MappingProxyType(rules)


def singleton_rule(group_singleton: object, method: str) -> str:
    """The declared ``group_singleton`` rule for ``method``'s groups of one: the value itself, or for
    a per-method mapping the method's entry (``'zero'``, the reference, for a method it leaves out).

    >>> singleton_rule(MappingProxyType({"grpo": "raw-score"}), "rloo"), singleton_rule("unguarded", "rloo")
    ('zero', 'unguarded')
    """
    if isinstance(group_singleton, Mapping):
        return str(group_singleton.get(method, "zero"))
    return str(group_singleton)


def constant_group_bound(scores: Tensor, group_size: int, std_eps: float | None = None) -> float:
    """The largest |advantage| a constant group of ``group_size`` ``scores`` may get under
    ``constant_groups='rounding'``: ``4 * n * eps * max|r|`` (eps the machine epsilon of the scores'
    dtype), the rounding of the group's float mean or leave-one-out sum. With ``std_eps`` (GRPO
    dividing by ``std + std_eps``) that rounding is divided by the group's std, itself rounding
    (>= 0), plus ``std_eps``: the bound is multiplied by ``max(1, 1 / std_eps)`` (three scores of
    -0.2 in float64: ``-0.2 - mean = 2.8e-17``, over ``std + 1e-6`` gives 2.8e-11: verl and RLinf).

    >>> constant_group_bound(torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64), 3) > 1.39e-17
    True
    >>> constant_group_bound(torch.tensor([-0.2, -0.2, -0.2], dtype=torch.float64), 3, std_eps=1e-6) > 2.8e-11
    True
    """
    if group_size < 1:
        raise ValueError(f"group_size: expected >= 1, got {group_size}")
    if std_eps is not None and not std_eps > 0:
        raise ValueError(f"std_eps: expected > 0 or None, got {std_eps}")
    dtype = scores.dtype if scores.dtype.is_floating_point else torch.float64
    largest = float(scores.detach().abs().max()) if scores.numel() else 0.0
    amplification = 1.0 if std_eps is None else max(1.0, 1.0 / std_eps)
    return 4.0 * group_size * torch.finfo(dtype).eps * largest * amplification


OP_CLAUSES: Mapping[str, tuple[str, ...]] = MappingProxyType({op.name: op.clauses for op in OPS.values()})
"""The clauses whose tests call each op (for the report rows a per-op convention touches)."""
MASKED_OUTPUT_OPS: tuple[str, ...] = (
    "masked_whiten",
    "kl_penalty",
    "token_rewards",
    "gae",
    "rollout_correction",
)
"""Ops with a per-token output and a mask: the spec fixes their outputs off the mask (0), unless the
adapter declares ``off_mask_outputs`` unspecified for them."""
_OFF_MASK_CLAUSES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "masked_whiten": ("MASK-3", "RPP-1", "RPP-2"),
        "kl_penalty": ("KL-1", "KL-2", "KL-3"),
        "token_rewards": ("RWD-1", "RWD-3"),
        "gae": ("GAE-2", "GAE-4", "RPP-1"),
        "rollout_correction": ("IS-3",),
    }
)
WHITEN_MODES: tuple[str, ...] = ("shift-mean", "keep-mean")
"""``masked_whiten(shift_mean=True)`` and ``masked_whiten(shift_mean=False)``."""
COMPUTE_DTYPES: tuple[str, ...] = ("float64", "float32")
CONVENTION_ALIASES: Mapping[str, str] = MappingProxyType({"kl_estimators": "reward_kl_estimators"})
"""Old key names still accepted, and the key each one now is."""


def _compute_dtype(value: object) -> object:
    if isinstance(value, Mapping):
        unknown = [op for op in value if op not in _OP_NAMES]
        if unknown:
            raise ValueError(f"unknown ops {unknown}; expected op names from {list(_OP_NAMES)}")
        bad = {op: d for op, d in value.items() if d not in COMPUTE_DTYPES}
        if bad:
            raise ValueError(f"expected dtypes from {list(COMPUTE_DTYPES)}, got {bad}")
        chosen = {op: str(d) for op, d in sorted(value.items())}
        if set(chosen.values()) <= {"float64"}:
            return "float64"
        return MappingProxyType(chosen)
    return _choice(*COMPUTE_DTYPES)(value)


def float32_ops(compute_dtype: object) -> frozenset[str]:
    """The ops a normalised ``compute_dtype`` value declares computed in float32.

    >>> sorted(float32_ops(MappingProxyType({"kl_penalty": "float32", "gae": "float64"})))
    ['kl_penalty']
    >>> float32_ops("float64")
    frozenset()
    """
    if isinstance(compute_dtype, Mapping):
        return frozenset(op for op, d in compute_dtype.items() if d == "float32")
    return frozenset(_OP_NAMES) if compute_dtype == "float32" else frozenset()


def _compute_dtype_clauses(value: object) -> tuple[str, ...]:
    ops = float32_ops(value)
    return tuple(dict.fromkeys(c for op in _OP_NAMES if op in ops for c in OP_CLAUSES.get(op, ())))


def _off_mask_outputs(value: object) -> object:
    if value == "zero":
        return frozenset()
    if value == "unspecified":
        return frozenset(MASKED_OUTPUT_OPS)
    return _subset(MASKED_OUTPUT_OPS, allow_empty=True)(value)


def _off_mask_clauses(value: object) -> tuple[str, ...]:
    ops = value if isinstance(value, Iterable) and not isinstance(value, str) else ()
    return tuple(dict.fromkeys(c for op in MASKED_OUTPUT_OPS if op in ops for c in _OFF_MASK_CLAUSES[op]))


@dataclass(frozen=True)
class Convention:
    """One convention key: its reference value, what it may be declared as, the clauses it touches."""

    key: str
    reference: object
    allowed: str
    meaning: str
    seen_in: str
    parse: Callable[[object], object] = field(repr=False)
    clauses: Callable[[object], tuple[str, ...]] = field(repr=False)


def _static(*clause_ids: str) -> Callable[[object], tuple[str, ...]]:
    return lambda _value: clause_ids


def _kl_clauses(estimators: object) -> tuple[str, ...]:
    names = estimators if isinstance(estimators, Iterable) else ()
    return (*(f"KL-{KL_ESTIMATORS.index(k) + 1}" for k in sorted(names)), "RWD-1")


def _statistic_clauses(statistics: object) -> tuple[str, ...]:
    names = statistics if isinstance(statistics, Iterable) else ()
    by_name = {"clipfrac": "PG-3", "approx_kl": "PG-5"}
    return (*(by_name[s] for s in sorted(names)), "IN-1")


def _missing(
    options: tuple[str, ...], by_option: Mapping[str, tuple[str, ...]]
) -> Callable[[object], tuple[str, ...]]:
    """Clauses of the options a declared subset leaves out (a narrowing key touches only those)."""

    def clauses(value: object) -> tuple[str, ...]:
        kept = set(value) if isinstance(value, Iterable) and not isinstance(value, str) else set(options)
        return tuple(dict.fromkeys(c for option in options if option not in kept for c in by_option[option]))

    return clauses


_ALL_KL = frozenset(KL_ESTIMATORS)
_AGGREGATION_CLAUSES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "token-mean": ("PG-2",),
        "seq-mean-token-mean": ("PG-2",),
        "seq-mean-token-sum": ("PG-2",),
        "seq-mean-token-sum-norm": ("AGG-1",),
    }
)
_OPTION_CLAUSES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "clip_eps_high": ("CLIP-1", "CLIP-3"),
        "dual_clip": ("CLIP-2", "CLIP-3"),
        "counts": ("AGG-1", "AGG-2", "AGG-3"),
    }
)

CONVENTIONS: Mapping[str, Convention] = MappingProxyType(
    {
        c.key: c
        for c in (
            Convention(
                "clipfrac",
                "flat-branch",
                "'flat-branch', 'ratio-outside' or None (not reported)",
                "share of action tokens counted as clipped: on the flat branch (clip(r)A < rA), or "
                "with the ratio outside [1-eps, 1+eps] whatever the sign of A",
                "ratio-outside: torchrl ClipPPOLoss, stable-baselines3 PPO.train, CleanRL, Spinning Up",
                _choice("flat-branch", "ratio-outside", None),
                _static("PG-3"),
            ),
            Convention(
                "approx_kl",
                "k3",
                "'k3', 'k1', 'neg-k1', 'k2' or None (not reported)",
                "the approx_kl statistic: k3 mean((r-1) - log r), k1 mean(old_logp - logp), neg-k1 "
                "the opposite sign mean(logp - old_logp), k2 0.5*mean((logp - old_logp)^2)",
                "k1: verl ppo_kl, OpenRLHF ppo_kl, torchrl kl_approx; k2: TRL approxkl; neg-k1: "
                "a library outside the matrix met by the issue-11 trial adapters (mean log-ratio)",
                _choice("k3", "k1", "neg-k1", "k2", None),
                _static("PG-5", "GSPO-3"),
            ),
            Convention(
                "unmasked_statistics",
                frozenset(),
                "a collection of 'clipfrac', 'approx_kl'",
                "these statistics are averaged over every position of the batch (B*T), masked-out "
                "positions counting as 0, so padding dilutes them",
                "TRL 1.12 PPOTrainer approxkl (mean over all positions)",
                _subset(POLICY_STATISTICS, allow_empty=True),
                _statistic_clauses,
            ),
            Convention(
                "whiten_variance",
                "unbiased",
                "'unbiased' or 'biased'",
                "masked_whiten divides by sqrt(var + 1e-8) with the biased (1/n) variance",
                "OpenRLHF masked_normalize, lm-human-preferences whiten(unbiased=False)",
                _choice("unbiased", "biased"),
                _static("MASK-2", "MASK-3"),
            ),
            Convention(
                "gae_whitening",
                "none",
                "'none', 'unbiased' or 'biased'",
                "gae returns advantages whitened over all action tokens of the batch (with that "
                "variance); returns stay raw advantages + values",
                "TRL 1.12 PPOTrainer, verl compute_gae_advantage_return, skyrl-train",
                _choice("none", "unbiased", "biased"),
                _static("GAE-1", "GAE-2", "GAE-3", "GAE-4"),
            ),
            Convention(
                "gae_bootstrap",
                "last-values",
                "'last-values' or 'none'",
                "'none': gae takes no last_values (cannot bootstrap a truncated row); only terminal "
                "rows are checked",
                "TRL, verl, OpenRLHF, skyrl-train GAE functions",
                _choice("last-values", "none"),
                _static("GAE-3"),
            ),
            Convention(
                "score_placement",
                "last-action-token",
                "'last-action-token' or 'after-last-action-token'",
                "the score goes on the position after the row's last action token (the first slot "
                "after EOS), or on the last action token when it is the last column",
                "TRL 1.12 PPOTrainer (first pad slot after EOS)",
                _choice("last-action-token", "after-last-action-token"),
                _static("RWD-2"),
            ),
            Convention(
                "kl_clamp",
                MappingProxyType({}),
                "None, a number c > 0, or {estimator: c}",
                "the per-token KL estimate is clamped to [-c, c] (for the given estimators)",
                "OpenRLHF compute_approx_kl (all, 10), verl kl_penalty low_var_kl (k3, 10)",
                _kl_clamp,
                lambda value: _kl_clauses(value if isinstance(value, Mapping) else ()),
            ),
            Convention(
                "reward_kl_estimators",
                _ALL_KL,
                "a non-empty collection of 'k1', 'k2', 'k3'",
                "the estimators of the KL in the reward (kl_penalty and token_rewards) the library "
                "accepts; the others are not provided. The KL loss has its own key, "
                "kl_loss_estimators. 'kl_estimators' is the old name of this key, still accepted",
                "TRL (k1, k3), torchrl KLRewardTransform (k1)",
                _subset(KL_ESTIMATORS, allow_empty=False),
                lambda value: _kl_clauses(_ALL_KL - frozenset(value) if isinstance(value, Iterable) else ()),
            ),
            Convention(
                "dual_clip",
                None,
                "None or a number c > 1",
                "for A < 0 the per-token objective is max(min(rA, clip(r)A), cA) (Ye et al. 2020)",
                "verl compute_policy_loss_vanilla (c = 3 always on)",
                _optional_positive(1.0),
                _static("PG-1"),
            ),
            Convention(
                "log_ratio_clamp",
                None,
                "None or a number c > 0",
                "logp - old_logp is clamped to [-c, c] before the ratio and every statistic",
                "verl compute_policy_loss_vanilla (20)",
                _optional_positive(0.0),
                _static("PG-1", "PG-3", "PG-5"),
            ),
            Convention(
                "loss_aggregations",
                frozenset(LOSS_AGGREGATIONS),
                "a non-empty collection of 'token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum', "
                "'seq-mean-token-sum-norm'",
                "the loss_agg modes the loss ops accept (policy_loss, and value_loss, cispo_loss, kl_loss "
                "where provided); the others are not provided",
                "OpenRLHF PolicyLoss (token-level only); every adapter written before "
                "seq-mean-token-sum-norm (AGG-1) joined the reference",
                _subset(LOSS_AGGREGATIONS, allow_empty=False),
                _missing(LOSS_AGGREGATIONS, _AGGREGATION_CLAUSES),
            ),
            Convention(
                "policy_loss_options",
                frozenset(POLICY_LOSS_OPTIONS),
                "a collection of 'clip_eps_high', 'dual_clip', 'counts' (may be empty)",
                "the keywords policy_loss accepts beyond the contract's first signature: clip_eps_high "
                "(asymmetric clip, CLIP-1), dual_clip (CLIP-2), counts (norm_constant, token_count, "
                "row_count for every loss op, and value_loss's loss_agg; AGG-1..3); the others are "
                "not provided",
                "every third-party adapter written before CLIP-1..3 and AGG-1..3 (their wrappers take "
                "none of these keywords)",
                _subset(POLICY_LOSS_OPTIONS, allow_empty=True),
                _missing(POLICY_LOSS_OPTIONS, _OPTION_CLAUSES),
            ),
            Convention(
                "group_methods",
                frozenset(GROUP_METHODS),
                "a non-empty collection of 'grpo', 'dr_grpo', 'rloo'",
                "the methods group_advantages accepts; the others are not provided",
                "TRL GRPOTrainer (grpo; dr_grpo is scale_rewards='none'), TRL RLOOTrainer (rloo)",
                _subset(GROUP_METHODS, allow_empty=False),
                _missing(GROUP_METHODS, dict.fromkeys(GROUP_METHODS, ("GRP-1",))),
            ),
            Convention(
                "group_std_scopes",
                frozenset(GROUP_STD_SCOPES),
                "a non-empty collection of 'group', 'batch', 'none'",
                "the std_scope values group_advantages accepts for grpo; the others are not provided",
                "batch: TRL scale_rewards='batch' only; verl and OpenRLHF divide by the group's std",
                _subset(GROUP_STD_SCOPES, allow_empty=False),
                _missing(GROUP_STD_SCOPES, dict.fromkeys(GROUP_STD_SCOPES, ("GRP-2",))),
            ),
            Convention(
                "group_std_eps",
                None,
                "None (eps honoured as passed) or a number >= 0",
                "grpo divides by std + this fixed epsilon whatever eps is passed (it decides the "
                "advantages of near-constant groups)",
                "TRL GRPOTrainer 1e-4; verl compute_grpo_outcome_advantage and skyrl-train 1e-6; "
                "OpenRLHF group_norm 1e-9",
                _optional_number,
                _static("GRP-2"),
            ),
            Convention(
                "group_singleton",
                "zero",
                "'zero', 'raw-score' or 'unguarded', or a mapping method -> one of them (a method it "
                "leaves out: 'zero')",
                "a group of one sample: A = 0 (zero); its mean taken as 0 and its std as 1, so "
                "A = r (grpo: r / (1 + eps); raw-score); no guard, A = NaN from 0/0 where the formula "
                "divides by n - 1 (grpo's group std, rloo's leave-one-out mean; dr_grpo and a std_scope "
                "other than 'group' give r - r = 0: unguarded)",
                "raw-score: verl compute_grpo_outcome_advantage and compute_rloo_outcome_advantage; "
                "{grpo, dr_grpo: raw-score, rloo: zero}: skyrl-train (compute_rloo_outcome_advantage "
                "gives a lone sample 0); unguarded: OpenRLHF rloo and group_norm (divide by n - 1 = 0)",
                _group_singleton,
                _static("GRP-3"),
            ),
            Convention(
                "constant_groups",
                "exact",
                "'exact' or 'rounding'",
                "a group whose scores are all equal: advantages exactly 0 (exact), or 0 up to the "
                "rounding of the group's float mean or leave-one-out sum, |A| <= 4 n eps max|r| with "
                "eps the machine epsilon of the scores' dtype and n the group's size (rounding)",
                "rounding: verl, OpenRLHF, skyrl-train and TRL 1.16 (r - mean, or r - (sum - r) / "
                "(n - 1), with no special case: three scores of 0.1 give -1.39e-17)",
                _choice(*CONSTANT_GROUPS),
                _static("GRP-3", "GRP-4"),
            ),
            Convention(
                "cispo_bounds",
                "offsets",
                "'offsets' or 'absolute-cap'",
                "how cispo_loss reads its bounds: [1 - clip_low, 1 + clip_high] (offsets), or the "
                "absolute cap min(rho, clip_high) with no lower bound and clip_low ignored (absolute-cap)",
                "offsets: verl compute_policy_loss_cispo, skyrl-train (0.3.1's defaults 0 and 5 give "
                "[1, 6], fixed in SkyRL PR #1928); absolute-cap: TRL GRPOTrainer loss_type='cispo' "
                "(clamp(max=epsilon_high))",
                _choice(*CISPO_BOUNDS),
                _static("CISPO-1", "CISPO-2"),
            ),
            Convention(
                "gspo_clipfrac",
                "sequences",
                "'sequences' or 'tokens'",
                "what gspo_loss's clipfrac counts: the share of sequences on the flat branch "
                "(sequences), or the share of action tokens in them (tokens: the statistic the GSPO "
                "paper reports, Zheng et al. 2025, arXiv 2507.18071 section 5.3 and Fig. 4, 'fractions "
                "of clipped tokens'); the loss is the same",
                "tokens: verl compute_policy_loss_gspo (actor/pg_clipfrac = masked_mean over tokens), "
                "OpenRLHF PolicyLoss policy_loss_type='gspo' (ppo_clip_ratio = masked_mean(surr2 < "
                "surr1) over tokens)",
                _choice(*GSPO_CLIPFRACS),
                _static("GSPO-3"),
            ),
            Convention(
                "kl_loss_estimators",
                frozenset(KL_LOSS_ESTIMATORS),
                "a non-empty collection of 'k1', 'k2', 'k3', 'k3+'",
                "the estimators kl_loss accepts; the others are not provided",
                "TRL GRPOTrainer (k3 only); OpenRLHF (k1, k2, k3)",
                _subset(KL_LOSS_ESTIMATORS, allow_empty=False),
                _missing(KL_LOSS_ESTIMATORS, dict.fromkeys(KL_LOSS_ESTIMATORS, ("KLL-1", "KLL-2"))),
            ),
            Convention(
                "correction_levels",
                frozenset(CORRECTION_LEVELS),
                "a non-empty collection of 'token', 'sequence', 'sequence-geometric'",
                "the levels rollout_correction accepts; the others are not provided",
                "TRL vllm_importance_sampling (token, sequence); OpenRLHF (token)",
                _subset(CORRECTION_LEVELS, allow_empty=False),
                _missing(
                    CORRECTION_LEVELS,
                    {"token": ("IS-1",), "sequence": ("IS-2",), "sequence-geometric": ("IS-2",)},
                ),
            ),
            Convention(
                "correction_modes",
                frozenset(CORRECTION_MODES),
                "a non-empty collection of 'truncate', 'mask'",
                "the modes rollout_correction accepts; the others are not provided",
                "TIS-only libraries (truncate)",
                _subset(CORRECTION_MODES, allow_empty=False),
                _missing(CORRECTION_MODES, dict.fromkeys(CORRECTION_MODES, ("IS-1",))),
            ),
            Convention(
                "correction_bounds",
                frozenset(CORRECTION_BOUNDS),
                "a collection of 'truncate-low', 'mask-open-low' (may be empty)",
                "what rollout_correction does with low: truncate-low, mode='truncate' also raises the "
                "weights below low to low; mask-open-low, mode='mask' takes low=None (keeps w <= high); "
                "without them the suite passes no low in truncate mode and always one in mask mode",
                "verl compute_rollout_correction_weights (a float threshold is TIS with no floor, "
                "IcePop's 'lower_upper' needs a lower bound), skyrl-train 0.3.1 (a TIS cap only)",
                _subset(CORRECTION_BOUNDS, allow_empty=True),
                _missing(CORRECTION_BOUNDS, dict.fromkeys(CORRECTION_BOUNDS, ("IS-1",))),
            ),
            Convention(
                "value_loss_scale",
                0.5,
                "a number > 0 (reference 0.5)",
                "the factor in front of the mean squared error (1.0: no 1/2)",
                "stable-baselines3 F.mse_loss (1.0)",
                lambda value: _positive(value),
                _static("VF-1", "VF-2"),
            ),
            Convention(
                "value_clip_form",
                "max",
                "'max' or 'clipped-only'",
                "clipped value loss: max of the unclipped and clipped errors, or the clipped error only",
                "stable-baselines3 PPO.train (clipped only)",
                _choice("max", "clipped-only"),
                _static("VF-1"),
            ),
            Convention(
                "value_clip_modes",
                frozenset(VALUE_CLIP_MODES),
                "a non-empty collection of 'clipped', 'unclipped'",
                "which value losses value_loss computes (clip_eps a number, or None); the others are "
                "not provided",
                "TRL 1.12 PPOTrainer (always clipped)",
                _subset(VALUE_CLIP_MODES, allow_empty=False),
                lambda value: tuple(
                    c
                    for c, m in (("VF-1", "clipped"), ("VF-2", "unclipped"))
                    if isinstance(value, Iterable) and m not in value
                ),
            ),
            Convention(
                "value_loss_agg",
                "token-mean",
                "'token-mean' or 'seq-mean-token-mean'",
                "how the per-token value loss is averaged",
                "skyrl-train ppo value loss (seq-mean-token-mean)",
                _choice("token-mean", "seq-mean-token-mean"),
                _static("VF-1", "VF-2"),
            ),
            # --- contract gaps closed (issue 11, part 6) ---
            Convention(
                "compute_dtype",
                "float64",
                "'float64', 'float32', or {op: 'float32' | 'float64'}",
                "the precision the library computes in: 'float64' computes float64 inputs in float64 "
                "(the reference); 'float32' (for every op, or the ops named) casts to float32, so "
                "float64 examples of those ops are compared at the float32 tolerance "
                "(conformance.support.FLOAT32_COMPUTE_TOLERANCE) instead of 1e-7, and where such an "
                "op raises on float64 inputs it is given them cast to float32",
                "OpenRLHF compute_approx_kl (kl_penalty: .float() before the estimate); any library "
                "that casts log-probs to float32 before the loss; ms-swift compute_advantages_dynamic "
                "(refuses float64 scores)",
                _compute_dtype,
                _compute_dtype_clauses,
            ),
            Convention(
                "off_mask_outputs",
                frozenset(),
                "'zero' (the reference), 'unspecified', or a collection of op names",
                "'unspecified' (for every op with a per-token output, or the ops named): what the op "
                "returns on masked-out positions is not part of its result, so its outputs are "
                "compared on the action tokens only (the reference returns 0 there, as the spec says)",
                "verl compute_gae_advantage_return and skyrl-train (advantages off the mask follow "
                "the recursion, the library never reads them); OpenRLHF compute_approx_kl without a "
                "mask",
                _off_mask_outputs,
                _off_mask_clauses,
            ),
            Convention(
                "whiten_eps",
                WHITEN_EPS,
                "a number > 0 (reference 1e-8)",
                "the epsilon of the whitening (masked_whiten, and gae_whitening inside gae)",
                "1e-8 everywhere in the matrix (verl, skyrl-train, OpenRLHF masked_normalize, "
                "stable-baselines3); other values in libraries outside it",
                lambda value: _positive(value),
                _static("MASK-3", "GAE-1", "GAE-2", "GAE-3", "GAE-4", "RPP-1", "RPP-2"),
            ),
            Convention(
                "whiten_eps_placement",
                "inside-sqrt",
                "'inside-sqrt', 'outside-sqrt' or 'clamp'",
                "where the whitening epsilon goes: 1/sqrt(var + eps) (inside-sqrt), 1/(std + eps) "
                "(outside-sqrt), 1/sqrt(max(var, eps)) (clamp); ppo_ref.masked_whiten(eps_placement=)",
                "outside-sqrt: stable-baselines3 PPO.train (advantages.std() + 1e-8); clamp: OpenRLHF "
                "masked_normalize (var.clamp(min=eps).rsqrt()); inside-sqrt: verl, skyrl-train",
                _choice(*EPS_PLACEMENTS),
                _static("MASK-3", "GAE-1", "GAE-2", "GAE-3", "GAE-4", "RPP-1", "RPP-2"),
            ),
            Convention(
                "whiten_modes",
                frozenset(WHITEN_MODES),
                "a non-empty collection of 'shift-mean', 'keep-mean'",
                "the whitenings masked_whiten computes: shift-mean (shift_mean=True) and keep-mean "
                "(shift_mean=False, the mean added back); the others are not provided",
                "skyrl-train normalize_advantages_dict (shift-mean only); libraries that only "
                "whiten advantages",
                _subset(WHITEN_MODES, allow_empty=False),
                _missing(WHITEN_MODES, {"shift-mean": ("MASK-3",), "keep-mean": ("MASK-3",)}),
            ),
            Convention(
                "score_clip",
                None,
                "None or a number c > 0",
                "token_rewards clamps the score to [-c, c] before adding it",
                "OpenRLHF compute_reward (reward_clip_range (-10, 10) by default)",
                _optional_positive(0.0),
                _static("RWD-2"),
            ),
            Convention(
                "clipfrac_agg",
                "token-mean",
                "'token-mean' or 'seq-mean-token-mean'",
                "how the clip fraction is averaged: over the batch's action tokens (token-mean), or "
                "per sequence over its action tokens, then over the sequences with one "
                "(seq-mean-token-mean)",
                "libraries that reduce their statistics with the loss's seq-mean aggregation; met by "
                "the issue-11 trial adapters (libraries outside the matrix)",
                _choice("token-mean", "seq-mean-token-mean"),
                _static("PG-3"),
            ),
            # --- input conventions: what the library's own pipeline feeds its functions (issue 11) ---
            Convention(
                "masked_fill",
                "finite",
                "'any', 'finite', 'zero' or a finite number (the pad value)",
                "what the library's pipeline puts into the masked-out slots of per-token inputs; the "
                "value clauses draw such inputs (finite values by default, what every pipeline "
                "produces), the robustness clauses (ROB-*) NaN, +-inf and any float whatever is "
                "declared",
                "any: ppo-ref (its value clauses are checked with junk there); zero: TRL 1.12 "
                "PPOTrainer (masked_fill of values and rewards), torchrl and stable-baselines3 "
                "buffers; finite: verl, OpenRLHF, skyrl-train (log-probs and values of a forward pass "
                "at pad tokens)",
                _masked_fill,
                _masked_fill_clauses,
            ),
            Convention(
                "prefix_masks",
                frozenset(),
                "'all' or a collection of op names",
                "for these ops the library's masks are a prefix of each row (right padding, no holes): "
                "the suite draws hole-free masks for them and skips the hole checks",
                "all: TRL 1.12 PPOTrainer (masks from sequence_lengths); gae: torchrl "
                "generalized_advantage_estimate and stable-baselines3 RolloutBuffer (no mask argument: "
                "done/episode flags only); not OpenRLHF, whose multi-turn agent makes holes its "
                "get_advantages_and_returns runs through (docs/findings.md openrlhf-2)",
                _prefix_masks,
                _prefix_mask_clauses,
            ),
            Convention(
                "edge_inputs",
                frozenset(),
                "'all', 'none' or a collection of 'holes', 'empty_rows', 'inf_logits'",
                "the edge inputs the library's own pipeline produces: masks with holes, rows or "
                "batches without an action token, -inf logits. Undeclared, the value clauses never "
                "draw them and the edge clauses (kind edge: EDGE-1..3, GAE-2, RWD-3, PG-6) check "
                "them apart; declared, those clauses are value clauses and every value clause draws "
                "them",
                "all: ppo-ref; holes: OpenRLHF (its multi-turn agent masks the environment's tokens "
                "between turns, docs/findings.md openrlhf-2)",
                _edge_inputs,
                _static(),
            ),
            Convention(
                "value_after_last_action_token",
                "untrained",
                "'untrained' or 'trained'",
                "'trained': the slot after each row's last action token (where score_placement="
                "'after-last-action-token' puts the score) is a state with a value: the value loss "
                "covers it and GAE runs through it (its advantage stays 0, its return is the score)",
                "TRL 1.12 PPOTrainer (padding_mask_p1 for the values and the value loss)",
                _choice("untrained", "trained"),
                _static("VF-1", "VF-2", "GAE-2", "GAE-4"),
            ),
            Convention(
                "log_ratio_clamp_statistics",
                "clamped",
                "'clamped' or 'raw'",
                "with log_ratio_clamp declared: approx_kl from the clamped log-ratio (clamped, like "
                "the ratio) or from the raw logp - old_logp (raw)",
                "raw: OpenRLHF PolicyLoss (ppo_kl from the unclamped log-ratio); clamped: verl, skyrl-train",
                _choice("clamped", "raw"),
                _static("PG-5"),
            ),
            Convention(
                "call_context",
                "none",
                "'none' or 'batch-token-count'",
                "what the adapter passes the library's loss besides the contract's arguments, as the "
                "library's engine does: the batch's action-token count for the token mean, and its row "
                "count for seq-mean-token-sum-norm (the suite's batch is the whole batch, so the numbers "
                "are the reference's)",
                "batch-token-count: verl FSDPEngine.forward_backward_batch passes batch_num_tokens, and "
                "ray_trainer global_batch_size (the mini-batch's rows), to agg_loss through "
                "config.global_batch_info",
                _choice(*CALL_CONTEXTS),
                _static("PG-2", "PG-6", "VF-1"),
            ),
        )
    }
)
"""Every convention key an adapter may declare."""


@dataclass(frozen=True)
class Inferable:
    """A convention key the suite tries when a value clause fails (``conformance.inference``): the
    ops whose expected values (what :class:`ReferenceVariant` computes) it changes, and the declared
    values tried, those the libraries in ``seen_in`` use."""

    ops: tuple[str, ...]
    values: tuple[object, ...]
    requires: str | None = None
    """A key this one acts only with (it is tried in pairs with that key)."""


INFERABLE: Mapping[str, Inferable] = MappingProxyType(
    {
        "clipfrac": Inferable(("policy_loss",), ("ratio-outside",)),
        "approx_kl": Inferable(("policy_loss",), ("k1", "neg-k1", "k2")),
        "unmasked_statistics": Inferable(
            ("policy_loss",), (("approx_kl",), ("clipfrac",), ("clipfrac", "approx_kl"))
        ),
        "clipfrac_agg": Inferable(("policy_loss",), ("seq-mean-token-mean",)),
        "dual_clip": Inferable(("policy_loss",), (3.0,)),
        "log_ratio_clamp": Inferable(("policy_loss",), (20.0, 10.0)),
        "log_ratio_clamp_statistics": Inferable(("policy_loss",), ("raw",), requires="log_ratio_clamp"),
        "whiten_variance": Inferable(("masked_whiten", "gae"), ("biased",)),
        "whiten_eps_placement": Inferable(
            ("masked_whiten", "gae"), tuple(p for p in EPS_PLACEMENTS if p != "inside-sqrt")
        ),
        "gae_whitening": Inferable(("gae",), ("unbiased", "biased")),
        "value_after_last_action_token": Inferable(("gae", "value_loss"), ("trained",)),
        "kl_clamp": Inferable(("kl_penalty", "token_rewards"), ({"k3": 10.0}, 10.0)),
        "score_placement": Inferable(("token_rewards",), ("after-last-action-token",)),
        "score_clip": Inferable(("token_rewards",), (10.0,)),
        "value_loss_scale": Inferable(("value_loss",), (1.0,)),
        "value_clip_form": Inferable(("value_loss",), ("clipped-only",)),
        "value_loss_agg": Inferable(("value_loss",), ("seq-mean-token-mean",)),
        "group_std_eps": Inferable(("group_advantages",), (1e-4, 1e-8, 1e-9, 0.0)),
        "group_singleton": Inferable(
            ("group_advantages",),
            ("raw-score", "unguarded", {"grpo": "raw-score", "dr_grpo": "raw-score"}, {"rloo": "unguarded"}),
        ),
        "cispo_bounds": Inferable(("cispo_loss",), ("absolute-cap",)),
        "gspo_clipfrac": Inferable(("gspo_loss",), ("tokens",)),
    }
)
"""The keys that change expected values, with the values tried for each (issue 20). The others are
not tried: the narrowing keys (capabilities), those that only widen a tolerance (``compute_dtype``,
``constant_groups``) or change the inputs drawn (``masked_fill``, ``prefix_masks``), which the suite
suggests instead when a failure's shape matches them, and ``whiten_eps`` / ``call_context``."""


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


def _reference(key: str) -> Any:
    """The :class:`ConventionSet` field of ``key``, whose default is ``CONVENTIONS[key].reference``."""
    value = CONVENTIONS[key].reference
    if isinstance(value, Mapping):  # unhashable: a dataclass default needs a factory
        return field(default_factory=lambda: value)
    return field(default=value)


@dataclass(frozen=True)
class ConventionSet:
    """Normalised conventions, every key present (the reference value unless declared).

    Each field's default is the key's ``CONVENTIONS[key].reference``: the reference value of a
    convention is written once, in :data:`CONVENTIONS`.
    """

    clipfrac: str | None = _reference("clipfrac")
    approx_kl: str | None = _reference("approx_kl")
    unmasked_statistics: frozenset[str] = _reference("unmasked_statistics")
    whiten_variance: str = _reference("whiten_variance")
    gae_whitening: str = _reference("gae_whitening")
    gae_bootstrap: str = _reference("gae_bootstrap")
    score_placement: str = _reference("score_placement")
    kl_clamp: Mapping[str, float] = _reference("kl_clamp")
    reward_kl_estimators: frozenset[str] = _reference("reward_kl_estimators")
    dual_clip: float | None = _reference("dual_clip")
    log_ratio_clamp: float | None = _reference("log_ratio_clamp")
    loss_aggregations: frozenset[str] = _reference("loss_aggregations")
    policy_loss_options: frozenset[str] = _reference("policy_loss_options")
    group_methods: frozenset[str] = _reference("group_methods")
    group_std_scopes: frozenset[str] = _reference("group_std_scopes")
    group_std_eps: float | None = _reference("group_std_eps")
    group_singleton: str | Mapping[str, str] = _reference("group_singleton")
    constant_groups: str = _reference("constant_groups")
    cispo_bounds: str = _reference("cispo_bounds")
    gspo_clipfrac: str = _reference("gspo_clipfrac")
    kl_loss_estimators: frozenset[str] = _reference("kl_loss_estimators")
    correction_levels: frozenset[str] = _reference("correction_levels")
    correction_modes: frozenset[str] = _reference("correction_modes")
    correction_bounds: frozenset[str] = _reference("correction_bounds")
    value_loss_scale: float = _reference("value_loss_scale")
    value_clip_form: str = _reference("value_clip_form")
    value_clip_modes: frozenset[str] = _reference("value_clip_modes")
    value_loss_agg: str = _reference("value_loss_agg")
    compute_dtype: str | Mapping[str, str] = _reference("compute_dtype")
    off_mask_outputs: frozenset[str] = _reference("off_mask_outputs")
    whiten_eps: float = _reference("whiten_eps")
    whiten_eps_placement: str = _reference("whiten_eps_placement")
    whiten_modes: frozenset[str] = _reference("whiten_modes")
    score_clip: float | None = _reference("score_clip")
    clipfrac_agg: str = _reference("clipfrac_agg")
    masked_fill: str | float = _reference("masked_fill")
    prefix_masks: frozenset[str] = _reference("prefix_masks")
    edge_inputs: frozenset[str] = _reference("edge_inputs")
    value_after_last_action_token: str = _reference("value_after_last_action_token")
    log_ratio_clamp_statistics: str = _reference("log_ratio_clamp_statistics")
    call_context: str = _reference("call_context")

    @property
    def kl_estimators(self) -> frozenset[str]:
        """The old name of :attr:`reward_kl_estimators` (the KL in the reward, not the KL loss)."""
        return self.reward_kl_estimators

    @property
    def float32_ops(self) -> frozenset[str]:
        """The ops declared computed in float32 (``compute_dtype``)."""
        return float32_ops(self.compute_dtype)

    def deviations(self) -> dict[str, object]:
        """The keys whose value differs from the reference, with their values."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if _plain(getattr(self, f.name)) != _plain(CONVENTIONS[f.name].reference)
        }

    def clauses(self) -> dict[str, list[str]]:
        """Clause id -> ``key=value`` descriptions of the deviations that change its expected values."""
        touched: dict[str, list[str]] = {}
        for key, value in self.deviations().items():
            for clause in CONVENTIONS[key].clauses(value):
                touched.setdefault(clause, []).append(f"{key}={describe(value)}")
        return touched


def _plain(value: object) -> object:
    return dict(value) if isinstance(value, Mapping) else value


def describe(value: object) -> str:
    """A short, stable text for a convention value (for reports)."""
    if isinstance(value, frozenset):
        return "[" + ", ".join(sorted(value)) + "]"
    if isinstance(value, Mapping):
        items = (f"{k}: {v if isinstance(v, str) else format(v, 'g')}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    return repr(value) if isinstance(value, str) else str(value)


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


@dataclass(frozen=True)
class VariantPolicyLoss:
    """What :meth:`ReferenceVariant.policy_loss` returns (``None``: statistic declared not reported)."""

    loss: Tensor
    clipfrac: Tensor | None
    approx_kl: Tensor | None
    ratio_outside_frac: Tensor
    ratio_mean: Tensor
    ratio_max: Tensor
    dual_clip_frac: Tensor


@dataclass(frozen=True)
class VariantGSPOLoss:
    """What :meth:`ReferenceVariant.gspo_loss` returns (``approx_kl`` None: declared not reported)."""

    loss: Tensor
    clipfrac: Tensor
    ratio_mean: Tensor
    ratio_max: Tensor
    approx_kl: Tensor | None


def singleton_rows(group_ids: Tensor) -> Tensor:
    """Bool (B,): the rows whose group (equal ``group_ids``) has a single member (GRP-3)."""
    unique: tuple[Tensor, Tensor, Tensor] = torch.unique(group_ids, return_inverse=True, return_counts=True)
    _, inverse, counts = unique
    alone: Tensor = counts[inverse] == 1
    return alone


def _bool_mask(mask: Tensor) -> Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def with_value_slot(mask: Tensor) -> Tensor:
    """Bool (B, T): ``mask`` plus the slot after each row's last action token, where it exists
    (``value_after_last_action_token='trained'``; a row without action tokens gets none).

    >>> with_value_slot(torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])).int().tolist()
    [[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    """
    keep = _bool_mask(mask).clone()
    last = last_action_index(keep)
    rows = torch.nonzero((last >= 0) & (last + 1 < keep.shape[1])).squeeze(-1)
    keep[rows, last[rows] + 1] = True
    return keep


class ReferenceVariant:
    """The reference functions with a :class:`ConventionSet` applied; same op signatures as an adapter.

    With the reference conventions every op is the plain :mod:`ppo_ref` call.
    """

    def __init__(self, conventions: ConventionSet | None = None) -> None:
        self.conventions = conventions or ConventionSet()

    def __repr__(self) -> str:
        return f"ReferenceVariant({self.conventions.deviations()})"

    token_logprobs = staticmethod(ppo_ref.token_logprobs)
    entropy = staticmethod(ppo_ref.entropy)
    masked_mean = staticmethod(ppo_ref.masked_mean)
    ppo_penalty_loss = staticmethod(ppo_ref.ppo_penalty_loss)

    def masked_whiten(self, x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
        """MASK-3; ``whiten_variance='biased'`` is ``ppo_ref.masked_whiten(unbiased=False)``,
        ``whiten_eps`` and ``whiten_eps_placement`` its ``eps`` and ``eps_placement``."""
        return self._whiten(x, mask, shift_mean, self.conventions.whiten_variance)

    def _whiten(self, x: Tensor, mask: Tensor, shift_mean: bool, variance: str) -> Tensor:
        c = self.conventions
        return ppo_ref.masked_whiten(
            x,
            mask,
            shift_mean=shift_mean,
            unbiased=variance == "unbiased",
            eps=c.whiten_eps,
            eps_placement=c.whiten_eps_placement,
        )

    def kl_penalty(
        self, logp: Tensor, ref_logp: Tensor, estimator: str = "k1", mask: Tensor | None = None
    ) -> Tensor:
        """KL-1..3; ``kl_clamp`` clamps the estimate to [-c, c]."""
        kl = ppo_ref.kl_penalty(logp, ref_logp, estimator, mask=mask)
        bound = self.conventions.kl_clamp.get(estimator)
        return kl if bound is None else kl.clamp(-bound, bound)

    def token_rewards(
        self,
        scores: Tensor,
        logp: Tensor,
        ref_logp: Tensor,
        mask: Tensor,
        kl_coef: float,
        estimator: str = "k1",
    ) -> Tensor:
        """RWD-1..3; ``kl_clamp`` clamps the KL term, ``score_placement`` moves the score,
        ``score_clip`` clamps the score to [-c, c] before it is added.

        Both are ``ppo_ref.token_rewards``: a clamped estimate is handed to it as a k1 log-ratio
        against 0 (k1 of (kl, 0) is kl itself), and an ``after-last-action-token`` score is added
        one column after the row's last action token to the rewards of a zero score."""
        c = self.conventions
        if c.score_clip is not None:
            scores = scores.clamp(-c.score_clip, c.score_clip)
        if estimator in c.kl_clamp:
            logp = self.kl_penalty(logp, ref_logp, estimator, mask=mask)
            ref_logp, estimator = torch.zeros_like(logp), "k1"
        if c.score_placement == "last-action-token":
            return ppo_ref.token_rewards(scores, logp, ref_logp, mask, kl_coef, estimator)
        rewards = ppo_ref.token_rewards(torch.zeros_like(scores), logp, ref_logp, mask, kl_coef, estimator)
        keep = _bool_mask(mask)
        last = last_action_index(keep)
        target = torch.where(last + 1 < keep.shape[1], last + 1, last)
        rows = torch.nonzero(last >= 0).squeeze(-1)
        return rewards.index_put((rows, target[rows]), scores.to(rewards.dtype)[rows], accumulate=True)

    def gae(
        self,
        rewards: Tensor,
        values: Tensor,
        mask: Tensor,
        gamma: float,
        lam: float,
        last_values: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """GAE-1..4; ``gae_whitening`` whitens the advantages (returns stay raw + values);
        ``value_after_last_action_token='trained'`` runs the reference recursion over the mask plus
        the slot after the last action token, then zeroes the advantage there (its return stays)."""
        trained = self.conventions.value_after_last_action_token == "trained"
        steps = with_value_slot(mask) if trained else mask
        advantages, returns = ppo_ref.gae(rewards, values, steps, gamma, lam, last_values=last_values)
        if trained:
            advantages = torch.where(_bool_mask(mask), advantages, torch.zeros((), dtype=advantages.dtype))
        if self.conventions.gae_whitening != "none":
            advantages = self._whiten(advantages, mask, True, self.conventions.gae_whitening)
        return advantages, returns

    def policy_loss(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        clip_eps: float,
        loss_agg: str = "token-mean",
        **options: Any,
    ) -> VariantPolicyLoss:
        """PG-1..6 with ``log_ratio_clamp``, ``dual_clip``, ``clipfrac``, ``approx_kl`` and
        ``unmasked_statistics`` applied; ``options`` are the keywords of ``ppo_ref.policy_loss``
        (``clip_eps_high``, ``dual_clip``, ``norm_constant``, ``token_count``, ``row_count``;
        CLIP-1..3, AGG-1..3), passed through (a declared always-on ``dual_clip`` is the default
        of the keyword)."""
        c = self.conventions
        keep = _bool_mask(mask)
        raw_logp = logp
        if c.log_ratio_clamp is not None:  # same graph in logp, clamped: old + clamp(logp - old)
            log_ratio = torch.where(keep, logp - old_logp, torch.zeros((), dtype=logp.dtype))
            logp = old_logp + log_ratio.clamp(-c.log_ratio_clamp, c.log_ratio_clamp)
        options = {k: v for k, v in options.items() if v is not None}
        options.setdefault("dual_clip", c.dual_clip)
        result = ppo_ref.policy_loss(logp, old_logp, advantages, keep, clip_eps, loss_agg=loss_agg, **options)
        loss = result.loss
        clipfrac = {"flat-branch": result.clipfrac, "ratio-outside": result.ratio_outside_frac}.get(
            str(c.clipfrac)
        )
        if clipfrac is not None and c.clipfrac_agg == "seq-mean-token-mean":
            clipfrac = self._clipfrac_per_sequence(logp, old_logp, advantages, keep, clip_eps, options)
        approx_kl = None
        raw = c.log_ratio_clamp is not None and c.log_ratio_clamp_statistics == "raw"
        if c.approx_kl == "k3" and not raw:
            approx_kl = result.approx_kl
        elif c.approx_kl is not None:
            if raw:  # the statistic reads the unclamped log-ratio (log_ratio_clamp_statistics)
                logp = torch.where(keep, raw_logp, old_logp)
            approx_kl = self._approx_kl(logp, old_logp, keep)
        dilution = keep.sum() / max(keep.numel(), 1)
        if clipfrac is not None and "clipfrac" in c.unmasked_statistics:
            clipfrac = clipfrac * dilution
        if approx_kl is not None and "approx_kl" in c.unmasked_statistics:
            approx_kl = approx_kl * dilution
        return VariantPolicyLoss(
            loss,
            clipfrac,
            approx_kl,
            result.ratio_outside_frac,
            result.ratio_mean,
            result.ratio_max,
            result.dual_clip_frac,
        )

    def _clipfrac_per_sequence(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        keep: Tensor,
        clip_eps: float,
        options: Mapping[str, Any],
    ) -> Tensor:
        """``clipfrac_agg='seq-mean-token-mean'``: the reference's clip fraction of each row with an
        action token (``ppo_ref.policy_loss`` on that row alone), averaged over those rows; 0 when
        no row has one."""
        bounds = {k: v for k, v in options.items() if k in ("clip_eps_high", "dual_clip")}
        fractions = []
        for row in range(keep.shape[0]):
            if not bool(keep[row].any()):
                continue
            one = slice(row, row + 1)
            result = ppo_ref.policy_loss(
                logp[one].detach(), old_logp[one], advantages[one], keep[one], clip_eps, **bounds
            )
            flat = self.conventions.clipfrac == "flat-branch"
            fractions.append(result.clipfrac if flat else result.ratio_outside_frac)
        if not fractions:
            return torch.zeros((), dtype=logp.dtype)
        return torch.stack(fractions).mean()

    def value_loss(
        self,
        values: Tensor,
        old_values: Tensor,
        returns: Tensor,
        mask: Tensor,
        clip_eps: float | None = None,
        loss_agg: str | None = None,
        **counts: Any,
    ) -> Tensor:
        """VF-1, VF-2 with ``value_loss_scale``, ``value_clip_form`` and ``value_loss_agg`` applied;
        ``loss_agg`` (None: the declared ``value_loss_agg``) and ``counts`` (``norm_constant``,
        ``token_count``, ``row_count``) as in ``ppo_ref.value_loss`` (AGG-1..3);
        ``value_after_last_action_token='trained'`` adds the slot after each row's last action
        token to the mask."""
        c = self.conventions
        counts = {k: v for k, v in counts.items() if v is not None}
        agg = c.value_loss_agg if loss_agg is None else loss_agg
        if c.value_after_last_action_token == "trained":
            mask = with_value_slot(mask)
        loss = ppo_ref.value_loss(
            values, old_values, returns, mask, clip_eps, agg, clip_form=c.value_clip_form, **counts
        )
        return loss if c.value_loss_scale == 0.5 else loss * (c.value_loss_scale / 0.5)

    # --- the PPO family (GRP, AGG, GSPO, CISPO, KLL, IS) ---

    aggregate_loss = staticmethod(ppo_ref.aggregate_loss)
    kl_loss = staticmethod(ppo_ref.kl_loss)

    def _approx_kl(self, logp: Tensor, old_logp: Tensor, keep: Tensor) -> Tensor:
        """The declared ``approx_kl`` estimate (not k3's default): k1 mean(old - new), neg-k1
        mean(new - old), k2 0.5 mean((new - old)^2), over the action tokens."""
        estimate = self.conventions.approx_kl
        # kl_penalty(a, b, k) estimates from b - a: k1 old - new, neg-k1 new - old
        first, second = (logp, old_logp) if estimate in ("k2", "neg-k1") else (old_logp, logp)
        estimator = "k1" if estimate == "neg-k1" else str(estimate)
        per_token = ppo_ref.kl_penalty(first.detach(), second.detach(), estimator, mask=keep)
        return ppo_ref.masked_mean(per_token, keep)

    def gspo_loss(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip_eps: float, **kwargs: Any
    ) -> VariantGSPOLoss:
        """GSPO-1..3 with ``gspo_clipfrac='tokens'`` (the clip fraction weights each clipped sequence
        by its action tokens: per row, the reference's 0/1 clip fraction of that row alone) and the
        declared ``approx_kl`` estimate (GSPO-3's approx_kl is PG-5's; None: not reported)."""
        reference = ppo_ref.gspo_loss(logp, old_logp, advantages, mask, clip_eps, **kwargs)
        c = self.conventions
        approx_kl: Tensor | None = reference.approx_kl
        if c.approx_kl != "k3":
            approx_kl = None if c.approx_kl is None else self._approx_kl(logp, old_logp, mask != 0)
        result = VariantGSPOLoss(
            reference.loss, reference.clipfrac, reference.ratio_mean, reference.ratio_max, approx_kl
        )
        if c.gspo_clipfrac == "sequences":
            return result
        bounds = {k: v for k, v in kwargs.items() if k == "clip_eps_high"}
        tokens = (mask != 0).sum(dim=1)
        clipped = torch.zeros((), dtype=result.clipfrac.dtype)
        for row in range(mask.shape[0]):
            if int(tokens[row]) > 0:
                one = slice(row, row + 1)
                alone = ppo_ref.gspo_loss(
                    logp[one].detach(), old_logp[one], advantages[one], mask[one], clip_eps, **bounds
                )
                clipped = clipped + alone.clipfrac * tokens[row]
        return replace(result, clipfrac=clipped / tokens.sum().clamp(min=1))

    rollout_correction = staticmethod(ppo_ref.rollout_correction)

    def group_advantages(
        self,
        scores: Tensor,
        group_ids: Tensor,
        method: str = "grpo",
        *,
        std_scope: str = "group",
        eps: float = 1e-6,
        singleton: str = "zero",
    ) -> Tensor:
        """GRP-1..4 with ``group_std_eps`` (a fixed epsilon replaces ``eps``) and ``group_singleton``
        (per method: a group of one has its mean read as 0 and its std as 1, or NaN from 0/0 where
        the formula divides by n - 1). ``constant_groups`` changes no value (a constant group still
        gets exactly 0 here); it widens the suite's check of such groups to the rounding bound."""
        c = self.conventions
        epsilon = eps if c.group_std_eps is None else c.group_std_eps
        advantages = ppo_ref.group_advantages(
            scores, group_ids, method, std_scope=std_scope, eps=epsilon, singleton=singleton
        )
        rule = singleton_rule(c.group_singleton, method)
        if rule == "zero" or singleton != "zero":
            return advantages
        alone = singleton_rows(group_ids)
        raw = scores.to(advantages.dtype)
        if rule == "unguarded":
            if method != "rloo" and (method, std_scope) != ("grpo", "group"):
                return advantages  # no division by n - 1 there: r - mean of one is 0
            value = torch.full_like(raw, math.nan)
        elif method == "grpo" and std_scope == "group":
            value = raw / (1.0 + epsilon)
        elif method == "grpo" and std_scope == "batch":
            spread = raw.std() if raw.numel() > 1 else torch.zeros((), dtype=raw.dtype)
            value = raw / (spread + epsilon)  # (r - 0) / (the batch's std + eps)
        else:
            value = raw
        return torch.where(alone, value, advantages)

    def cispo_loss(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        clip_low: float,
        clip_high: float,
        loss_agg: str = "token-mean",
        **counts: Any,
    ) -> Any:
        """CISPO-1, CISPO-2; ``cispo_bounds='absolute-cap'`` reads ``clip_high`` as the cap itself
        (the reference offsets clip_low = 1, clip_high - 1: no lower bound, cap at clip_high)."""
        if self.conventions.cispo_bounds == "absolute-cap":
            clip_low, clip_high = 1.0, clip_high - 1.0
        return ppo_ref.cispo_loss(logp, old_logp, advantages, mask, clip_low, clip_high, loss_agg, **counts)
