"""skyrl-train 0.3.1's PPO-family ops under the conformance suite (issue 14): mixed into ``SkyRLAdapter``.

Every op calls the skyrl-train function its trainer calls (``family_sources`` names each with its
file and line); the adapter only converts arguments the way skyrl's trainer does:

- ``group_advantages`` is ``compute_advantages_and_returns`` (the trainer's entry: it looks the
  estimator up in ``AdvantageEstimatorRegistry``) with the scores as one-column
  ``token_level_rewards``, a one-column ``response_mask`` and the group ids as ``index``;
  ``grpo`` with ``grpo_norm_by_std=True``, ``dr_grpo`` (and ``grpo`` with ``std_scope='none'``)
  with ``grpo_norm_by_std=False``, ``rloo``. Its default ``epsilon`` 1e-6 (the trainer passes
  none: declared ``group_std_eps``).
- ``aggregate_loss`` is ``reduce_loss``, and the losses reduce with it through the config's
  ``loss_reduction``: ``token-mean``
  -> ``token_mean``, ``seq-mean-token-mean`` -> ``sequence_mean``, ``seq-mean-token-sum-norm`` ->
  ``seq_mean_token_sum_norm`` with ``max_seq_len = norm_constant``, ``seq-mean-token-sum`` ->
  ``seq_mean_token_sum_norm`` with ``max_seq_len = 1``. skyrl-train 0.3.1 reduces each micro-batch
  on its own (no whole-batch counts; SkyRL PR #925 came later), so ``token_count`` and
  ``row_count`` are not provided.
- ``gspo_loss`` is ``PolicyLossRegistry.get('gspo')`` with ``loss_reduction='sequence_mean'`` (the
  reduction its docstring and warning ask for) and the sequence advantage on every token.
- ``cispo_loss`` is ``PolicyLossRegistry.get('cispo')`` with ``cispo.cispo_eps_clip_low =
  clip_low`` and ``cispo_eps_clip_high = clip_high`` (offsets).
- ``kl_loss`` is ``compute_approx_kl(..., loss_mask=mask, kl_estimator_type=...)`` then
  ``reduce_loss``; the trainer (``workers/worker.py``) reduces it with
  ``masked_mean(kl, loss_mask, dim=-1).mean()``, which is ``reduce_loss``'s ``sequence_mean``.
- ``rollout_correction`` reads the TIS weight ``ppo_policy_loss`` multiplies the per-token loss by
  (``use_tis=True``, ``tis_imp_ratio_cap = high``): the loss is called with ``log_probs =
  old_log_probs = logp`` (ratio 1), advantages 1 and ``token_mean``, so it is ``-sum_t w_t / N``
  and the weights are ``-N`` times its gradient in the advantages. Token level, truncation above
  only: that is all 0.3.1 has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType, ModuleType
from typing import Any

import torch
from torch import Tensor

from ppo_ref.adapters.thirdparty._common import library_location as _where

__all__ = [
    "FAMILY_CONVENTIONS",
    "FAMILY_CONVENTION_SOURCES",
    "FAMILY_NOT_PROVIDED",
    "REDUCTIONS",
    "SkyRLFamilyOps",
    "reduction_config",
]

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
        "correction_levels": ["token"],
        "correction_modes": ["truncate"],
        "correction_bounds": [],
    }
)
"""skyrl-train's declared PPO-family conventions (sources in FAMILY_CONVENTION_SOURCES); the
capability keys ``loss_aggregations`` and ``policy_loss_options`` are declared in ``skyrl.py``."""

FAMILY_CONVENTION_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "group_methods": "skyrl_train/utils/ppo_utils.py compute_grpo_outcome_advantage "
        "(grpo_norm_by_std=False is Dr. GRPO) and compute_rloo_outcome_advantage, through "
        "compute_advantages_and_returns",
        "group_std_scopes": "skyrl_train/utils/ppo_utils.py compute_grpo_outcome_advantage divides by the "
        "group's torch.std or not at all (grpo_norm_by_std); no batch-std scaling",
        "group_std_eps": "skyrl_train/utils/ppo_utils.py compute_grpo_outcome_advantage(..., "
        "epsilon=1e-6); the trainer never passes epsilon",
        "group_singleton": "skyrl_train/utils/ppo_utils.py compute_grpo_outcome_advantage: a group of one "
        "gets mean 0 and std 1, so A = r / (1 + eps) (and r with grpo_norm_by_std=False); "
        "compute_rloo_outcome_advantage gives 0 (declared per method)",
        "constant_groups": "skyrl_train/utils/ppo_utils.py compute_grpo_outcome_advantage: scores - "
        "torch.mean(group); compute_rloo_outcome_advantage: (scores - mean) * n / (n - 1); no special "
        "case, so a constant group keeps the mean's rounding (three scores of 0.1: -1.39e-17)",
        "cispo_bounds": "skyrl_train/utils/ppo_utils.py compute_policy_loss_cispo: clamp(ratio, 1 - "
        "cispo_eps_clip_low, 1 + cispo_eps_clip_high); 0.3.1's config defaults 0 and 5 give [1, 6] "
        "(docs/findings-family.md)",
        "kl_loss_estimators": "skyrl_train/utils/ppo_utils.py compute_approx_kl: kl_estimator_type k1, k2, "
        "k3, abs; no straight-through k3+",
        "correction_levels": "skyrl_train/utils/ppo_utils.py ppo_policy_loss: use_tis multiplies the loss "
        "by the token ratio exp(old_log_probs - rollout_logprobs) clamped at tis_imp_ratio_cap; no "
        "sequence level in 0.3.1",
        "correction_modes": "skyrl_train/utils/ppo_utils.py ppo_policy_loss: TIS (clamp max) only; no "
        "masking mode, no lower bound",
        "correction_bounds": "skyrl_train/utils/ppo_utils.py ppo_policy_loss: clamp(tis_imp_ratio, "
        "max=tis_imp_ratio_cap), no floor; no mask mode",
    }
)

FAMILY_NOT_PROVIDED: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class SequenceLossResult:
    """A skyrl policy loss and its ``clip_ratio`` (a token share); skyrl reports no approx-KL."""

    loss: Tensor
    clipfrac: float
    approx_kl: None = None


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
    """The family ops; ``SkyRLAdapter`` supplies ``_ppo`` (ppo_utils) and ``_omegaconf`` (OmegaConf)."""

    _ppo: ModuleType
    _omegaconf: Any

    def family_sources(self) -> tuple[dict[str, str], dict[str, str]]:
        """(op -> skyrl-train function it calls, op -> why not provided)."""
        ppo = self._ppo
        registry = ppo.PolicyLossRegistry
        sources = {
            "group_advantages": f"{_where(ppo.compute_advantages_and_returns)} -> "
            f"{_where(ppo.compute_grpo_outcome_advantage)} (grpo, dr_grpo), "
            f"{_where(ppo.compute_rloo_outcome_advantage)} (rloo)",
            "aggregate_loss": _where(ppo.reduce_loss),
            "gspo_loss": _where(registry.get("gspo")) + " via PolicyLossRegistry.get('gspo'), sequence_mean",
            "cispo_loss": _where(registry.get("cispo")) + " via PolicyLossRegistry.get('cispo')",
            "kl_loss": f"{_where(ppo.compute_approx_kl)} then {_where(ppo.reduce_loss)}",
            "rollout_correction": _where(registry.get("regular"))
            + " with use_tis: the weights it multiplies the loss by, read as the gradient",
        }
        return sources, dict(FAMILY_NOT_PROVIDED)

    def _algorithm_config(self, **fields: Any) -> Any:
        base: dict[str, Any] = {
            "policy_loss_type": "regular",
            "loss_reduction": "token_mean",
            "max_seq_len": None,
            "eps_clip_low": 0.2,
            "eps_clip_high": 0.2,
            "clip_ratio_c": 3.0,
            "use_tis": False,
            "tis_imp_ratio_cap": -1.0,
            "cispo": {"cispo_eps_clip_low": 0.0, "cispo_eps_clip_high": 5.0},
        }
        return self._omegaconf.create({**base, **fields})

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
            config=None,
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
        reduction = reduction_config(loss_agg, norm_constant)
        result: Tensor = self._ppo.reduce_loss(
            per_token, _float_mask(mask, per_token), reduction["loss_reduction"], reduction["max_seq_len"]
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
    ) -> SequenceLossResult:
        _no_counts(None, row_count)
        keep = _float_mask(mask, logp)
        config = self._algorithm_config(
            policy_loss_type="gspo",
            loss_reduction="sequence_mean",
            eps_clip_low=clip_eps,
            eps_clip_high=clip_eps if clip_eps_high is None else clip_eps_high,
        )
        loss, clip_ratio = self._ppo.PolicyLossRegistry.get("gspo")(
            logp, old_logp, advantages.unsqueeze(-1) * keep, config, loss_mask=keep
        )
        return SequenceLossResult(loss, clip_ratio)

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
    ) -> SequenceLossResult:
        _no_counts(token_count, row_count)
        config = self._algorithm_config(
            policy_loss_type="cispo",
            cispo={"cispo_eps_clip_low": clip_low, "cispo_eps_clip_high": clip_high},
            **reduction_config(loss_agg, norm_constant),
        )
        loss, clip_ratio = self._ppo.PolicyLossRegistry.get("cispo")(
            logp, old_logp, advantages, config, loss_mask=_float_mask(mask, logp)
        )
        return SequenceLossResult(loss, clip_ratio)

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
        if level != "token" or mode != "truncate":
            raise ValueError(
                f"level, mode: skyrl-train 0.3.1 has token-level TIS only, got {level!r}, {mode!r}"
            )
        if low is not None:
            raise ValueError("low: skyrl-train 0.3.1's TIS (tis_imp_ratio_cap) truncates above only")
        old = logp.detach()
        keep = _float_mask(mask, old)
        config = self._algorithm_config(use_tis=True, tis_imp_ratio_cap=float(high))
        advantages = torch.ones_like(old, requires_grad=True)
        with torch.enable_grad():
            loss, _ = self._ppo.PolicyLossRegistry.get("regular")(
                old, old, advantages, config, loss_mask=keep, rollout_logprobs=rollout_logp.detach()
            )
            (grad,) = torch.autograd.grad(loss, advantages)
        tokens = keep.sum().clamp(min=1.0)
        result: Tensor = -grad * tokens
        return result


def _float_mask(mask: Tensor, like: Tensor) -> Tensor:
    return mask.to(like.dtype if like.is_floating_point() else torch.float32)


def _no_counts(token_count: int | Tensor | None, row_count: int | Tensor | None) -> None:
    if token_count is not None or row_count is not None:
        raise ValueError(
            "token_count, row_count: skyrl-train 0.3.1 reduces each micro-batch on its own (no whole-batch "
            "counts; declared policy_loss_options without 'counts')"
        )
