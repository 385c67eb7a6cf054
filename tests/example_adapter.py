"""Example adapters for the adapter-registry and conformance-CLI tests.

``make_adapter`` builds an adapter the way a third-party library would: it wraps functions (here
ppo-ref's own) and declares one documented convention, the clip fraction counted as the share of
tokens with the ratio outside [1 - eps, 1 + eps] (as torchrl and stable-baselines3 do), which it
computes itself. It leaves out ``entropy`` and ``ppo_penalty_loss``, so the report shows those
clauses as not provided. ``make_wrong_adapter`` computes the same clip fraction but misspells the
convention key, so the deviation is undeclared: the suite fails the contract, and its inference
(issue 20) finds the undeclared clip-fraction convention for PG-3. ``make_planted_adapter`` has two
undeclared conventions (biased whitening, a value loss without the 1/2) and one bug (k3 with the
ratio the wrong way up): the suite must name both keys and fail only the bug.
``make_empty_row_adapter`` divides by the row's token count without a guard (NaN for a row without
action tokens): right on every input a single-turn pipeline produces, so the suite must report
only edge FAILs, unless the adapter declares ``edge_inputs = ["empty_rows"]``
(``make_empty_row_adapter_declared``), when they are value FAILs (issue 20).
``make_countless_aggregation_adapter`` has an ``aggregate_loss`` without the count keywords: the
tests that need them are "not provided" (issue 28).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import Tensor

import ppo_ref

__all__ = [
    "ADAPTER",
    "CountlessAggregationAdapter",
    "EmptyRowAdapter",
    "ExampleAdapter",
    "PlantedAdapter",
    "PolicyLossOutput",
    "make_adapter",
    "make_countless_aggregation_adapter",
    "make_empty_row_adapter",
    "make_empty_row_adapter_declared",
    "make_planted_adapter",
    "make_wrong_adapter",
]


@dataclass(frozen=True)
class PolicyLossOutput:
    loss: Tensor
    clipfrac: Tensor
    approx_kl: Tensor


class ExampleAdapter:
    """Duck-typed: no base class, just the attributes of ``ppo_ref.adapters.Adapter``."""

    version = ppo_ref.__version__
    provenance = "ppo_ref.<op> for every op; clipfrac recomputed as the share with |ratio - 1| > eps"
    ops = frozenset(
        {
            "token_logprobs",
            "masked_mean",
            "masked_whiten",
            "kl_penalty",
            "token_rewards",
            "gae",
            "policy_loss",
            "value_loss",
        }
    )

    def __init__(self, name: str, conventions: Mapping[str, object]) -> None:
        self.name = name
        self.conventions = MappingProxyType(dict(conventions))

    token_logprobs = staticmethod(ppo_ref.token_logprobs)
    masked_mean = staticmethod(ppo_ref.masked_mean)
    masked_whiten = staticmethod(ppo_ref.masked_whiten)
    kl_penalty = staticmethod(ppo_ref.kl_penalty)
    token_rewards = staticmethod(ppo_ref.token_rewards)
    gae = staticmethod(ppo_ref.gae)
    value_loss = staticmethod(ppo_ref.value_loss)

    @staticmethod
    def policy_loss(
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        clip_eps: float,
        loss_agg: str = "token-mean",
    ) -> PolicyLossOutput:
        result = ppo_ref.policy_loss(logp, old_logp, advantages, mask, clip_eps, loss_agg=loss_agg)
        keep = mask != 0
        log_ratio = torch.where(keep, logp.detach() - old_logp, torch.zeros((), dtype=logp.dtype))
        outside = (log_ratio.exp() - 1.0).abs() > clip_eps
        clipfrac = ppo_ref.masked_mean(outside.to(log_ratio.dtype), keep)
        return PolicyLossOutput(loss=result.loss, clipfrac=clipfrac, approx_kl=result.approx_kl)


def make_adapter() -> ExampleAdapter:
    """The example adapter, declaring its clip-fraction convention."""
    return ExampleAdapter("example", {"clipfrac": "ratio-outside"})


def make_wrong_adapter() -> ExampleAdapter:
    """The same computation with the convention key misspelt: an undeclared deviation."""
    return ExampleAdapter("example-wrong", {"clipfrac_definition": "ratio-outside"})


ADAPTER = make_adapter()
"""An adapter object (not a factory), for ``--impl=tests.example_adapter:ADAPTER``."""


class PlantedAdapter(ExampleAdapter):
    """The example adapter with two conventions it does not declare and one bug."""

    provenance = (
        "ExampleAdapter with masked_whiten biased (1/n variance), value_loss without the 1/2, and "
        "kl_penalty's k3 computed from the inverted ratio (a bug)"
    )

    @staticmethod
    def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
        """Convention 1, undeclared: whiten_variance='biased'."""
        return ppo_ref.masked_whiten(x, mask, shift_mean=shift_mean, unbiased=False)

    @staticmethod
    def value_loss(
        values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip_eps: float | None = None
    ) -> Tensor:
        """Convention 2, undeclared: value_loss_scale=1.0 (no 1/2)."""
        return 2.0 * ppo_ref.value_loss(values, old_values, returns, mask, clip_eps)

    @staticmethod
    def kl_penalty(
        logp: Tensor, ref_logp: Tensor, estimator: str = "k1", mask: Tensor | None = None
    ) -> Tensor:
        """The bug: k3 = exp(logp - ref) - 1 - (logp - ref), the ratio the wrong way up (trlx)."""
        if estimator != "k3":
            return ppo_ref.kl_penalty(logp, ref_logp, estimator, mask=mask)
        keep = torch.ones_like(logp, dtype=torch.bool) if mask is None else mask != 0
        delta = torch.where(keep, logp - ref_logp, torch.zeros((), dtype=logp.dtype))
        return delta.exp() - 1.0 - delta


def make_planted_adapter() -> PlantedAdapter:
    """Two undeclared conventions and one bug; declares the clip-fraction convention as
    :func:`make_adapter` does."""
    return PlantedAdapter("example-planted", {"clipfrac": "ratio-outside"})


class EmptyRowAdapter(ExampleAdapter):
    """The example adapter whose ``masked_mean`` divides by the count unguarded for a row or the whole
    batch: 0/0 = NaN on a row or batch without action tokens (bug catalogue E2), exact wherever every
    row has one (its per-column mean guards the count: right padding makes empty columns)."""

    provenance = "ExampleAdapter with masked_mean = sum(where(mask, x, 0)) / mask.sum(), no guard for 0"

    @staticmethod
    def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
        keep = mask != 0
        dtype = torch.promote_types(x.dtype, torch.float32)
        total = torch.where(keep, x, torch.zeros((), dtype=x.dtype)).to(dtype)
        if dim is None:  # NaN for a batch without action tokens
            return total.sum() / keep.sum()
        counts = keep.sum(dim)
        if dim % x.dim() == 0:  # per column: a column of padding is 0 (every padded batch has one)
            counts = counts.clamp(min=1)
        return total.sum(dim) / counts  # per row: NaN for a row without action tokens


def make_empty_row_adapter() -> EmptyRowAdapter:
    """No edge input declared: its NaN on empty rows is an edge FAIL."""
    return EmptyRowAdapter("example-empty-row", {"clipfrac": "ratio-outside"})


def make_empty_row_adapter_declared() -> EmptyRowAdapter:
    """Declares that its pipeline makes rows without action tokens: the same NaN is a value FAIL."""
    return EmptyRowAdapter("example-empty-row", {"clipfrac": "ratio-outside", "edge_inputs": ["empty_rows"]})


class CountlessAggregationAdapter(ExampleAdapter):
    """The example adapter with an ``aggregate_loss`` that reduces one batch at a time, as a newcomer
    wraps a library function without count keywords (ms-swift's ``_sdar_agg_loss``): the counts tests
    must be "not provided" (its signature lacks the keywords), not FAILs with a TypeError (issue 28)."""

    provenance = "ppo_ref.masked_mean, and aggregate_loss(per_token, mask, loss_agg) only"
    ops = frozenset({"masked_mean", "aggregate_loss"})  # no policy_loss: only aggregate_loss's keywords count

    @staticmethod
    def aggregate_loss(per_token: Tensor, mask: Tensor, loss_agg: str = "token-mean") -> Tensor:
        return ppo_ref.aggregate_loss(per_token, mask, loss_agg)


def make_countless_aggregation_adapter() -> CountlessAggregationAdapter:
    """Declares the clip-fraction convention only (no ``policy_loss_options``: inferred)."""
    return CountlessAggregationAdapter("example-countless", {"clipfrac": "ratio-outside"})


class Float32FixedEpsGroupAdapter(ExampleAdapter):
    """The example adapter with a ``group_advantages`` that, like ms-swift 4.6.0's, computes in float32
    and divides by std + a fixed 1e-4 whatever ``eps`` is passed (issue 28): neither ``compute_dtype``
    nor ``group_std_eps`` alone makes its GRPO cases pass, both together do."""

    provenance = "ppo_ref.masked_mean, and a float32 GRPO advantage with std + 1e-4 (grpo/group only)"
    ops = frozenset({"masked_mean", "group_advantages"})

    @staticmethod
    def group_advantages(
        scores: Tensor,
        group_ids: Tensor,
        method: str = "grpo",
        *,
        std_scope: str = "group",
        eps: float = 1e-6,
        singleton: str = "zero",
    ) -> Tensor:
        if std_scope != "group" or singleton != "zero":
            raise ValueError(f"std_scope/singleton: group and zero only, got {std_scope!r}, {singleton!r}")
        rewards = scores.to(torch.float32)
        out = torch.zeros_like(rewards)
        for gid in torch.unique(group_ids):  # as ms-swift's compute_advantages_dynamic, in float32
            rows = group_ids == gid
            group = rewards[rows]
            size = len(group)
            centred = group - group.mean()
            if method == "grpo":
                std = group.std() if size > 1 else torch.zeros((), dtype=torch.float32)
                out[rows] = centred / (std + 1e-4)
            elif method == "rloo":
                out[rows] = centred * size / (size - 1) if size > 1 else centred
            else:
                out[rows] = centred
        return out


def make_float32_fixed_eps_group_adapter() -> Float32FixedEpsGroupAdapter:
    """Declares nothing about its group advantages: the suite must name both keys."""
    return Float32FixedEpsGroupAdapter("example-float32-eps", {"clipfrac": "ratio-outside"})
