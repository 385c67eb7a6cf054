"""verl 0.9.1's PPO-family ops under the conformance suite (issue 14): mixed into ``VerlAdapter``.

Every op calls the verl function its trainer calls (``family_sources`` names each one with its
file and line, read from the installed package); the adapter only converts arguments the way
verl's own callers do:

- ``group_advantages``: the scores become one-column ``token_level_rewards`` with a one-column
  ``response_mask`` and the group ids verl's ``index`` (a numpy array of uids), as
  ``verl.trainer.ppo.ray_trainer.compute_advantage`` passes them. ``grpo`` is
  ``compute_grpo_outcome_advantage`` (the function the trainer calls by name for ``grpo``) with its
  default ``epsilon`` (the trainer never passes one: declared ``group_std_eps=1e-6``);
  ``std_scope='none'`` and ``dr_grpo`` are its ``norm_adv_by_std_in_grpo=False``; ``rloo`` is
  ``compute_rloo_outcome_advantage`` (``adv_estimator: rloo``). verl has no batch-std scope.
- the loss ops pass the whole-batch counts the way ``verl.workers.utils.losses.ppo_loss`` fills
  ``ActorConfig.global_batch_info``: ``token_count`` is ``batch_num_tokens``, ``row_count`` is
  ``global_batch_size`` and ``norm_constant`` is ``loss_scale_factor`` (``dp_size`` stays 1); without
  a ``row_count``, ``seq-mean-token-sum-norm`` gets the batch's rows, as verl's engine passes
  (:func:`engine_row_count`);
  masks are bool, as ``ppo_loss`` hands them to the policy losses.
- ``aggregate_loss`` is ``agg_loss``; ``kl_loss`` is ``kl_penalty`` (names k1, k2, k3, k3+ as
  given) then ``agg_loss``, as ``ppo_loss`` does with ``use_kl_loss``.
- ``gspo_loss`` is the registered policy loss ``gspo`` with ``loss_agg_mode='seq-mean-token-mean'``
  (the GSPO recipes' setting; verl's own default is token-mean, see docs/findings-family.md) and the
  sequence advantage broadcast to every token times the mask, as verl's outcome estimators return it.
- ``cispo_loss`` is the registered policy loss ``cispo`` with ``clip_ratio_low = clip_low`` and
  ``clip_ratio_high = clip_high`` (offsets, the reference parametrisation).
- ``rollout_correction`` is ``rollout_corr_helper.compute_rollout_correction_weights`` on
  ``log_ratio = logp - rollout_logp`` (what ``compute_rollout_correction_and_rejection_mask`` hands
  it), ``rollout_is`` the level and ``rollout_is_threshold`` ``high`` (TIS) or ``"low_high"``
  (IcePop). verl's TIS has no lower bound and its IcePop needs one: those calls are ValueErrors.
- ``policy_options_config`` builds the ``ActorConfig`` that ``VerlAdapter.policy_loss`` uses for
  ``clip_eps_high`` (``clip_ratio_high``), ``dual_clip`` (``clip_ratio_c``) and the counts.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType, ModuleType
from typing import Any

import torch
from torch import Tensor

from ppo_ref.adapters.base import LossReport
from ppo_ref.adapters.thirdparty._common import library_location as _where

__all__ = [
    "FAMILY_CONVENTIONS",
    "FAMILY_CONVENTION_SOURCES",
    "FAMILY_NOT_PROVIDED",
    "VerlFamilyOps",
    "engine_row_count",
]

CORRECTION_MODULE = "verl.trainer.ppo.rollout_corr_helper"

FAMILY_CONVENTIONS: Mapping[str, object] = MappingProxyType(
    {
        "group_methods": ["grpo", "dr_grpo", "rloo"],
        "group_std_scopes": ["group", "none"],
        "group_std_eps": 1e-6,
        "group_singleton": "raw-score",
        "constant_groups": "rounding",
        "cispo_bounds": "offsets",
        "gspo_clipfrac": "tokens",
        "kl_loss_estimators": ["k1", "k2", "k3", "k3+"],
        "correction_levels": ["token", "sequence"],
        "correction_modes": ["truncate", "mask"],
        "correction_bounds": [],
    }
)
"""verl's declared PPO-family conventions (sources in FAMILY_CONVENTION_SOURCES); the capability
keys ``loss_aggregations`` and ``policy_loss_options`` are declared in ``verl.py``."""

FAMILY_CONVENTION_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "group_methods": "verl/trainer/ppo/core_algos.py compute_grpo_outcome_advantage "
        "(norm_adv_by_std_in_grpo=False is Dr. GRPO) and compute_rloo_outcome_advantage",
        "group_std_scopes": "verl/trainer/ppo/core_algos.py compute_grpo_outcome_advantage divides by the "
        "group's torch.std or not at all (norm_adv_by_std_in_grpo); verl has no batch-std scaling",
        "group_std_eps": "compute_grpo_outcome_advantage(..., epsilon=1e-6); "
        "verl/trainer/ppo/ray_trainer.py compute_advantage never passes epsilon",
        "group_singleton": "verl/trainer/ppo/core_algos.py compute_grpo_outcome_advantage: a group of one "
        "gets id2mean 0 and id2std 1, so A = r / (1 + eps); compute_rloo_outcome_advantage leaves A = r "
        "(rloo_vectorized gives 0)",
        "constant_groups": "verl/trainer/ppo/core_algos.py compute_grpo_outcome_advantage and "
        "compute_rloo_outcome_advantage: scores - torch.mean of the group's scores, no special case, so a "
        "constant group keeps the mean's rounding (three scores of 0.1: -1.39e-17)",
        "cispo_bounds": "verl/trainer/ppo/core_algos.py compute_policy_loss_cispo: clamp(ratio, 1 - "
        "clip_ratio_low, 1 + clip_ratio_high)",
        "gspo_clipfrac": "verl/trainer/ppo/core_algos.py compute_policy_loss_gspo: pg_clipfrac = "
        "masked_mean(gt(pg_losses2, pg_losses1), response_mask), a share of tokens (logged as "
        "actor/pg_clipfrac), the statistic the GSPO paper reports (arXiv 2507.18071, section 5.3)",
        "kl_loss_estimators": "verl/trainer/ppo/core_algos.py kl_penalty accepts k1, k2, k3 (low_var_kl), "
        "abs, and a '+' suffix for the straight-through k2 gradient (k3+)",
        "correction_levels": "verl/trainer/ppo/rollout_corr_helper.py compute_rollout_correction_weights: "
        "rollout_is in {'token', 'sequence'} (the product ratio); no geometric-mean sequence weight",
        "correction_modes": "verl/trainer/ppo/rollout_corr_helper.py compute_rollout_correction_weights: a "
        "float threshold truncates (TIS), a 'lower_upper' string zeroes weights outside [lower, upper] "
        "(IcePop)",
        "correction_bounds": "verl/trainer/ppo/rollout_corr_helper.py compute_rollout_correction_weights: "
        "a float threshold is TIS min(w, high) with no floor; IcePop's 'lower_upper' string needs a lower "
        "bound > 0",
    }
)

FAMILY_NOT_PROVIDED: Mapping[str, str] = MappingProxyType({})


def _bool_mask(mask: Tensor) -> Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def engine_row_count(mask: Tensor, loss_agg: str, row_count: int | Tensor | None) -> int | Tensor | None:
    """``row_count``, or for ``seq-mean-token-sum-norm`` without one the batch's row count: the
    ``global_batch_size`` verl's engine passes every loss (``ray_trainer._update_actor`` sets it to
    ``ppo_mini_batch_size * rollout.n``, the rows of the mini-batch; ``losses.ppo_loss`` copies it into
    ``global_batch_info``), which is the spec's B (every row) in that mode. The seq-mean modes get
    none: verl then counts the rows with an action token, the spec's R, which is the engine's row
    count on verl's own batches (a generated response has at least one token); declared
    ``call_context='batch-token-count'``."""
    if row_count is None and loss_agg == "seq-mean-token-sum-norm" and mask.shape[0] > 0:
        return int(mask.shape[0])
    return row_count


def batch_info(
    norm_constant: float | None = None,
    token_count: int | Tensor | None = None,
    row_count: int | Tensor | None = None,
) -> dict[str, Any]:
    """``ActorConfig.global_batch_info`` as ``ppo_loss`` fills it, from the contract's count keywords."""
    return {
        "batch_num_tokens": token_count,
        "global_batch_size": row_count,
        "loss_scale_factor": norm_constant,
    }


class VerlFamilyOps:
    """The family ops; ``VerlAdapter`` supplies ``_core`` (core_algos), ``_actor_config`` (ActorConfig)."""

    _core: ModuleType
    _actor_config: Any
    _correction: ModuleType | None = None
    _family_configs: dict[tuple[float, float, float], Any]

    def family_sources(self) -> tuple[dict[str, str], dict[str, str]]:
        """(op -> verl function it calls, op -> why not provided); imports the correction module."""
        core = self._core
        self._family_configs = {}
        sources = {
            "group_advantages": f"{_where(core.compute_grpo_outcome_advantage)} (grpo, dr_grpo) and "
            f"{_where(core.compute_rloo_outcome_advantage)} (rloo)",
            "aggregate_loss": _where(core.agg_loss),
            "gspo_loss": _where(core.get_policy_loss_fn("gspo"))
            + " via get_policy_loss_fn('gspo'), loss_agg_mode='seq-mean-token-mean'",
            "cispo_loss": _where(core.get_policy_loss_fn("cispo")) + " via get_policy_loss_fn('cispo')",
            "kl_loss": f"{_where(core.kl_penalty)} then {_where(core.agg_loss)}",
        }
        not_provided: dict[str, str] = {}
        try:
            self._correction = importlib.import_module(CORRECTION_MODULE)
        except ImportError as error:
            not_provided["rollout_correction"] = f"{CORRECTION_MODULE} did not import ({error})"
        else:
            sources["rollout_correction"] = _where(self._correction.compute_rollout_correction_weights)
        return sources, not_provided

    def policy_options_config(
        self,
        clip_eps: float,
        clip_eps_high: float | None = None,
        dual_clip: float | None = None,
        **counts: Any,
    ) -> Any:
        """The ``ActorConfig`` for one policy-loss call: ``clip_ratio``/``clip_ratio_low`` =
        ``clip_eps``, ``clip_ratio_high`` = ``clip_eps_high`` (None: ``clip_eps``), ``clip_ratio_c``
        = ``dual_clip`` (None: verl's default 3.0, always on), ``global_batch_info`` from ``counts``."""
        high = clip_eps if clip_eps_high is None else clip_eps_high
        c = 3.0 if dual_clip is None else dual_clip
        key = (float(clip_eps), float(high), float(c))
        if key not in self._family_configs:
            self._family_configs[key] = self._actor_config(
                strategy="fsdp",
                rollout_n=1,
                ppo_micro_batch_size_per_gpu=1,
                clip_ratio=clip_eps,
                clip_ratio_low=clip_eps,
                clip_ratio_high=high,
                clip_ratio_c=c,
            )
        config = self._family_configs[key]
        config.global_batch_info.clear()
        config.global_batch_info.update(batch_info(**counts))
        return config

    # --- GRP ---

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
        del eps  # verl's trainer always uses the function's default epsilon (declared group_std_eps)
        if singleton != "zero":
            raise ValueError(f"singleton: verl has no {singleton!r} mode (a group of one gets its raw score)")
        if method == "grpo" and std_scope == "batch":
            raise ValueError("std_scope: verl has no batch-std scaling (declared group_std_scopes)")
        rewards = scores.detach().clone().unsqueeze(-1)
        response_mask = torch.ones_like(rewards)
        index = group_ids.detach().cpu().numpy()
        if method in ("grpo", "dr_grpo"):
            advantages, _ = self._core.compute_grpo_outcome_advantage(
                token_level_rewards=rewards,
                response_mask=response_mask,
                index=index,
                norm_adv_by_std_in_grpo=method == "grpo" and std_scope == "group",
            )
        elif method == "rloo":
            advantages, _ = self._core.compute_rloo_outcome_advantage(
                token_level_rewards=rewards, response_mask=response_mask, index=index
            )
        else:
            raise ValueError(f"method: expected 'grpo', 'dr_grpo' or 'rloo', got {method!r}")
        result: Tensor = advantages.squeeze(-1)
        return result

    # --- AGG ---

    def aggregate_loss(
        self,
        per_token: Tensor,
        mask: Tensor,
        loss_agg: str = "token-mean",
        *,
        norm_constant: float | None = None,
        token_count: int | Tensor | None = None,
        row_count: int | Tensor | None = None,
    ) -> Tensor:
        result: Tensor = self._core.agg_loss(
            loss_mat=per_token,
            loss_mask=_bool_mask(mask),
            loss_agg_mode=loss_agg,
            **batch_info(norm_constant, token_count, engine_row_count(mask, loss_agg, row_count)),
        )
        return result

    # --- GSPO, CISPO ---

    def gspo_loss(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        clip_eps: float,
        *,
        clip_eps_high: float | None = None,
        row_count: int | Tensor | None = None,
    ) -> LossReport:
        keep = _bool_mask(mask)
        loss, metrics = self._core.get_policy_loss_fn("gspo")(
            old_log_prob=old_logp,
            log_prob=logp,
            advantages=advantages.unsqueeze(-1) * keep.to(advantages.dtype),
            response_mask=keep,
            loss_agg_mode="seq-mean-token-mean",
            config=self.policy_options_config(clip_eps, clip_eps_high, row_count=row_count),
        )
        return LossReport(loss, metrics["actor/pg_clipfrac"], metrics["actor/ppo_kl"])

    def cispo_loss(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        clip_low: float,
        clip_high: float,
        loss_agg: str = "token-mean",
        *,
        norm_constant: float | None = None,
        token_count: int | Tensor | None = None,
        row_count: int | Tensor | None = None,
    ) -> LossReport:
        config = self._actor_config(
            strategy="fsdp",
            rollout_n=1,
            ppo_micro_batch_size_per_gpu=1,
            clip_ratio=clip_low,
            clip_ratio_low=clip_low,
            clip_ratio_high=clip_high,
        )
        config.global_batch_info.update(
            batch_info(norm_constant, token_count, engine_row_count(mask, loss_agg, row_count))
        )
        loss, metrics = self._core.get_policy_loss_fn("cispo")(
            old_log_prob=old_logp,
            log_prob=logp,
            advantages=advantages,
            response_mask=_bool_mask(mask),
            loss_agg_mode=loss_agg,
            config=config,
        )
        return LossReport(loss, metrics["actor/pg_clipfrac"], metrics["actor/ppo_kl"])

    # --- KLL ---

    def kl_loss(
        self,
        logp: Tensor,
        ref_logp: Tensor,
        mask: Tensor,
        estimator: str,
        loss_agg: str = "token-mean",
        *,
        norm_constant: float | None = None,
        token_count: int | Tensor | None = None,
        row_count: int | Tensor | None = None,
    ) -> Tensor:
        kld = self._core.kl_penalty(logprob=logp, ref_logprob=ref_logp, kl_penalty=estimator)
        result: Tensor = self._core.agg_loss(
            loss_mat=kld,
            loss_mask=_bool_mask(mask),
            loss_agg_mode=loss_agg,
            **batch_info(norm_constant, token_count, engine_row_count(mask, loss_agg, row_count)),
        )
        return result

    # --- IS ---

    def rollout_correction(
        self,
        logp: Tensor,
        rollout_logp: Tensor,
        mask: Tensor,
        *,
        level: str = "token",
        mode: str = "truncate",
        high: float,
        low: float | None = None,
    ) -> Tensor:
        if self._correction is None:
            raise RuntimeError(f"rollout_correction is not provided: {CORRECTION_MODULE} did not import")
        if level not in ("token", "sequence"):
            raise ValueError(f"level: verl's rollout_is is 'token' or 'sequence', got {level!r}")
        if mode == "truncate":
            if low is not None:
                raise ValueError("low: verl's TIS (a float rollout_is_threshold) truncates above only")
            threshold: str | float = float(high)
        elif mode == "mask":
            if low is None:
                raise ValueError("low: verl's IcePop threshold 'lower_upper' needs a lower bound > 0")
            threshold = f"{float(low)!r}_{float(high)!r}"
        else:
            raise ValueError(f"mode: expected 'truncate' or 'mask', got {mode!r}")
        keep = _bool_mask(mask)
        weights, _metrics = self._correction.compute_rollout_correction_weights(
            log_ratio=logp.detach() - rollout_logp.detach(),
            response_mask=keep.to(logp.dtype),
            rollout_is=level,
            rollout_is_threshold=threshold,
        )
        result: Tensor = weights
        return result
