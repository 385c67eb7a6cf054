"""skyrl 0.4.0's PPO-family ops under the conformance suite (issue 14, moved to 0.4.0 in issue 22).

Mixed into ``SkyRLAdapter``. Every op calls the skyrl function its trainer calls (``family_sources``
names each with its file and line); the adapter only converts arguments the way skyrl's trainer
does. skyrl 0.4.0 (``skyrl/backends/skyrl_train/utils/ppo_utils.py``) reduces differently from
skyrl-train 0.3.1: the policy losses end with ``reduce_loss(loss, loss_mask)``, a masked *sum*, and
the trainer folds the reduction into the advantages beforehand, once per mini-batch
(``RayPPOTrainer._normalize_advantages`` -> ``apply_loss_reduction_to_advantages_minibatch``):

- ``group_advantages`` is ``compute_advantages_and_returns`` (the trainer's entry: it looks the
  estimator up in ``AdvantageEstimatorRegistry``) with the scores as one-column
  ``token_level_rewards``, a one-column ``response_mask`` and the group ids as ``index``;
  ``grpo`` with ``grpo_norm_by_std=True``, ``dr_grpo`` (and ``grpo`` with ``std_scope='none'``)
  with ``grpo_norm_by_std=False``, ``rloo``. Its default ``epsilon`` 1e-6 (the trainer passes
  none: declared ``group_std_eps``).
- ``aggregate_loss`` is ``apply_loss_reduction_to_advantages_minibatch`` applied to the per-token
  values (the scaling is linear, as the losses are in the advantages) then ``reduce_loss``, the
  call batch being one mini-batch: ``token-mean`` -> ``token_mean``, ``seq-mean-token-mean`` ->
  ``sequence_mean``, ``seq-mean-token-sum-norm`` -> ``seq_mean_token_sum_norm`` with ``max_seq_len
  = norm_constant``, ``seq-mean-token-sum`` -> ``seq_mean_token_sum_norm`` with ``max_seq_len = 1``.
  The counts come from the mini-batch tensors, so ``token_count`` and ``row_count`` are not provided.
- ``gspo_loss`` is ``PolicyLossRegistry.get('gspo')`` on the sequence advantage on every token,
  scaled as ``sequence_mean`` (the reduction its docstring and warning ask for).
- ``cispo_loss`` is ``PolicyLossRegistry.get('cispo')`` with ``CISPOConfig(cispo_eps_clip_low =
  clip_low, cispo_eps_clip_high = clip_high)`` (offsets), its advantages scaled by ``loss_agg``.
- ``kl_loss`` is ``compute_approx_kl(..., loss_mask=mask, kl_estimator_type=...)`` then
  ``aggregate_loss``; the worker (``workers/worker.py``) reduces it with
  ``masked_mean(kl, loss_mask, dim=-1).mean()`` per micro-batch whatever ``loss_reduction`` says.
- ``rollout_correction`` reads the TIS weight ``ppo_policy_loss`` multiplies the per-token loss by
  (``apply_off_policy_correction`` with ``OffPolicyCorrectionConfig(tis_ratio_type='token' |
  'sequence', token_tis_ratio_clip_high | sequence_tis_ratio_clip_high = high)``): the loss is
  called with ``log_probs = old_log_probs = logp`` (ratio 1) and advantages 1, so it is ``-sum_t
  w_t`` and the weights are minus its gradient in the advantages. Truncation above only.

The configs are skyrl's own ``AlgorithmConfig`` dataclass (``skyrl/train/config/config.py``), the type
its trainer passes, at its defaults except the fields named here.
"""

from __future__ import annotations

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
    "REDUCTIONS",
    "SkyRLFamilyOps",
    "reduction_config",
]

PPO_UTILS = "skyrl/backends/skyrl_train/utils/ppo_utils.py"

REDUCTIONS: Mapping[str, str] = MappingProxyType(
    {
        "token-mean": "token_mean",
        "seq-mean-token-mean": "sequence_mean",
        "seq-mean-token-sum": "seq_mean_token_sum_norm",
        "seq-mean-token-sum-norm": "seq_mean_token_sum_norm",
    }
)
"""ppo-ref's loss_agg -> skyrl's loss_reduction (seq-mean-token-sum is the norm mode with C = 1)."""

FAMILY_CONVENTIONS: Mapping[str, object] = MappingProxyType(
    {
        "group_methods": ["grpo", "dr_grpo", "rloo"],
        "group_std_scopes": ["group", "none"],
        "group_std_eps": 1e-6,
        "group_singleton": {"grpo": "raw-score", "dr_grpo": "raw-score", "rloo": "zero"},
        "constant_groups": "rounding",
        "cispo_bounds": "offsets",
        "kl_loss_estimators": ["k1", "k2", "k3"],
        "correction_levels": ["token", "sequence"],
        "correction_modes": ["truncate"],
        "correction_bounds": [],
    }
)
"""skyrl 0.4.0's declared PPO-family conventions (sources in FAMILY_CONVENTION_SOURCES); the
capability keys ``loss_aggregations`` and ``policy_loss_options`` are declared in ``skyrl.py``."""

FAMILY_CONVENTION_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "group_methods": f"{PPO_UTILS}:1343 compute_grpo_outcome_advantage "
        "(grpo_norm_by_std=False is Dr. GRPO) and :1259 compute_rloo_outcome_advantage, through "
        ":1436 compute_advantages_and_returns",
        "group_std_scopes": f"{PPO_UTILS}:1343 compute_grpo_outcome_advantage divides by the "
        "group's torch.std or not at all (grpo_norm_by_std); no batch-std scaling",
        "group_std_eps": f"{PPO_UTILS}:1348 compute_grpo_outcome_advantage(..., epsilon=1e-6); "
        "the trainer never passes epsilon (skyrl/train/trainer.py:1209)",
        "group_singleton": f"{PPO_UTILS}:1378-1380 compute_grpo_outcome_advantage: a group of one "
        "gets mean 0 and std 1, so A = r / (1 + eps) (and r with grpo_norm_by_std=False); "
        "compute_rloo_outcome_advantage gives 0 (declared per method)",
        "constant_groups": f"{PPO_UTILS} compute_grpo_outcome_advantage: scores - "
        "torch.mean(group); compute_rloo_outcome_advantage: (scores - mean) * n / (n - 1); no special "
        "case, so a constant group keeps the mean's rounding (three scores of 0.1: -1.39e-17)",
        "cispo_bounds": f"{PPO_UTILS}:783 compute_policy_loss_cispo: clamp(ratio, 1 - "
        "cispo.cispo_eps_clip_low, 1 + cispo.cispo_eps_clip_high); 0.4.0's CISPOConfig defaults 1.0 and "
        "4.0 give [0, 5] (skyrl/train/config/config.py:832-837; 0.3.1's [1, 6]: docs/findings-family.md "
        "skyrl-f3)",
        "kl_loss_estimators": f"{PPO_UTILS}:88 compute_approx_kl: kl_estimator_type k1, k2, "
        "k3, abs; no straight-through k3+",
        "correction_levels": "skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py:24 "
        "compute_tis_ratio: tis_ratio_type 'token' (exp(old - rollout) per token) or 'sequence' "
        "(exp of the row's summed log-ratios: the product), applied by apply_off_policy_correction (:351), "
        "which every registered policy loss calls",
        "correction_modes": "off_policy_correction_utils.py compute_tis_ratio: TIS is torch.clamp(ratio, "
        "max=cap) (truncate); the masking options (sequence_mask_metric, token_mask_is_threshold_*) "
        "change the loss mask, not a weight, and are not mapped here",
        "correction_bounds": "off_policy_correction_utils.py compute_tis_ratio: clamp(max=token_tis_ratio_"
        "clip_high | sequence_tis_ratio_clip_high), no floor",
    }
)

FAMILY_NOT_PROVIDED: Mapping[str, str] = MappingProxyType({})


def reduction_config(loss_agg: str, norm_constant: float | None = None) -> dict[str, Any]:
    """``loss_reduction`` and ``max_seq_len`` of skyrl's config for ``loss_agg`` (ValueError if unknown)."""
    if loss_agg not in REDUCTIONS:
        raise ValueError(f"loss_agg: expected one of {list(REDUCTIONS)}, got {loss_agg!r}")
    if loss_agg == "seq-mean-token-sum-norm" and norm_constant is None:
        raise ValueError("norm_constant: skyrl's seq_mean_token_sum_norm needs max_seq_len")
    if loss_agg != "seq-mean-token-sum-norm" and norm_constant is not None:
        raise ValueError(f"norm_constant: only seq-mean-token-sum-norm takes it, got loss_agg={loss_agg!r}")
    max_seq_len = {"seq-mean-token-sum": 1.0, "seq-mean-token-sum-norm": norm_constant}.get(loss_agg)
    return {"loss_reduction": REDUCTIONS[loss_agg], "max_seq_len": max_seq_len}


class SkyRLFamilyOps:
    """The family ops; ``SkyRLAdapter`` supplies ``_ppo`` (ppo_utils), ``_config`` (skyrl.train.config)."""

    _ppo: ModuleType
    _config: ModuleType

    def family_sources(self) -> tuple[dict[str, str], dict[str, str]]:
        """(op -> skyrl function it calls, op -> why not provided)."""
        ppo = self._ppo
        registry = ppo.PolicyLossRegistry
        scale = _where(ppo.apply_loss_reduction_to_advantages_minibatch)
        sources = {
            "group_advantages": f"{_where(ppo.compute_advantages_and_returns)} -> "
            f"{_where(ppo.compute_grpo_outcome_advantage)} (grpo, dr_grpo), "
            f"{_where(ppo.compute_rloo_outcome_advantage)} (rloo)",
            "aggregate_loss": f"{scale} then {_where(ppo.reduce_loss)}",
            "gspo_loss": _where(registry.get("gspo"))
            + f" via PolicyLossRegistry.get('gspo'), advantages scaled by {scale} (sequence_mean)",
            "cispo_loss": _where(registry.get("cispo"))
            + f" via PolicyLossRegistry.get('cispo'), advantages scaled by {scale}",
            "kl_loss": f"{_where(ppo.compute_approx_kl)} then {scale} and {_where(ppo.reduce_loss)}",
            "rollout_correction": _where(registry.get("regular"))
            + " with off_policy_correction.tis_ratio_type token | sequence "
            + f"({_where(ppo.apply_off_policy_correction)}): the weights it multiplies the loss by, "
            "read as the gradient",
        }
        return sources, dict(FAMILY_NOT_PROVIDED)

    def _algorithm_config(self, **fields: Any) -> Any:
        """skyrl's ``AlgorithmConfig`` at its defaults except ``fields``."""
        return self._config.AlgorithmConfig(**fields)

    def _scaled(self, values: Tensor, keep: Tensor, loss_agg: str, norm_constant: float | None) -> Tensor:
        """``values`` scaled so that their masked sum is the ``loss_agg`` reduction over the call's
        batch, by the function the trainer applies to each mini-batch's advantages."""
        reduction = reduction_config(loss_agg, norm_constant)
        result: Tensor = self._ppo.apply_loss_reduction_to_advantages_minibatch(
            advantages=values,
            loss_mask=keep,
            loss_reduction=reduction["loss_reduction"],
            micro_batch_size=values.shape[0],
            max_seq_len=reduction["max_seq_len"],
        )
        return result

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
        del eps  # the trainer never passes epsilon (declared group_std_eps)
        if singleton != "zero":
            raise ValueError(f"singleton: skyrl has no {singleton!r} mode")
        if method == "grpo" and std_scope == "batch":
            raise ValueError("std_scope: skyrl has no batch-std scaling (declared group_std_scopes)")
        if method not in ("grpo", "dr_grpo", "rloo"):
            raise ValueError(f"method: expected 'grpo', 'dr_grpo' or 'rloo', got {method!r}")
        rewards = scores.detach().clone().unsqueeze(-1)
        advantages, _ = self._ppo.compute_advantages_and_returns(
            token_level_rewards=rewards,
            response_mask=torch.ones_like(rewards),
            index=group_ids.detach().cpu().numpy(),
            adv_estimator="rloo" if method == "rloo" else "grpo",
            config=self._algorithm_config(),
            grpo_norm_by_std=method == "grpo" and std_scope == "group",
        )
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
        _no_counts(token_count, row_count)
        keep = _float_mask(mask, per_token)
        result: Tensor = self._ppo.reduce_loss(self._scaled(per_token, keep, loss_agg, norm_constant), keep)
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
        _no_counts(None, row_count)
        keep = _float_mask(mask, logp)
        config = self._algorithm_config(
            policy_loss_type="gspo",
            loss_reduction="sequence_mean",
            eps_clip_low=clip_eps,
            eps_clip_high=clip_eps if clip_eps_high is None else clip_eps_high,
        )
        scaled = self._scaled(advantages.unsqueeze(-1) * keep, keep, "seq-mean-token-mean", None)
        loss, metrics = self._ppo.PolicyLossRegistry.get("gspo")(
            logp, old_logp, scaled, config, loss_mask=keep
        )
        return LossReport(loss, metrics["clip_ratio"])

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
        _no_counts(token_count, row_count)
        keep = _float_mask(mask, logp)
        reduction = reduction_config(loss_agg, norm_constant)
        config = self._algorithm_config(
            policy_loss_type="cispo",
            cispo=self._config.CISPOConfig(cispo_eps_clip_low=clip_low, cispo_eps_clip_high=clip_high),
            loss_reduction=reduction["loss_reduction"],
            max_seq_len=reduction["max_seq_len"],
        )
        scaled = self._scaled(advantages, keep, loss_agg, norm_constant)
        loss, metrics = self._ppo.PolicyLossRegistry.get("cispo")(
            logp, old_logp, scaled, config, loss_mask=keep
        )
        return LossReport(loss, metrics["clip_ratio"])

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
        if estimator not in ("k1", "k2", "k3"):
            raise ValueError(
                f"estimator: skyrl's compute_approx_kl has k1, k2, k3 (and abs), got {estimator!r}"
            )
        keep = _float_mask(mask, logp)
        kl = self._ppo.compute_approx_kl(logp, ref_logp, loss_mask=keep, kl_estimator_type=estimator)
        return self.aggregate_loss(
            kl, mask, loss_agg, norm_constant=norm_constant, token_count=token_count, row_count=row_count
        )

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
        if level not in ("token", "sequence") or mode != "truncate":
            raise ValueError(
                f"level, mode: skyrl 0.4.0's TIS is token or sequence truncation, got {level!r}, {mode!r}"
            )
        if low is not None:
            raise ValueError(
                "low: skyrl 0.4.0's TIS (token/sequence_tis_ratio_clip_high) truncates above only"
            )
        old = logp.detach()
        keep = _float_mask(mask, old)
        cap = {"token_tis_ratio_clip_high": float(high), "sequence_tis_ratio_clip_high": float(high)}
        correction = self._config.OffPolicyCorrectionConfig(tis_ratio_type=level, **cap)
        config = self._algorithm_config(off_policy_correction=correction)
        advantages = torch.ones_like(old, requires_grad=True)
        with torch.enable_grad():
            loss, _ = self._ppo.PolicyLossRegistry.get("regular")(
                old, old, advantages, config, loss_mask=keep, rollout_logprobs=rollout_logp.detach()
            )
            (grad,) = torch.autograd.grad(loss, advantages)
        result: Tensor = -grad
        return result


def _float_mask(mask: Tensor, like: Tensor) -> Tensor:
    return mask.to(like.dtype if like.is_floating_point() else torch.float32)


def _no_counts(token_count: int | Tensor | None, row_count: int | Tensor | None) -> None:
    if token_count is not None or row_count is not None:
        raise ValueError(
            "token_count, row_count: skyrl 0.4.0 scales each mini-batch by its own counts "
            "(apply_loss_reduction_to_advantages_minibatch reads them off the tensors; declared "
            "policy_loss_options without 'counts')"
        )
