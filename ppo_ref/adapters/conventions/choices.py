"""The values a convention key may take, where they are not a vocabulary of the math.

Each tuple here lists the names one key's value may be made of (``policy_loss_options``,
``group_singleton``, ``edge_inputs``, ...), in the order reports show them. A key whose values are
the math's own modes (``loss_aggregations``, ``group_methods``, ``kl_loss_estimators``, ...) reads
the math module's tuple instead (:mod:`ppo_ref.aggregation`, :mod:`ppo_ref.group`, ...); the
parsers (:mod:`.parsing`) and the catalogue (:mod:`.catalogue`) read both.
"""

from __future__ import annotations

__all__ = [
    "CALL_CONTEXTS",
    "CISPO_BOUNDS",
    "COMPUTE_DTYPES",
    "CONSTANT_GROUPS",
    "CORRECTION_BOUNDS",
    "EDGE_INPUTS",
    "GROUP_SINGLETONS",
    "GSPO_CLIPFRACS",
    "MASKED_FILLS",
    "MASKED_OUTPUT_OPS",
    "POLICY_LOSS_OPTIONS",
    "POLICY_STATISTICS",
    "VALUE_CLIP_MODES",
    "WHITEN_MODES",
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
MASKED_OUTPUT_OPS: tuple[str, ...] = (
    "masked_whiten",
    "kl_penalty",
    "token_rewards",
    "gae",
    "rollout_correction",
)
"""Ops with a per-token output and a mask: the spec fixes their outputs off the mask (0), unless the
adapter declares ``off_mask_outputs`` unspecified for them."""
WHITEN_MODES: tuple[str, ...] = ("shift-mean", "keep-mean")
"""``masked_whiten(shift_mean=True)`` and ``masked_whiten(shift_mean=False)``."""
COMPUTE_DTYPES: tuple[str, ...] = ("float64", "float32")
