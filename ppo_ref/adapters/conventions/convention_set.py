"""The :class:`ConventionSet`: an adapter's declared conventions, normalised, every key present.

One field per catalogue key (:data:`~.catalogue.CONVENTIONS`), flat and named as the key an adapter
declares, so ``parse_conventions(declared)`` is ``replace(ConventionSet(), **parsed)``; each field's
default is the key's reference value. The set says which keys deviate from the reference and which
clauses those deviations touch (for the report), with :func:`describe` writing each value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ppo_ref.adapters.conventions.catalogue import CONVENTIONS
from ppo_ref.adapters.conventions.parsing import float32_ops

__all__ = ["ConventionSet", "describe"]


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
