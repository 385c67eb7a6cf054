"""OpenRLHF 0.11.2's PPO-family ops under the conformance suite (issue 14): mixed into ``OpenRLHFAdapter``.

Every op runs OpenRLHF's own code (``family_sources`` names each function or pinned block with its
file and line); the adapter only converts arguments the way OpenRLHF's trainer does:

- ``group_advantages`` runs the exact baseline lines of
  ``RemoteExperienceMaker.compute_advantages_and_returns`` (inline there, pinned by content with
  :mod:`._inline`): the estimators ``group_norm`` (``grpo``, std + 1e-9), ``dr_grpo`` (also
  ``grpo`` with ``std_scope='none'``) and ``rloo``. OpenRLHF lays the scores out as
  ``(prompts, n_samples_per_prompt)``, every group of one size ``n``; the adapter stacks the groups
  of each size into that layout, binds ``args.rollout.n_samples_per_prompt = n`` and runs the block
  once per size, then puts the rows back in their order. Groups of one are what the lines give
  (``train_ppo_ray.py`` refuses ``n_samples_per_prompt = 1`` for these estimators).
- the loss ops take the counts the way ``PPOActor`` passes ``get_loss_batch_info``'s result:
  ``token_count`` is ``batch_num_tokens``, ``row_count`` is ``global_batch_size`` (``dp_size`` 1).
  OpenRLHF has no ``seq-mean-token-sum(-norm)`` mode, so ``norm_constant`` is never accepted.
- ``aggregate_loss`` is ``openrlhf.models.loss.aggregate_loss`` with
  ``token_level_loss = (loss_agg == 'token-mean')``, as ``--actor.loss_agg_mode`` maps it.
- ``gspo_loss`` is ``PolicyLoss(policy_loss_type='gspo')`` (which forces the sequence-level
  reduction) with the sequence advantage on every action token (the group estimators' returns
  with gamma 1 and no KL term).
- ``kl_loss`` is ``compute_approx_kl`` on log-probs multiplied by the mask (``Actor.forward``
  returns them so) and then ``aggregate_loss``; ``k3+`` is ``kl_estimator='k3'`` with
  ``unbiased_gradient=True`` (``--algo.kl.unbiased_gradient``) on-policy (``log_probs_old`` None,
  so its importance weight is 1): the k3 value with the k2 gradient.
- ``rollout_correction`` reads the weights ``PolicyLoss.forward`` multiplies the per-token loss
  by (``is_correction_level='token'``, gating ``ratio``; ``mode='mask'`` is ICEPOP, ``'truncate'``
  the ``clip`` mode, threshold ``[low, high]`` with ``low`` 0 when not given, as
  ``train_ppo_ray.py`` inserts for a single threshold). It calls the loss with
  ``log_probs = old_log_probs = logp`` (ratio 1, so no PPO clip binds), advantages 1 and
  ``batch_num_tokens = 1``: the loss is then ``-sum_t coef_t``, and the weights are minus its
  gradient in the advantages. OpenRLHF's ``seq`` level gates on the geometric mean but keeps each
  surviving token's own weight, which is none of the contract's levels: not provided.
- ``cispo_loss``: OpenRLHF has no CISPO.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType, ModuleType, SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from ppo_ref.adapters.base import LossReport
from ppo_ref.adapters.thirdparty._common import library_location as _where
from ppo_ref.adapters.thirdparty._inline import InlineBlock, LocatedBlock, locate

__all__ = [
    "BASELINE_BLOCK",
    "FAMILY_CONVENTIONS",
    "FAMILY_CONVENTION_SOURCES",
    "FAMILY_NOT_PROVIDED",
    "OpenRLHFFamilyOps",
]

BASELINE_BLOCK = InlineBlock(
    "openrlhf.trainer.ppo_utils.experience_maker",
    "RemoteExperienceMaker.compute_advantages_and_returns",
    'if args.algo.advantage.estimator == "rloo":',
    "rewards = rewards - rewards.mean()",
    "01f6322b94822d58",
)
"""The estimators' baseline lines of ``compute_advantages_and_returns`` (rloo, dr_grpo, group_norm)."""

ESTIMATORS: Mapping[str, str] = MappingProxyType({"grpo": "group_norm", "dr_grpo": "dr_grpo", "rloo": "rloo"})
"""Contract method -> OpenRLHF's ``--algo.advantage.estimator``."""

FAMILY_CONVENTIONS: Mapping[str, object] = MappingProxyType(
    {
        "group_methods": ["grpo", "dr_grpo", "rloo"],
        "group_std_scopes": ["group", "none"],
        "group_std_eps": 1e-9,
        "group_singleton": "unguarded",
        "constant_groups": "rounding",
        "gspo_clipfrac": "tokens",
        "kl_loss_estimators": ["k1", "k2", "k3", "k3+"],
        "correction_levels": ["token"],
        "correction_modes": ["truncate", "mask"],
    }
)
"""OpenRLHF's declared PPO-family conventions (sources in FAMILY_CONVENTION_SOURCES); the capability
keys ``loss_aggregations`` and ``policy_loss_options`` are declared in ``openrlhf.py``."""

FAMILY_CONVENTION_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "group_methods": "openrlhf/trainer/ppo_utils/experience_maker.py compute_advantages_and_returns: "
        "--algo.advantage.estimator group_norm, dr_grpo, rloo (also reinforce_baseline = dr_grpo's "
        "baseline then batch whitening, flash_reinforce = batch mean)",
        "group_std_scopes": "openrlhf/trainer/ppo_utils/experience_maker.py: group_norm divides by the "
        "group's rewards.std(-1); dr_grpo does not divide; no batch-std scaling",
        "group_std_eps": "openrlhf/trainer/ppo_utils/experience_maker.py group_norm: (rewards - mean) / "
        "(rewards.std(-1, keepdim=True) + 1e-9)",
        "group_singleton": "rloo divides by n_samples_per_prompt - 1 and group_norm by a one-sample std "
        "(NaN); train_ppo_ray.py asserts n_samples_per_prompt > 1 for these estimators, so the trainer "
        "never forms a group of one (dr_grpo's lone sample gets r - r = 0)",
        "constant_groups": "openrlhf/trainer/ppo_utils/experience_maker.py: rloo `baseline = "
        "(rewards.sum(-1, keepdim=True) - rewards) / (n_samples_per_prompt - 1)`, dr_grpo and group_norm "
        "rewards - rewards.mean(-1); no special case, so a constant group keeps the sum's rounding (three "
        "scores of 0.1: -1.39e-17)",
        "gspo_clipfrac": "openrlhf/models/loss.py:257 PolicyLoss.forward: clip_ratio = "
        "masked_mean(torch.lt(surr2, surr1), action_mask), a share of tokens also for "
        "policy_loss_type='gspo' (logged as ppo_clip_ratio), the statistic the GSPO paper reports "
        "(arXiv 2507.18071, section 5.3)",
        "kl_loss_estimators": "openrlhf/models/utils.py compute_approx_kl: kl_estimator k1, k2, k3; "
        "unbiased_gradient=True keeps the value and takes the gradient of w * k2 (w = 1 on-policy): k3+",
        "correction_levels": "openrlhf/models/loss.py PolicyLoss.forward: is_correction_level 'token'; "
        "'seq' gates on the geometric-mean ratio but weights survivors by their own token ratio, none of "
        "the contract's levels",
        "correction_modes": "openrlhf/models/loss.py PolicyLoss.forward: is_correction_mode 'clip' (clamp "
        "to [low, high]: TIS) and 'mask' (ICEPOP: zero outside [low, high])",
    }
)

FAMILY_NOT_PROVIDED: Mapping[str, str] = MappingProxyType(
    {"cispo_loss": "OpenRLHF 0.11.2 has no CISPO loss (--actor.policy_loss_type is ppo or gspo)"}
)


def loss_batch_info(token_count: int | Tensor | None, row_count: int | Tensor | None) -> dict[str, Any]:
    """The keywords ``PPOActor`` passes to the losses (``get_loss_batch_info``), from the counts."""
    return {"batch_num_tokens": token_count, "global_batch_size": row_count}


def _no_norm(norm_constant: float | None) -> None:
    if norm_constant is not None:
        raise ValueError("norm_constant: OpenRLHF has no seq-mean-token-sum-norm mode")


class OpenRLHFFamilyOps:
    """The family ops; ``OpenRLHFAdapter`` supplies ``_loss`` (models.loss) and ``_utils`` (models.utils)."""

    _loss: ModuleType
    _utils: ModuleType
    _baseline: LocatedBlock

    def family_sources(self) -> tuple[dict[str, str], dict[str, str]]:
        """(op -> OpenRLHF code it runs, op -> why not provided); locates the pinned block."""
        self._baseline = locate(BASELINE_BLOCK)
        loss = self._loss
        sources = {
            "group_advantages": f"{BASELINE_BLOCK.owner} lines {self._baseline.where()} (pinned by content: "
            f"{BASELINE_BLOCK.digest}), once per group size",
            "aggregate_loss": _where(loss.aggregate_loss),
            "gspo_loss": _where(loss.PolicyLoss.forward) + " with policy_loss_type='gspo'",
            "kl_loss": f"{_where(self._utils.compute_approx_kl)} then {_where(loss.aggregate_loss)}",
            "rollout_correction": _where(loss.PolicyLoss.forward)
            + " is_correction_level='token': the weights it multiplies the loss by, read as the gradient",
        }
        return sources, dict(FAMILY_NOT_PROVIDED)

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
        del eps  # group_norm's 1e-9 is written in the line (declared group_std_eps)
        if singleton != "zero":
            raise ValueError(f"singleton: OpenRLHF has no {singleton!r} mode")
        if method not in ESTIMATORS:
            raise ValueError(f"method: expected one of {sorted(ESTIMATORS)}, got {method!r}")
        if method == "grpo" and std_scope == "batch":
            raise ValueError("std_scope: OpenRLHF has no batch-std scaling (declared group_std_scopes)")
        estimator = "dr_grpo" if method == "grpo" and std_scope == "none" else ESTIMATORS[method]
        raw = scores.detach()
        rewards = raw.to(torch.promote_types(raw.dtype, torch.float32))  # as compute_advantages_and_returns
        out = torch.empty_like(rewards)
        _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
        for size in torch.unique(counts).tolist():
            groups = torch.nonzero(counts == size).squeeze(-1)
            rows = torch.cat([torch.nonzero(inverse == g).squeeze(-1) for g in groups.tolist()])
            args = SimpleNamespace(
                algo=SimpleNamespace(advantage=SimpleNamespace(estimator=estimator)),
                rollout=SimpleNamespace(n_samples_per_prompt=int(size)),
            )
            namespace = self._baseline.run(args=args, rewards=rewards[rows].reshape(-1, int(size)))
            out[rows] = namespace["rewards"].reshape(-1)
        return out

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
        _no_norm(norm_constant)
        if loss_agg not in ("token-mean", "seq-mean-token-mean"):
            raise ValueError(f"loss_agg: OpenRLHF has token-mean and seq-mean-token-mean, got {loss_agg!r}")
        keep = mask.to(per_token.dtype if per_token.is_floating_point() else torch.float32)
        result: Tensor = self._loss.aggregate_loss(
            per_token,
            keep,
            token_level_loss=loss_agg == "token-mean",
            **loss_batch_info(token_count, row_count),
        )
        return result

    # --- GSPO ---

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
        keep = mask.to(logp.dtype)
        loss_fn = self._loss.PolicyLoss(
            clip_eps_low=clip_eps,
            clip_eps_high=clip_eps if clip_eps_high is None else clip_eps_high,
            policy_loss_type="gspo",
        )
        loss, clip_ratio, ppo_kl, _vllm_kl, _filtered = loss_fn(
            logp,
            old_logp,
            advantages.unsqueeze(-1) * keep,
            action_mask=keep,
            **loss_batch_info(None, row_count),
        )
        return LossReport(loss, clip_ratio, ppo_kl)

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
        _no_norm(norm_constant)
        keep = mask.to(logp.dtype)
        straight_through = estimator == "k3+"
        kl = self._utils.compute_approx_kl(
            logp * keep,
            ref_logp * keep,
            kl_estimator="k3" if straight_through else estimator,
            unbiased_gradient=straight_through,
        )
        return self.aggregate_loss(kl, mask, loss_agg, token_count=token_count, row_count=row_count)

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
        if level != "token":
            raise ValueError(f"level: OpenRLHF's ratio weights are token-level (declared), got {level!r}")
        if mode not in ("truncate", "mask"):
            raise ValueError(f"mode: expected 'truncate' or 'mask', got {mode!r}")
        loss_fn = self._loss.PolicyLoss(
            is_correction_level="token",
            is_correction_mode="clip" if mode == "truncate" else "mask",
            is_correction_gating="ratio",
            is_correction_threshold=[0.0 if low is None else float(low), float(high)],
        )
        old = logp.detach()
        keep = mask.to(old.dtype)
        advantages = torch.ones_like(old, requires_grad=True)
        with torch.enable_grad():
            loss, *_ = loss_fn(
                old,
                old,
                advantages,
                action_mask=keep,
                rollout_log_probs=rollout_logp.detach(),
                batch_num_tokens=1,
            )
            (grad,) = torch.autograd.grad(loss, advantages)
        return -grad
