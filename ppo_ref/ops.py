"""The op registry: each op of the adapter contract once, with its reference function and its clauses.

An *op* is a math object an implementation under test can provide (``gae``, ``policy_loss``, ...).
:data:`OPS` lists them in the contract's order (the order the conformance report lists them), each
with the ppo-ref function that is its reference, the spec clauses (``spec/SPEC.md``) whose tests
call it, and what it returns (read off the function's return annotation, so never restated). The
adapter contract's op names (:data:`ppo_ref.adapters.OP_NAMES`), the built-in ``mine`` adapter,
the op -> clauses map of the conventions (:data:`ppo_ref.adapters.conventions.OP_CLAUSES`) and
``check_op`` derive from this table: adding an op adds one row here (and its ``*Op`` protocol,
the signature an adapter implements, in :mod:`ppo_ref.adapters.base`).

>>> OPS["gae"].function is gae, OPS["gae"].clauses[0], OPS["policy_loss"].returns.__name__
(True, 'GAE-1', 'PolicyLossResult')
>>> OP_NAMES[:3]
('token_logprobs', 'entropy', 'masked_mean')
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ppo_ref.advantages import gae
from ppo_ref.aggregation import aggregate_loss
from ppo_ref.correction import rollout_correction
from ppo_ref.group import group_advantages
from ppo_ref.kl import kl_penalty, token_rewards
from ppo_ref.kl_loss import kl_loss
from ppo_ref.logprobs import entropy, token_logprobs
from ppo_ref.losses import policy_loss, ppo_penalty_loss, value_loss
from ppo_ref.masked import masked_mean, masked_whiten
from ppo_ref.variants import cispo_loss, gspo_loss

__all__ = ["OPS", "OP_NAMES", "Op"]


@dataclass(frozen=True)
class Op:
    """One op: its name, its reference function and the spec clauses whose tests call it."""

    name: str
    function: Callable[..., object]
    clauses: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"name: expected an identifier, got {self.name!r}")
        if not callable(self.function) or self.function.__name__ != self.name:
            raise ValueError(
                f"function: expected the ppo_ref function named {self.name!r}, got {self.function!r}"
            )
        if not self.clauses or not all(isinstance(c, str) and "-" in c for c in self.clauses):
            raise ValueError(f"clauses: expected spec clause ids such as 'GAE-1', got {self.clauses!r}")

    @property
    def returns(self) -> object:
        """What the reference function returns (its return annotation, resolved)."""
        return typing.get_type_hints(self.function)["return"]


OPS: Mapping[str, Op] = MappingProxyType(
    {
        op.name: op
        for op in (
            Op("token_logprobs", token_logprobs, ("LOGP-1", "LOGP-2", "LOGP-3")),
            Op("entropy", entropy, ("ENT-1",)),
            Op("masked_mean", masked_mean, ("MASK-1",)),
            Op("masked_whiten", masked_whiten, ("MASK-2", "MASK-3", "RPP-1", "RPP-2")),
            Op("kl_penalty", kl_penalty, ("KL-1", "KL-2", "KL-3", "KL-4")),
            Op("token_rewards", token_rewards, ("RWD-1", "RWD-2", "RWD-3")),
            Op("gae", gae, ("GAE-1", "GAE-2", "GAE-3", "GAE-4", "RPP-1")),
            Op(
                "policy_loss",
                policy_loss,
                ("PG-1", "PG-2", "PG-3", "PG-4", "PG-5", "PG-6", "PG-7", "CLIP-1", "CLIP-2", "CLIP-3"),
            ),
            Op("value_loss", value_loss, ("VF-1", "VF-2")),
            Op("ppo_penalty_loss", ppo_penalty_loss, ("PEN-1",)),
            Op("group_advantages", group_advantages, ("GRP-1", "GRP-2", "GRP-3", "GRP-4", "RPP-2")),
            Op("aggregate_loss", aggregate_loss, ("AGG-1", "AGG-2", "AGG-3")),
            Op("gspo_loss", gspo_loss, ("GSPO-1", "GSPO-2", "GSPO-3")),
            Op("cispo_loss", cispo_loss, ("CISPO-1", "CISPO-2")),
            Op("kl_loss", kl_loss, ("KLL-1", "KLL-2", "KLL-3")),
            Op("rollout_correction", rollout_correction, ("IS-1", "IS-2", "IS-3")),
        )
    }
)
"""Op name -> :class:`Op`, in the contract's order. The first ten are PPO's; the last six (critic-free
advantages, loss aggregation, GSPO, CISPO, KL as a loss, rollout corrections) the PPO family's."""

OP_NAMES: tuple[str, ...] = tuple(OPS)
"""Every op name, in the contract's order."""
