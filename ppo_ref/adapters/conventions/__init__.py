"""Declared conventions: the documented deviations an adapter may declare.

Real PPO implementations (TRL, verl, OpenRLHF, torchrl, stable-baselines3, skyrl-train, ...) differ
in defensible ways: the clip-fraction definition, biased whitening, a dual clip, the value-loss scale,
the approx-KL estimator, whitening inside GAE, ... Each entry's ``seen_in`` names the libraries and
functions that do it; ``docs/conformance-matrix.md`` shows which convention each third-party adapter
declares, and ``docs/findings.md`` the disagreements that are not conventions. An adapter declares
such choices in its ``conventions`` mapping, with keys and values from :data:`CONVENTIONS`; the
suite then compares the adapter with ``conformance.variant.ReferenceVariant``, the reference
functions with those conventions applied, instead of the plain reference. Anything not declared
must match the reference: an undeclared deviation fails. An unknown key or an invalid value is
itself a failure (:func:`convention_problems`).

Some keys narrow what is checked instead of changing a formula (``kl_estimators``,
``loss_aggregations``, ``policy_loss_options``, ``value_clip_modes``, ``gae_bootstrap="none"``,
``clipfrac=None``, ``approx_kl=None``, and for the PPO-family ops ``group_methods``,
``group_std_scopes``, ``kl_loss_estimators``, ``correction_levels``, ``correction_modes``): the
checks that need the missing capability are skipped as "not provided". Features added to an
existing op after third-party adapters were written (the ``seq-mean-token-sum-norm`` mode, the
``clip_eps_high``, ``dual_clip`` and count keywords) are such capabilities, so an adapter that
predates them declares their absence and keeps its verdicts.

Each key's reference value is written once, in :data:`CONVENTIONS`; the defaults of
:class:`ConventionSet` read it. The package's modules, each with one job:

- :mod:`.choices`: the values a key may take where they are not a vocabulary of the math;
- :mod:`.parsing`: the value parsers, one declared value to its normalised form;
- :mod:`.clauses`: the clause maps, which clauses a declared value touches;
- :mod:`.catalogue`: :data:`CONVENTIONS`, every key as data;
- :mod:`.inferable`: :data:`INFERABLE`, the values the suite tries when a value clause fails;
- :mod:`.convention_set`: :class:`ConventionSet`, a declaration normalised;
- :mod:`.validation`: :func:`convention_problems`, :func:`parse_conventions`, :func:`declaration`;
- :mod:`.semantics`: what declared values mean on tensors (groups of one, the value slot, the
  variant's result types), shared by the suite's expected side and its checks.

The expected side itself, ``ReferenceVariant``, is the suite's (``conformance/variant.py``): the
math and the adapters never import the suite.
"""

from ppo_ref.adapters.conventions.catalogue import CONVENTIONS, Convention
from ppo_ref.adapters.conventions.choices import (
    CALL_CONTEXTS,
    CISPO_BOUNDS,
    COMPUTE_DTYPES,
    CONSTANT_GROUPS,
    CORRECTION_BOUNDS,
    EDGE_INPUTS,
    GROUP_SINGLETONS,
    GSPO_CLIPFRACS,
    MASKED_FILLS,
    MASKED_OUTPUT_OPS,
    POLICY_LOSS_OPTIONS,
    POLICY_STATISTICS,
    VALUE_CLIP_MODES,
    WHITEN_MODES,
)
from ppo_ref.adapters.conventions.clauses import OP_CLAUSES
from ppo_ref.adapters.conventions.convention_set import ConventionSet, describe
from ppo_ref.adapters.conventions.inferable import INFERABLE, Inferable
from ppo_ref.adapters.conventions.parsing import float32_ops
from ppo_ref.adapters.conventions.semantics import (
    VariantGSPOLoss,
    VariantPolicyLoss,
    constant_group_bound,
    singleton_rows,
    singleton_rule,
    with_value_slot,
)
from ppo_ref.adapters.conventions.validation import (
    CONVENTION_ALIASES,
    ConventionError,
    convention_problems,
    declaration,
    parse_conventions,
)
from ppo_ref.aggregation import LOSS_AGGREGATIONS
from ppo_ref.correction import CORRECTION_LEVELS, CORRECTION_MODES
from ppo_ref.group import GROUP_METHODS
from ppo_ref.group import STD_SCOPES as GROUP_STD_SCOPES
from ppo_ref.kl import KL_ESTIMATORS
from ppo_ref.kl_loss import KL_LOSS_ESTIMATORS

__all__ = [
    "CALL_CONTEXTS",
    "CISPO_BOUNDS",
    "COMPUTE_DTYPES",
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
    "MASKED_FILLS",
    "MASKED_OUTPUT_OPS",
    "OP_CLAUSES",
    "POLICY_LOSS_OPTIONS",
    "POLICY_STATISTICS",
    "VALUE_CLIP_MODES",
    "WHITEN_MODES",
    "Convention",
    "ConventionError",
    "ConventionSet",
    "Inferable",
    "VariantGSPOLoss",
    "VariantPolicyLoss",
    "constant_group_bound",
    "convention_problems",
    "declaration",
    "describe",
    "float32_ops",
    "parse_conventions",
    "singleton_rows",
    "singleton_rule",
    "with_value_slot",
]
