"""The built-in adapter ``mine``: ppo-ref's own reference functions, unchanged.

Running the conformance suite against it checks the suite and the reference against each other;
``pytest conformance/ --impl=mine`` (the default) must pass with every clause ``pass``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import ppo_ref
from ppo_ref.adapters.base import OP_NAMES

__all__ = ["ReferenceAdapter", "make_adapter"]


class ReferenceAdapter:
    """Every op is the :mod:`ppo_ref` function of the same name. It declares only input conventions,
    the widest: junk in every masked-out slot (``masked_fill = any``) and every edge input (holes,
    rows and batches without action tokens, ``-inf`` logits), so its value clauses are checked on
    all of them; no convention changes an expected value."""

    name = "mine"
    version = ppo_ref.__version__
    provenance = "each op is the ppo_ref function of the same name (ppo_ref.<op>), called unchanged"
    ops: frozenset[str] = frozenset(OP_NAMES)
    conventions: Mapping[str, object] = MappingProxyType({"masked_fill": "any", "edge_inputs": "all"})

    token_logprobs = staticmethod(ppo_ref.token_logprobs)
    entropy = staticmethod(ppo_ref.entropy)
    masked_mean = staticmethod(ppo_ref.masked_mean)
    masked_whiten = staticmethod(ppo_ref.masked_whiten)
    kl_penalty = staticmethod(ppo_ref.kl_penalty)
    token_rewards = staticmethod(ppo_ref.token_rewards)
    gae = staticmethod(ppo_ref.gae)
    policy_loss = staticmethod(ppo_ref.policy_loss)
    value_loss = staticmethod(ppo_ref.value_loss)
    ppo_penalty_loss = staticmethod(ppo_ref.ppo_penalty_loss)
    group_advantages = staticmethod(ppo_ref.group_advantages)
    aggregate_loss = staticmethod(ppo_ref.aggregate_loss)
    gspo_loss = staticmethod(ppo_ref.gspo_loss)
    cispo_loss = staticmethod(ppo_ref.cispo_loss)
    kl_loss = staticmethod(ppo_ref.kl_loss)
    rollout_correction = staticmethod(ppo_ref.rollout_correction)

    def __repr__(self) -> str:
        return f"ReferenceAdapter(name={self.name!r}, version={self.version!r})"


def make_adapter() -> ReferenceAdapter:
    """The ``mine`` adapter (a zero-argument factory, like every registry entry)."""
    return ReferenceAdapter()
