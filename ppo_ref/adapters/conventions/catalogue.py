"""The catalogue: every convention key an adapter may declare, as data.

Each :class:`Convention` entry of :data:`CONVENTIONS` holds one key's reference value (written
once: the :class:`~.convention_set.ConventionSet` defaults read it), what it may be declared as,
what it means, the libraries and functions that do it (``seen_in``), its value parser
(:mod:`.parsing`) and the clauses it touches (:mod:`.clauses`). Adding a key adds one entry here,
one field to :class:`~.convention_set.ConventionSet` and, for a key that changes expected values,
its effect in the suite's ``conformance/variant.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ppo_ref.adapters.conventions.choices import (
    CALL_CONTEXTS,
    CISPO_BOUNDS,
    CONSTANT_GROUPS,
    CORRECTION_BOUNDS,
    GSPO_CLIPFRACS,
    POLICY_LOSS_OPTIONS,
    POLICY_STATISTICS,
    VALUE_CLIP_MODES,
    WHITEN_MODES,
)
from ppo_ref.adapters.conventions.clauses import (
    AGGREGATION_CLAUSES,
    OPTION_CLAUSES,
    compute_dtype_clauses,
    kl_clauses,
    masked_fill_clauses,
    missing,
    off_mask_clauses,
    prefix_mask_clauses,
    static,
    statistic_clauses,
)
from ppo_ref.adapters.conventions.parsing import (
    choice,
    optional_number,
    optional_positive,
    parse_compute_dtype,
    parse_edge_inputs,
    parse_group_singleton,
    parse_kl_clamp,
    parse_masked_fill,
    parse_off_mask_outputs,
    parse_prefix_masks,
    positive,
    subset,
)
from ppo_ref.aggregation import LOSS_AGGREGATIONS
from ppo_ref.correction import CORRECTION_LEVELS, CORRECTION_MODES
from ppo_ref.group import GROUP_METHODS
from ppo_ref.group import STD_SCOPES as GROUP_STD_SCOPES
from ppo_ref.kl import KL_ESTIMATORS
from ppo_ref.kl_loss import KL_LOSS_ESTIMATORS
from ppo_ref.masked import EPS_PLACEMENTS, WHITEN_EPS

__all__ = ["CONVENTIONS", "Convention"]


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
                choice("flat-branch", "ratio-outside", None),
                static("PG-3"),
            ),
            Convention(
                "approx_kl",
                "k3",
                "'k3', 'k1', 'neg-k1', 'k2' or None (not reported)",
                "the approx_kl statistic: k3 mean((r-1) - log r), k1 mean(old_logp - logp), neg-k1 "
                "the opposite sign mean(logp - old_logp), k2 0.5*mean((logp - old_logp)^2)",
                "k1: verl ppo_kl, OpenRLHF ppo_kl, torchrl kl_approx; k2: TRL approxkl; neg-k1: "
                "a library outside the matrix met by the issue-11 trial adapters (mean log-ratio)",
                choice("k3", "k1", "neg-k1", "k2", None),
                static("PG-5", "GSPO-3"),
            ),
            Convention(
                "unmasked_statistics",
                frozenset(),
                "a collection of 'clipfrac', 'approx_kl'",
                "these statistics are averaged over every position of the batch (B*T), masked-out "
                "positions counting as 0, so padding dilutes them",
                "TRL 1.12 PPOTrainer approxkl (mean over all positions)",
                subset(POLICY_STATISTICS, allow_empty=True),
                statistic_clauses,
            ),
            Convention(
                "whiten_variance",
                "unbiased",
                "'unbiased' or 'biased'",
                "masked_whiten divides by sqrt(var + 1e-8) with the biased (1/n) variance",
                "OpenRLHF masked_normalize, lm-human-preferences whiten(unbiased=False)",
                choice("unbiased", "biased"),
                static("MASK-2", "MASK-3"),
            ),
            Convention(
                "gae_whitening",
                "none",
                "'none', 'unbiased' or 'biased'",
                "gae returns advantages whitened over all action tokens of the batch (with that "
                "variance); returns stay raw advantages + values",
                "TRL 1.12 PPOTrainer, verl compute_gae_advantage_return, skyrl-train",
                choice("none", "unbiased", "biased"),
                static("GAE-1", "GAE-2", "GAE-3", "GAE-4"),
            ),
            Convention(
                "gae_bootstrap",
                "last-values",
                "'last-values' or 'none'",
                "'none': gae takes no last_values (cannot bootstrap a truncated row); only terminal "
                "rows are checked",
                "TRL, verl, OpenRLHF, skyrl-train GAE functions",
                choice("last-values", "none"),
                static("GAE-3"),
            ),
            Convention(
                "score_placement",
                "last-action-token",
                "'last-action-token' or 'after-last-action-token'",
                "the score goes on the position after the row's last action token (the first slot "
                "after EOS), or on the last action token when it is the last column",
                "TRL 1.12 PPOTrainer (first pad slot after EOS)",
                choice("last-action-token", "after-last-action-token"),
                static("RWD-2"),
            ),
            Convention(
                "kl_clamp",
                MappingProxyType({}),
                "None, a number c > 0, or {estimator: c}",
                "the per-token KL estimate is clamped to [-c, c] (for the given estimators)",
                "OpenRLHF compute_approx_kl (all, 10), verl kl_penalty low_var_kl (k3, 10)",
                parse_kl_clamp,
                lambda value: kl_clauses(value if isinstance(value, Mapping) else ()),
            ),
            Convention(
                "reward_kl_estimators",
                _ALL_KL,
                "a non-empty collection of 'k1', 'k2', 'k3'",
                "the estimators of the KL in the reward (kl_penalty and token_rewards) the library "
                "accepts; the others are not provided. The KL loss has its own key, "
                "kl_loss_estimators. 'kl_estimators' is the old name of this key, still accepted",
                "TRL (k1, k3), torchrl KLRewardTransform (k1)",
                subset(KL_ESTIMATORS, allow_empty=False),
                lambda value: kl_clauses(_ALL_KL - frozenset(value) if isinstance(value, Iterable) else ()),
            ),
            Convention(
                "dual_clip",
                None,
                "None or a number c > 1",
                "for A < 0 the per-token objective is max(min(rA, clip(r)A), cA) (Ye et al. 2020)",
                "verl compute_policy_loss_vanilla (c = 3 always on)",
                optional_positive(1.0),
                static("PG-1"),
            ),
            Convention(
                "log_ratio_clamp",
                None,
                "None or a number c > 0",
                "logp - old_logp is clamped to [-c, c] before the ratio and every statistic",
                "verl compute_policy_loss_vanilla (20)",
                optional_positive(0.0),
                static("PG-1", "PG-3", "PG-5"),
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
                subset(LOSS_AGGREGATIONS, allow_empty=False),
                missing(LOSS_AGGREGATIONS, AGGREGATION_CLAUSES),
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
                subset(POLICY_LOSS_OPTIONS, allow_empty=True),
                missing(POLICY_LOSS_OPTIONS, OPTION_CLAUSES),
            ),
            Convention(
                "group_methods",
                frozenset(GROUP_METHODS),
                "a non-empty collection of 'grpo', 'dr_grpo', 'rloo'",
                "the methods group_advantages accepts; the others are not provided",
                "TRL GRPOTrainer (grpo; dr_grpo is scale_rewards='none'), TRL RLOOTrainer (rloo)",
                subset(GROUP_METHODS, allow_empty=False),
                missing(GROUP_METHODS, dict.fromkeys(GROUP_METHODS, ("GRP-1",))),
            ),
            Convention(
                "group_std_scopes",
                frozenset(GROUP_STD_SCOPES),
                "a non-empty collection of 'group', 'batch', 'none'",
                "the std_scope values group_advantages accepts for grpo; the others are not provided",
                "batch: TRL scale_rewards='batch' only; verl and OpenRLHF divide by the group's std",
                subset(GROUP_STD_SCOPES, allow_empty=False),
                missing(GROUP_STD_SCOPES, dict.fromkeys(GROUP_STD_SCOPES, ("GRP-2",))),
            ),
            Convention(
                "group_std_eps",
                None,
                "None (eps honoured as passed) or a number >= 0",
                "grpo divides by std + this fixed epsilon whatever eps is passed (it decides the "
                "advantages of near-constant groups)",
                "TRL GRPOTrainer 1e-4; verl compute_grpo_outcome_advantage and skyrl-train 1e-6; "
                "OpenRLHF group_norm 1e-9",
                optional_number,
                static("GRP-2"),
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
                parse_group_singleton,
                static("GRP-3"),
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
                choice(*CONSTANT_GROUPS),
                static("GRP-3", "GRP-4"),
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
                choice(*CISPO_BOUNDS),
                static("CISPO-1", "CISPO-2"),
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
                choice(*GSPO_CLIPFRACS),
                static("GSPO-3"),
            ),
            Convention(
                "kl_loss_estimators",
                frozenset(KL_LOSS_ESTIMATORS),
                "a non-empty collection of 'k1', 'k2', 'k3', 'k3+'",
                "the estimators kl_loss accepts; the others are not provided",
                "TRL GRPOTrainer (k3 only); OpenRLHF (k1, k2, k3)",
                subset(KL_LOSS_ESTIMATORS, allow_empty=False),
                missing(KL_LOSS_ESTIMATORS, dict.fromkeys(KL_LOSS_ESTIMATORS, ("KLL-1", "KLL-2"))),
            ),
            Convention(
                "correction_levels",
                frozenset(CORRECTION_LEVELS),
                "a non-empty collection of 'token', 'sequence', 'sequence-geometric'",
                "the levels rollout_correction accepts; the others are not provided",
                "TRL vllm_importance_sampling (token, sequence); OpenRLHF (token)",
                subset(CORRECTION_LEVELS, allow_empty=False),
                missing(
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
                subset(CORRECTION_MODES, allow_empty=False),
                missing(CORRECTION_MODES, dict.fromkeys(CORRECTION_MODES, ("IS-1",))),
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
                subset(CORRECTION_BOUNDS, allow_empty=True),
                missing(CORRECTION_BOUNDS, dict.fromkeys(CORRECTION_BOUNDS, ("IS-1",))),
            ),
            Convention(
                "value_loss_scale",
                0.5,
                "a number > 0 (reference 0.5)",
                "the factor in front of the mean squared error (1.0: no 1/2)",
                "stable-baselines3 F.mse_loss (1.0)",
                lambda value: positive(value),
                static("VF-1", "VF-2"),
            ),
            Convention(
                "value_clip_form",
                "max",
                "'max' or 'clipped-only'",
                "clipped value loss: max of the unclipped and clipped errors, or the clipped error only",
                "stable-baselines3 PPO.train (clipped only)",
                choice("max", "clipped-only"),
                static("VF-1"),
            ),
            Convention(
                "value_clip_modes",
                frozenset(VALUE_CLIP_MODES),
                "a non-empty collection of 'clipped', 'unclipped'",
                "which value losses value_loss computes (clip_eps a number, or None); the others are "
                "not provided",
                "TRL 1.12 PPOTrainer (always clipped)",
                subset(VALUE_CLIP_MODES, allow_empty=False),
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
                choice("token-mean", "seq-mean-token-mean"),
                static("VF-1", "VF-2"),
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
                parse_compute_dtype,
                compute_dtype_clauses,
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
                parse_off_mask_outputs,
                off_mask_clauses,
            ),
            Convention(
                "whiten_eps",
                WHITEN_EPS,
                "a number > 0 (reference 1e-8)",
                "the epsilon of the whitening (masked_whiten, and gae_whitening inside gae)",
                "1e-8 everywhere in the matrix (verl, skyrl-train, OpenRLHF masked_normalize, "
                "stable-baselines3); other values in libraries outside it",
                lambda value: positive(value),
                static("MASK-3", "GAE-1", "GAE-2", "GAE-3", "GAE-4", "RPP-1", "RPP-2"),
            ),
            Convention(
                "whiten_eps_placement",
                "inside-sqrt",
                "'inside-sqrt', 'outside-sqrt' or 'clamp'",
                "where the whitening epsilon goes: 1/sqrt(var + eps) (inside-sqrt), 1/(std + eps) "
                "(outside-sqrt), 1/sqrt(max(var, eps)) (clamp); ppo_ref.masked_whiten(eps_placement=)",
                "outside-sqrt: stable-baselines3 PPO.train (advantages.std() + 1e-8); clamp: OpenRLHF "
                "masked_normalize (var.clamp(min=eps).rsqrt()); inside-sqrt: verl, skyrl-train",
                choice(*EPS_PLACEMENTS),
                static("MASK-3", "GAE-1", "GAE-2", "GAE-3", "GAE-4", "RPP-1", "RPP-2"),
            ),
            Convention(
                "whiten_modes",
                frozenset(WHITEN_MODES),
                "a non-empty collection of 'shift-mean', 'keep-mean'",
                "the whitenings masked_whiten computes: shift-mean (shift_mean=True) and keep-mean "
                "(shift_mean=False, the mean added back); the others are not provided",
                "skyrl-train normalize_advantages_dict (shift-mean only); libraries that only "
                "whiten advantages",
                subset(WHITEN_MODES, allow_empty=False),
                missing(WHITEN_MODES, {"shift-mean": ("MASK-3",), "keep-mean": ("MASK-3",)}),
            ),
            Convention(
                "score_clip",
                None,
                "None or a number c > 0",
                "token_rewards clamps the score to [-c, c] before adding it",
                "OpenRLHF compute_reward (reward_clip_range (-10, 10) by default)",
                optional_positive(0.0),
                static("RWD-2"),
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
                choice("token-mean", "seq-mean-token-mean"),
                static("PG-3"),
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
                parse_masked_fill,
                masked_fill_clauses,
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
                parse_prefix_masks,
                prefix_mask_clauses,
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
                parse_edge_inputs,
                static(),
            ),
            Convention(
                "value_after_last_action_token",
                "untrained",
                "'untrained' or 'trained'",
                "'trained': the slot after each row's last action token (where score_placement="
                "'after-last-action-token' puts the score) is a state with a value: the value loss "
                "covers it and GAE runs through it (its advantage stays 0, its return is the score)",
                "TRL 1.12 PPOTrainer (padding_mask_p1 for the values and the value loss)",
                choice("untrained", "trained"),
                static("VF-1", "VF-2", "GAE-2", "GAE-4"),
            ),
            Convention(
                "log_ratio_clamp_statistics",
                "clamped",
                "'clamped' or 'raw'",
                "with log_ratio_clamp declared: approx_kl from the clamped log-ratio (clamped, like "
                "the ratio) or from the raw logp - old_logp (raw)",
                "raw: OpenRLHF PolicyLoss (ppo_kl from the unclamped log-ratio); clamped: verl, skyrl-train",
                choice("clamped", "raw"),
                static("PG-5"),
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
                choice(*CALL_CONTEXTS),
                static("PG-2", "PG-6", "VF-1"),
            ),
        )
    }
)
"""Every convention key an adapter may declare."""
