"""Hypothesis strategies for ppo-ref: the one helper module that draws PPO inputs.

Used by ppo-ref's own property tests (``tests/``) and by the conformance suite (``conformance/``).
Everything is drawn on the CPU and depends only on torch and Hypothesis, so the module also works in
the separate environments of third-party libraries.

Conventions (spec ``SPEC.md``): B rows, T response positions, L full sequence length, V vocabulary;
a ``mask`` is (B, T), bool or 0/1, 1 marking an action token. Masks drawn here have right padding,
holes (tool or observation tokens inside a response), single-token rows and rows of unequal length,
and optionally empty rows.

Composite strategies return small frozen dataclass *bundles* (:class:`PolicyBatch`,
:class:`GAEBatch`, ...). Their ``repr`` is Python code that rebuilds them exactly (tensor values as
``torch.tensor(..., dtype=...)``), so a Hypothesis failure can be pasted into a shell after
``import torch`` and ``from conformance.strategies import *``.

Helpers for invariance tests: :func:`fill_masked` (write arbitrary values, NaN and inf included,
into the masked-out slots), :func:`append_padding` (add trailing columns) and :func:`insert_holes`
(insert columns inside the rows).

Input conventions (issues 11 and 20): :func:`declared_inputs` sets, for the draws inside it, what
the masked-out slots hold (``masked_fill``: ``"any"``, the default outside the suite, draws NaN,
+-inf and arbitrary floats there half of the time; ``"finite"`` leaves finite values of the same
kind as the action tokens'; ``"zero"`` or a number fills them) and which *edge inputs* are drawn:
masks with holes (``holes``), rows without an action token and batches without any
(``empty_rows``), ``-inf`` logits (``inf_logits``). Outside a ``declared_inputs`` block every edge
input is drawn (ppo-ref's own property tests). The conformance suite enters it around every test
with the adapter's declared ``masked_fill`` and ``edge_inputs`` (value clauses: what the library's
own pipeline produces) or with the edge input forced on (the edge clauses); ``junk=True`` (the
robustness clauses) writes junk whatever is declared.

The package is split by job, one module each (every name above is importable from the package):

- :mod:`.inputs`: the shared constants, :func:`declared_inputs` and the Hypothesis profiles;
- :mod:`.reprs`: reprs that are code (:func:`tensor_code` and the bundles' base);
- :mod:`.primitives`: scalars, tensors, masks, junk and the invariance helpers;
- :mod:`.bundles`: the core bundles and their strategies;
- :mod:`.family`: the PPO family's bundles and their strategies (issue 10).
"""

from __future__ import annotations

from ppo_ref.aggregation import COUNT_AGGREGATIONS, LOSS_AGGREGATIONS
from ppo_ref.correction import CORRECTION_LEVELS, CORRECTION_MODES
from ppo_ref.group import GROUP_METHODS, STD_SCOPES
from ppo_ref.kl import KL_ESTIMATORS
from ppo_ref.kl_loss import KL_LOSS_ESTIMATORS

from .bundles import (
    EVBatch,
    GAEBatch,
    KLBatch,
    KLControllerCase,
    LogitsBatch,
    MaskedBatch,
    PenaltyBatch,
    PolicyBatch,
    RewardBatch,
    ValueBatch,
    ev_batches,
    gae_batches,
    kl_batches,
    kl_controller_cases,
    logits_batches,
    masked_batches,
    penalty_batches,
    policy_batches,
    reward_batches,
    value_batches,
)
from .family import (
    GROUP_ID_POOL,
    AggregationBatch,
    CISPOBatch,
    ClipBatch,
    CorrectionBatch,
    GroupBatch,
    GSPOBatch,
    KLLossBatch,
    aggregation_batches,
    cispo_batches,
    clip_batches,
    clip_eps_highs,
    correction_batches,
    dual_clips,
    group_batches,
    gspo_batches,
    kl_loss_batches,
    micro_batches,
    norm_constants,
    whole_batch_counts,
)
from .inputs import FLOAT_DTYPES, HALF_DTYPES, JUNK_VALUES, MASK_DTYPES, declared_inputs, register_profiles
from .inputs import LOG_RATIO_MAX as LOG_RATIO_MAX  # public, not in __all__ (as before the split)
from .inputs import LOGP_MIN as LOGP_MIN
from .inputs import MAX_ROWS as MAX_ROWS
from .inputs import MAX_STEPS as MAX_STEPS
from .primitives import (
    append_padding,
    batch_shapes,
    clip_eps,
    fill_masked,
    float_dtypes,
    float_tensors,
    gammas,
    hole_positions,
    insert_holes,
    junk_floats,
    junk_tensors,
    kl_coefs,
    kl_estimators,
    lams,
    loss_aggregations,
    masked_fills,
    masks,
    temperatures,
    token_ids,
    value_clips,
)
from .reprs import tensor_code

__all__ = [
    "CORRECTION_LEVELS",
    "CORRECTION_MODES",
    "COUNT_AGGREGATIONS",
    "FLOAT_DTYPES",
    "GROUP_ID_POOL",
    "GROUP_METHODS",
    "HALF_DTYPES",
    "JUNK_VALUES",
    "KL_ESTIMATORS",
    "KL_LOSS_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "MASK_DTYPES",
    "STD_SCOPES",
    "AggregationBatch",
    "CISPOBatch",
    "ClipBatch",
    "CorrectionBatch",
    "EVBatch",
    "GAEBatch",
    "GSPOBatch",
    "GroupBatch",
    "KLBatch",
    "KLControllerCase",
    "KLLossBatch",
    "LogitsBatch",
    "MaskedBatch",
    "PenaltyBatch",
    "PolicyBatch",
    "RewardBatch",
    "ValueBatch",
    "aggregation_batches",
    "append_padding",
    "batch_shapes",
    "cispo_batches",
    "clip_batches",
    "clip_eps",
    "clip_eps_highs",
    "correction_batches",
    "declared_inputs",
    "dual_clips",
    "ev_batches",
    "fill_masked",
    "float_dtypes",
    "float_tensors",
    "gae_batches",
    "gammas",
    "group_batches",
    "gspo_batches",
    "hole_positions",
    "insert_holes",
    "junk_floats",
    "junk_tensors",
    "kl_batches",
    "kl_coefs",
    "kl_controller_cases",
    "kl_estimators",
    "kl_loss_batches",
    "lams",
    "logits_batches",
    "loss_aggregations",
    "masked_batches",
    "masked_fills",
    "masks",
    "micro_batches",
    "norm_constants",
    "penalty_batches",
    "policy_batches",
    "register_profiles",
    "reward_batches",
    "temperatures",
    "tensor_code",
    "token_ids",
    "value_batches",
    "value_clips",
    "whole_batch_counts",
]
