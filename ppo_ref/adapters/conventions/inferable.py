"""The inference candidates: the convention values the suite tries when a value clause fails.

When a value clause of an adapter fails, ``conformance.inference`` re-runs it against the expected
values of each value in :data:`INFERABLE` (what the libraries in the key's ``seen_in`` use, see
:mod:`.catalogue`) and reports the one that matches as an undeclared convention, with the line to
paste (:func:`~.validation.declaration`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ppo_ref.masked import EPS_PLACEMENTS

__all__ = ["INFERABLE", "Inferable"]


@dataclass(frozen=True)
class Inferable:
    """A convention key the suite tries when a value clause fails (``conformance.inference``): the
    ops whose expected values (what ``conformance.variant.ReferenceVariant`` computes) it changes,
    and the declared values tried, those the libraries in ``seen_in`` use."""

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
