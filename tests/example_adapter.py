"""Example adapters for the adapter-registry and conformance-CLI tests.

``make_adapter`` builds an adapter the way a third-party library would: it wraps functions (here
ppo-ref's own) and declares one documented convention, the clip fraction counted as the share of
tokens with the ratio outside [1 - eps, 1 + eps] (as torchrl and stable-baselines3 do), which it
computes itself. It leaves out ``entropy`` and ``ppo_penalty_loss``, so the report shows those
clauses as not provided. ``make_wrong_adapter`` computes the same clip fraction but misspells the
convention key, so the deviation is undeclared: the suite must fail PG-3 and the contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import Tensor

import ppo_ref

__all__ = ["ADAPTER", "ExampleAdapter", "PolicyLossOutput", "make_adapter", "make_wrong_adapter"]


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
