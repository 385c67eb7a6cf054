"""The expected side of the checks: the reference functions with an adapter's conventions applied.

:class:`ReferenceVariant` has the adapter contract's op signatures; the suite calls each op of the
adapter and the same op of the variant built from the adapter's declared conventions
(:func:`ppo_ref.adapters.parse_conventions`), and compares them. Every variant op is built from the
:mod:`ppo_ref` functions, with the conventions passed as their keywords
(``masked_whiten(unbiased=)``, ``policy_loss(dual_clip=)``, ``value_loss(clip_form=)``) or applied
to their inputs and outputs (a clamped KL estimate, a moved score, a scaled loss), never a second
copy of a formula; with no convention declared, each op of the variant *is* the reference call.
What the conventions mean (:mod:`ppo_ref.adapters.conventions`) stays in ``ppo_ref``; this module,
which only the suite and its users need, depends on it and never the other way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

import ppo_ref
from ppo_ref.adapters.conventions import (
    ConventionSet,
    VariantGSPOLoss,
    VariantPolicyLoss,
    singleton_rows,
    singleton_rule,
    with_value_slot,
)
from ppo_ref.adapters.conventions.semantics import bool_mask
from ppo_ref.kl import last_action_index

__all__ = ["ReferenceVariant"]


class ReferenceVariant:
    """The reference functions with a :class:`ConventionSet` applied; same op signatures as an adapter.

    With the reference conventions every op is the plain :mod:`ppo_ref` call.
    """

    def __init__(self, conventions: ConventionSet | None = None) -> None:
        self.conventions = conventions or ConventionSet()

    def __repr__(self) -> str:
        return f"ReferenceVariant({self.conventions.deviations()})"

    token_logprobs = staticmethod(ppo_ref.token_logprobs)
    entropy = staticmethod(ppo_ref.entropy)
    masked_mean = staticmethod(ppo_ref.masked_mean)
    ppo_penalty_loss = staticmethod(ppo_ref.ppo_penalty_loss)

    def masked_whiten(self, x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
        """MASK-3; ``whiten_variance='biased'`` is ``ppo_ref.masked_whiten(unbiased=False)``,
        ``whiten_eps`` and ``whiten_eps_placement`` its ``eps`` and ``eps_placement``."""
        return self._whiten(x, mask, shift_mean, self.conventions.whiten_variance)

    def _whiten(self, x: Tensor, mask: Tensor, shift_mean: bool, variance: str) -> Tensor:
        c = self.conventions
        return ppo_ref.masked_whiten(
            x,
            mask,
            shift_mean=shift_mean,
            unbiased=variance == "unbiased",
            eps=c.whiten_eps,
            eps_placement=c.whiten_eps_placement,
        )

    def kl_penalty(
        self, logp: Tensor, ref_logp: Tensor, estimator: str = "k1", mask: Tensor | None = None
    ) -> Tensor:
        """KL-1..3; ``kl_clamp`` clamps the estimate to [-c, c]."""
        kl = ppo_ref.kl_penalty(logp, ref_logp, estimator, mask=mask)
        bound = self.conventions.kl_clamp.get(estimator)
        return kl if bound is None else kl.clamp(-bound, bound)

    def token_rewards(
        self,
        scores: Tensor,
        logp: Tensor,
        ref_logp: Tensor,
        mask: Tensor,
        kl_coef: float,
        estimator: str = "k1",
    ) -> Tensor:
        """RWD-1..3; ``kl_clamp`` clamps the KL term, ``score_placement`` moves the score,
        ``score_clip`` clamps the score to [-c, c] before it is added.

        Both are ``ppo_ref.token_rewards``: a clamped estimate is handed to it as a k1 log-ratio
        against 0 (k1 of (kl, 0) is kl itself), and an ``after-last-action-token`` score is added
        one column after the row's last action token to the rewards of a zero score."""
        c = self.conventions
        if c.score_clip is not None:
            scores = scores.clamp(-c.score_clip, c.score_clip)
        if estimator in c.kl_clamp:
            logp = self.kl_penalty(logp, ref_logp, estimator, mask=mask)
            ref_logp, estimator = torch.zeros_like(logp), "k1"
        if c.score_placement == "last-action-token":
            return ppo_ref.token_rewards(scores, logp, ref_logp, mask, kl_coef, estimator)
        rewards = ppo_ref.token_rewards(torch.zeros_like(scores), logp, ref_logp, mask, kl_coef, estimator)
        keep = bool_mask(mask)
        last = last_action_index(keep)
        target = torch.where(last + 1 < keep.shape[1], last + 1, last)
        rows = torch.nonzero(last >= 0).squeeze(-1)
        return rewards.index_put((rows, target[rows]), scores.to(rewards.dtype)[rows], accumulate=True)

    def gae(
        self,
        rewards: Tensor,
        values: Tensor,
        mask: Tensor,
        gamma: float,
        lam: float,
        last_values: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """GAE-1..4; ``gae_whitening`` whitens the advantages (returns stay raw + values);
        ``value_after_last_action_token='trained'`` runs the reference recursion over the mask plus
        the slot after the last action token, then zeroes the advantage there (its return stays)."""
        trained = self.conventions.value_after_last_action_token == "trained"
        steps = with_value_slot(mask) if trained else mask
        advantages, returns = ppo_ref.gae(rewards, values, steps, gamma, lam, last_values=last_values)
        if trained:
            advantages = torch.where(bool_mask(mask), advantages, torch.zeros((), dtype=advantages.dtype))
        if self.conventions.gae_whitening != "none":
            advantages = self._whiten(advantages, mask, True, self.conventions.gae_whitening)
        return advantages, returns

    def policy_loss(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        clip_eps: float,
        loss_agg: str = "token-mean",
        **options: Any,
    ) -> VariantPolicyLoss:
        """PG-1..6 with ``log_ratio_clamp``, ``dual_clip``, ``clipfrac``, ``approx_kl`` and
        ``unmasked_statistics`` applied; ``options`` are the keywords of ``ppo_ref.policy_loss``
        (``clip_eps_high``, ``dual_clip``, ``norm_constant``, ``token_count``, ``row_count``;
        CLIP-1..3, AGG-1..3), passed through (a declared always-on ``dual_clip`` is the default
        of the keyword)."""
        c = self.conventions
        keep = bool_mask(mask)
        raw_logp = logp
        if c.log_ratio_clamp is not None:  # same graph in logp, clamped: old + clamp(logp - old)
            log_ratio = torch.where(keep, logp - old_logp, torch.zeros((), dtype=logp.dtype))
            logp = old_logp + log_ratio.clamp(-c.log_ratio_clamp, c.log_ratio_clamp)
        options = {k: v for k, v in options.items() if v is not None}
        options.setdefault("dual_clip", c.dual_clip)
        result = ppo_ref.policy_loss(logp, old_logp, advantages, keep, clip_eps, loss_agg=loss_agg, **options)
        loss = result.loss
        clipfrac = {"flat-branch": result.clipfrac, "ratio-outside": result.ratio_outside_frac}.get(
            str(c.clipfrac)
        )
        if clipfrac is not None and c.clipfrac_agg == "seq-mean-token-mean":
            clipfrac = self._clipfrac_per_sequence(logp, old_logp, advantages, keep, clip_eps, options)
        approx_kl = None
        raw = c.log_ratio_clamp is not None and c.log_ratio_clamp_statistics == "raw"
        if c.approx_kl == "k3" and not raw:
            approx_kl = result.approx_kl
        elif c.approx_kl is not None:
            if raw:  # the statistic reads the unclamped log-ratio (log_ratio_clamp_statistics)
                logp = torch.where(keep, raw_logp, old_logp)
            approx_kl = self._approx_kl(logp, old_logp, keep)
        dilution = keep.sum() / max(keep.numel(), 1)
        if clipfrac is not None and "clipfrac" in c.unmasked_statistics:
            clipfrac = clipfrac * dilution
        if approx_kl is not None and "approx_kl" in c.unmasked_statistics:
            approx_kl = approx_kl * dilution
        return VariantPolicyLoss(
            loss,
            clipfrac,
            approx_kl,
            result.ratio_outside_frac,
            result.ratio_mean,
            result.ratio_max,
            result.dual_clip_frac,
        )

    def _clipfrac_per_sequence(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        keep: Tensor,
        clip_eps: float,
        options: Mapping[str, Any],
    ) -> Tensor:
        """``clipfrac_agg='seq-mean-token-mean'``: the reference's clip fraction of each row with an
        action token (``ppo_ref.policy_loss`` on that row alone), averaged over those rows; 0 when
        no row has one."""
        bounds = {k: v for k, v in options.items() if k in ("clip_eps_high", "dual_clip")}
        fractions = []
        for row in range(keep.shape[0]):
            if not bool(keep[row].any()):
                continue
            one = slice(row, row + 1)
            result = ppo_ref.policy_loss(
                logp[one].detach(), old_logp[one], advantages[one], keep[one], clip_eps, **bounds
            )
            flat = self.conventions.clipfrac == "flat-branch"
            fractions.append(result.clipfrac if flat else result.ratio_outside_frac)
        if not fractions:
            return torch.zeros((), dtype=logp.dtype)
        return torch.stack(fractions).mean()

    def value_loss(
        self,
        values: Tensor,
        old_values: Tensor,
        returns: Tensor,
        mask: Tensor,
        clip_eps: float | None = None,
        loss_agg: str | None = None,
        **counts: Any,
    ) -> Tensor:
        """VF-1, VF-2 with ``value_loss_scale``, ``value_clip_form`` and ``value_loss_agg`` applied;
        ``loss_agg`` (None: the declared ``value_loss_agg``) and ``counts`` (``norm_constant``,
        ``token_count``, ``row_count``) as in ``ppo_ref.value_loss`` (AGG-1..3);
        ``value_after_last_action_token='trained'`` adds the slot after each row's last action
        token to the mask."""
        c = self.conventions
        counts = {k: v for k, v in counts.items() if v is not None}
        agg = c.value_loss_agg if loss_agg is None else loss_agg
        if c.value_after_last_action_token == "trained":
            mask = with_value_slot(mask)
        loss = ppo_ref.value_loss(
            values, old_values, returns, mask, clip_eps, agg, clip_form=c.value_clip_form, **counts
        )
        return loss if c.value_loss_scale == 0.5 else loss * (c.value_loss_scale / 0.5)

    # --- the PPO family (GRP, AGG, GSPO, CISPO, KLL, IS) ---

    aggregate_loss = staticmethod(ppo_ref.aggregate_loss)
    kl_loss = staticmethod(ppo_ref.kl_loss)

    def _approx_kl(self, logp: Tensor, old_logp: Tensor, keep: Tensor) -> Tensor:
        """The declared ``approx_kl`` estimate (not k3's default): k1 mean(old - new), neg-k1
        mean(new - old), k2 0.5 mean((new - old)^2), over the action tokens."""
        estimate = self.conventions.approx_kl
        # kl_penalty(a, b, k) estimates from b - a: k1 old - new, neg-k1 new - old
        first, second = (logp, old_logp) if estimate in ("k2", "neg-k1") else (old_logp, logp)
        estimator = "k1" if estimate == "neg-k1" else str(estimate)
        per_token = ppo_ref.kl_penalty(first.detach(), second.detach(), estimator, mask=keep)
        return ppo_ref.masked_mean(per_token, keep)

    def gspo_loss(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip_eps: float, **kwargs: Any
    ) -> VariantGSPOLoss:
        """GSPO-1..3 with ``gspo_clipfrac='tokens'`` (the clip fraction weights each clipped sequence
        by its action tokens: per row, the reference's 0/1 clip fraction of that row alone) and the
        declared ``approx_kl`` estimate (GSPO-3's approx_kl is PG-5's; None: not reported)."""
        reference = ppo_ref.gspo_loss(logp, old_logp, advantages, mask, clip_eps, **kwargs)
        c = self.conventions
        approx_kl: Tensor | None = reference.approx_kl
        if c.approx_kl != "k3":
            approx_kl = None if c.approx_kl is None else self._approx_kl(logp, old_logp, mask != 0)
        result = VariantGSPOLoss(
            reference.loss, reference.clipfrac, reference.ratio_mean, reference.ratio_max, approx_kl
        )
        if c.gspo_clipfrac == "sequences":
            return result
        bounds = {k: v for k, v in kwargs.items() if k == "clip_eps_high"}
        tokens = (mask != 0).sum(dim=1)
        clipped = torch.zeros((), dtype=result.clipfrac.dtype)
        for row in range(mask.shape[0]):
            if int(tokens[row]) > 0:
                one = slice(row, row + 1)
                alone = ppo_ref.gspo_loss(
                    logp[one].detach(), old_logp[one], advantages[one], mask[one], clip_eps, **bounds
                )
                clipped = clipped + alone.clipfrac * tokens[row]
        return replace(result, clipfrac=clipped / tokens.sum().clamp(min=1))

    rollout_correction = staticmethod(ppo_ref.rollout_correction)

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
        """GRP-1..4 with ``group_std_eps`` (a fixed epsilon replaces ``eps``) and ``group_singleton``
        (per method: a group of one has its mean read as 0 and its std as 1, or NaN from 0/0 where
        the formula divides by n - 1). ``constant_groups`` changes no value (a constant group still
        gets exactly 0 here); it widens the suite's check of such groups to the rounding bound."""
        c = self.conventions
        epsilon = eps if c.group_std_eps is None else c.group_std_eps
        advantages = ppo_ref.group_advantages(
            scores, group_ids, method, std_scope=std_scope, eps=epsilon, singleton=singleton
        )
        rule = singleton_rule(c.group_singleton, method)
        if rule == "zero" or singleton != "zero":
            return advantages
        alone = singleton_rows(group_ids)
        raw = scores.to(advantages.dtype)
        if rule == "unguarded":
            if method != "rloo" and (method, std_scope) != ("grpo", "group"):
                return advantages  # no division by n - 1 there: r - mean of one is 0
            value = torch.full_like(raw, math.nan)
        elif method == "grpo" and std_scope == "group":
            value = raw / (1.0 + epsilon)
        elif method == "grpo" and std_scope == "batch":
            spread = raw.std() if raw.numel() > 1 else torch.zeros((), dtype=raw.dtype)
            value = raw / (spread + epsilon)  # (r - 0) / (the batch's std + eps)
        else:
            value = raw
        return torch.where(alone, value, advantages)

    def cispo_loss(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        clip_low: float,
        clip_high: float,
        loss_agg: str = "token-mean",
        **counts: Any,
    ) -> Any:
        """CISPO-1, CISPO-2; ``cispo_bounds='absolute-cap'`` reads ``clip_high`` as the cap itself
        (the reference offsets clip_low = 1, clip_high - 1: no lower bound, cap at clip_high)."""
        if self.conventions.cispo_bounds == "absolute-cap":
            clip_low, clip_high = 1.0, clip_high - 1.0
        return ppo_ref.cispo_loss(logp, old_logp, advantages, mask, clip_low, clip_high, loss_agg, **counts)
