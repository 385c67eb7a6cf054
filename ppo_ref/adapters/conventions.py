"""Declared conventions: the documented deviations an adapter may declare, and the reference
variants the conformance suite checks a declared convention against.

Real PPO implementations differ in defensible ways (``shared/research/third-party-ppo.md``): the
clip-fraction definition, biased whitening, a dual clip, the value-loss scale, the approx-KL
estimator, whitening inside GAE, ... An adapter declares such choices in its ``conventions``
mapping, with keys and values from :data:`CONVENTIONS`; the suite then compares the adapter with
:class:`ReferenceVariant`, the reference functions with those conventions applied, instead of the
plain reference. Anything not declared must match the reference: an undeclared deviation fails.
An unknown key or an invalid value is itself a failure (:func:`convention_problems`).

Some keys narrow what is checked instead of changing a formula (``kl_estimators``,
``loss_aggregations``, ``value_clip_modes``, ``gae_bootstrap="none"``, ``clipfrac=None``,
``approx_kl=None``): the checks that need the missing capability are skipped as "not provided".

Every variant is built from the :mod:`ppo_ref` functions; with no convention declared, each op of
the variant *is* the reference call.
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
from ppo_ref.kl import last_action_index
from ppo_ref.masked import WHITEN_EPS

__all__ = [
    "CONVENTIONS",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "Convention",
    "ConventionError",
    "ConventionSet",
    "ReferenceVariant",
    "VariantPolicyLoss",
    "convention_problems",
    "parse_conventions",
]

KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")
LOSS_AGGREGATIONS: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
POLICY_STATISTICS: tuple[str, ...] = ("clipfrac", "approx_kl")
VALUE_CLIP_MODES: tuple[str, ...] = ("clipped", "unclipped")


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


_ALL_KL = frozenset(KL_ESTIMATORS)

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
                "'k3', 'k1', 'k2' or None (not reported)",
                "the approx_kl statistic: k3 mean((r-1) - log r), k1 mean(old_logp - logp), "
                "k2 0.5*mean((logp - old_logp)^2)",
                "k1: verl ppo_kl, OpenRLHF ppo_kl, torchrl kl_approx; k2: TRL approxkl",
                _choice("k3", "k1", "k2", None),
                _static("PG-5"),
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
                "kl_estimators",
                _ALL_KL,
                "a non-empty collection of 'k1', 'k2', 'k3'",
                "the estimators kl_penalty and token_rewards accept; the others are not provided",
                "TRL (k1, k3)",
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
                "a non-empty collection of 'token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum'",
                "the loss_agg modes policy_loss accepts; the others are not provided",
                "OpenRLHF PolicyLoss (token-level only)",
                _subset(LOSS_AGGREGATIONS, allow_empty=False),
                _static("PG-2"),
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
        )
    }
)
"""Every convention key an adapter may declare."""


@dataclass(frozen=True)
class ConventionSet:
    """Normalised conventions, every key present (the reference value unless declared)."""

    clipfrac: str | None = "flat-branch"
    approx_kl: str | None = "k3"
    unmasked_statistics: frozenset[str] = frozenset()
    whiten_variance: str = "unbiased"
    gae_whitening: str = "none"
    gae_bootstrap: str = "last-values"
    score_placement: str = "last-action-token"
    kl_clamp: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    kl_estimators: frozenset[str] = _ALL_KL
    dual_clip: float | None = None
    log_ratio_clamp: float | None = None
    loss_aggregations: frozenset[str] = frozenset(LOSS_AGGREGATIONS)
    value_loss_scale: float = 0.5
    value_clip_form: str = "max"
    value_clip_modes: frozenset[str] = frozenset(VALUE_CLIP_MODES)
    value_loss_agg: str = "token-mean"

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
        return "{" + ", ".join(f"{k}: {v:g}" for k, v in value.items()) + "}"
    return repr(value) if isinstance(value, str) else str(value)


def convention_problems(declared: object) -> list[str]:
    """Every problem with a declared ``conventions`` mapping (unknown keys, invalid values)."""
    if not isinstance(declared, Mapping):
        return [f"conventions: expected a Mapping[str, object], got {declared!r}"]
    problems = []
    for key, value in declared.items():
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
    parsed: dict[str, Any] = {key: CONVENTIONS[key].parse(value) for key, value in declared.items()}
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


def _bool_mask(mask: Tensor) -> Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


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
        """MASK-3; ``whiten_variance='biased'`` uses ``ppo_ref.masked_var(unbiased=False)``."""
        return self._whiten(x, mask, shift_mean, self.conventions.whiten_variance)

    @staticmethod
    def _whiten(x: Tensor, mask: Tensor, shift_mean: bool, variance: str) -> Tensor:
        if variance == "unbiased":
            return ppo_ref.masked_whiten(x, mask, shift_mean=shift_mean)
        keep = _bool_mask(mask)
        x = torch.where(keep, x, torch.zeros((), dtype=x.dtype))  # no NaN from padding in a gradient
        mean = ppo_ref.masked_mean(x, keep)
        var = ppo_ref.masked_var(x, keep, unbiased=False)
        whitened = (x - mean) * torch.rsqrt(var + WHITEN_EPS)
        if not shift_mean:
            whitened = whitened + mean
        return torch.where(keep, whitened, torch.zeros((), dtype=whitened.dtype))

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
        """RWD-1..3; ``kl_clamp`` clamps the KL term, ``score_placement`` moves the score."""
        c = self.conventions
        if estimator not in c.kl_clamp and c.score_placement == "last-action-token":
            return ppo_ref.token_rewards(scores, logp, ref_logp, mask, kl_coef, estimator)
        keep = _bool_mask(mask)
        kl = self.kl_penalty(logp, ref_logp, estimator, mask=keep)
        dtype = torch.promote_types(kl.dtype, scores.dtype)
        rewards = torch.where(keep, -kl_coef * kl.to(dtype), torch.zeros((), dtype=dtype))
        last = last_action_index(keep)
        target = last
        if c.score_placement == "after-last-action-token":
            target = torch.where(last + 1 < keep.shape[1], last + 1, last)
        rows = torch.nonzero(last >= 0).squeeze(-1)
        return rewards.index_put((rows, target[rows]), scores.to(dtype)[rows], accumulate=True)

    def gae(
        self,
        rewards: Tensor,
        values: Tensor,
        mask: Tensor,
        gamma: float,
        lam: float,
        last_values: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """GAE-1..4; ``gae_whitening`` whitens the advantages (returns stay raw + values)."""
        advantages, returns = ppo_ref.gae(rewards, values, mask, gamma, lam, last_values=last_values)
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
    ) -> VariantPolicyLoss:
        """PG-1..6 with ``log_ratio_clamp``, ``dual_clip``, ``clipfrac``, ``approx_kl`` and
        ``unmasked_statistics`` applied."""
        c = self.conventions
        keep = _bool_mask(mask)
        if c.log_ratio_clamp is not None:  # same graph in logp, clamped: old + clamp(logp - old)
            log_ratio = torch.where(keep, logp - old_logp, torch.zeros((), dtype=logp.dtype))
            logp = old_logp + log_ratio.clamp(-c.log_ratio_clamp, c.log_ratio_clamp)
        result = ppo_ref.policy_loss(logp, old_logp, advantages, keep, clip_eps, loss_agg=loss_agg)
        loss = result.loss
        if c.dual_clip is not None:
            loss = -ppo_ref.aggregate_loss(
                _dual_clip_objective(logp, old_logp, advantages, keep, clip_eps, c.dual_clip), keep, loss_agg
            )
        clipfrac = {"flat-branch": result.clipfrac, "ratio-outside": result.ratio_outside_frac}.get(
            str(c.clipfrac)
        )
        approx_kl = None
        if c.approx_kl == "k3":
            approx_kl = result.approx_kl
        elif c.approx_kl is not None:  # k1: mean(old - new); k2: 0.5 mean((new - old)^2)
            first, second = (old_logp, logp) if c.approx_kl == "k1" else (logp, old_logp)
            per_token = ppo_ref.kl_penalty(first.detach(), second.detach(), c.approx_kl, mask=keep)
            approx_kl = ppo_ref.masked_mean(per_token, keep)
        dilution = keep.sum() / max(keep.numel(), 1)
        if clipfrac is not None and "clipfrac" in c.unmasked_statistics:
            clipfrac = clipfrac * dilution
        if approx_kl is not None and "approx_kl" in c.unmasked_statistics:
            approx_kl = approx_kl * dilution
        return VariantPolicyLoss(
            loss, clipfrac, approx_kl, result.ratio_outside_frac, result.ratio_mean, result.ratio_max
        )

    def value_loss(
        self,
        values: Tensor,
        old_values: Tensor,
        returns: Tensor,
        mask: Tensor,
        clip_eps: float | None = None,
    ) -> Tensor:
        """VF-1, VF-2 with ``value_loss_scale``, ``value_clip_form`` and ``value_loss_agg`` applied."""
        c = self.conventions
        if (c.value_loss_scale, c.value_clip_form, c.value_loss_agg) == (0.5, "max", "token-mean"):
            return ppo_ref.value_loss(values, old_values, returns, mask, clip_eps=clip_eps)
        keep = _bool_mask(mask)
        dtype = torch.promote_types(torch.promote_types(values.dtype, old_values.dtype), returns.dtype)
        zero = torch.zeros((), dtype=torch.promote_types(dtype, torch.float32))
        v, v_old, target = (torch.where(keep, t.to(zero.dtype), zero) for t in (values, old_values, returns))
        per_token = (v - target) ** 2
        if clip_eps is not None:
            clipped = (v_old + torch.clamp(v - v_old, -clip_eps, clip_eps) - target) ** 2
            per_token = clipped if c.value_clip_form == "clipped-only" else torch.maximum(per_token, clipped)
        return c.value_loss_scale * ppo_ref.aggregate_loss(per_token, keep, c.value_loss_agg)


def _dual_clip_objective(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, keep: Tensor, eps: float, dual: float
) -> Tensor:
    """Per-token max(min(rA, clip(r)A), cA) for A < 0, min(rA, clip(r)A) otherwise; 0 off the mask."""
    zero = torch.zeros((), dtype=torch.promote_types(logp.dtype, old_logp.dtype))
    log_ratio = torch.where(keep, logp, zero) - torch.where(keep, old_logp, zero)
    adv = torch.where(keep, advantages.to(log_ratio.dtype), zero)
    ratio = torch.exp(log_ratio)
    objective = torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * adv)
    return torch.where(adv < 0, torch.maximum(objective, dual * adv), objective)
