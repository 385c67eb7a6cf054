"""The adapter contract: what the conformance suite needs from an implementation under test.

An adapter is any object with the attributes of :class:`Adapter` (a runtime-checkable
``typing.Protocol``, so wrappers and duck-typed objects qualify) plus, for every op name listed in
its ``ops``, a callable attribute of that name with the signature of the reference function of the
same name in :mod:`ppo_ref` (the ``*Op`` protocols below spell them out). The suite calls the
required arguments positionally and the optional ones by keyword, exactly as written here.

Ops that an adapter does not list need not exist: the suite skips their checks and says why in the
report. ``conventions`` declares documented deviations from the reference conventions; the keys and
values the suite knows are in :mod:`ppo_ref.adapters.conventions`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from torch import Tensor

from ppo_ref.ops import OP_NAMES as _OP_NAMES

__all__ = [
    "OP_NAMES",
    "Adapter",
    "AggregateLossOp",
    "CispoLossOp",
    "CompleteAdapter",
    "EntropyOp",
    "GaeOp",
    "GroupAdvantagesOp",
    "GspoLossOp",
    "KlLossOp",
    "KlPenaltyOp",
    "LossReport",
    "MaskedMeanOp",
    "MaskedWhitenOp",
    "PenaltyLossOutput",
    "PolicyLossOp",
    "PolicyLossOutput",
    "PpoPenaltyLossOp",
    "RolloutCorrectionOp",
    "SequenceLossOutput",
    "TokenLogprobsOp",
    "TokenRewardsOp",
    "ValueLossOp",
    "contract_problems",
]

OP_NAMES: tuple[str, ...] = _OP_NAMES
"""Every op an adapter may provide, in the order the report lists them (the rows of the op registry
:data:`ppo_ref.ops.OPS`). All are optional; the last six (the PPO family: critic-free advantages,
loss aggregation, GSPO, CISPO, KL as a loss and rollout corrections) are newer, and most adapters
provide a part of them."""


@runtime_checkable
class Adapter(Protocol):
    """The attributes every adapter has. ``isinstance(obj, Adapter)`` checks that they exist."""

    @property
    def name(self) -> str:
        """Short name of the implementation under test (e.g. ``"verl"``)."""

    @property
    def version(self) -> str:
        """Version of the implementation under test (not of the adapter)."""

    @property
    def provenance(self) -> str:
        """How each op reaches the implementation's own code (module and function per op)."""

    @property
    def ops(self) -> frozenset[str]:
        """The op names (a subset of :data:`OP_NAMES`) this adapter provides."""

    @property
    def conventions(self) -> Mapping[str, object]:
        """Declared deviations from the reference conventions, keyed as in ``conventions.CONVENTIONS``."""


class PolicyLossOutput(Protocol):
    """What a ``policy_loss`` op returns: 0-dim tensors or floats (``loss`` differentiable in logp).

    ``clipfrac`` and ``approx_kl`` may be ``None`` only when the adapter declares the convention
    ``clipfrac: None`` or ``approx_kl: None`` (the implementation does not report that statistic).
    """

    @property
    def loss(self) -> Tensor | float: ...

    @property
    def clipfrac(self) -> Tensor | float | None: ...

    @property
    def approx_kl(self) -> Tensor | float | None: ...


@dataclass(frozen=True)
class LossReport:
    """A library's loss and the statistics it reports beside it, as an adapter returns them from
    ``policy_loss``, ``gspo_loss`` or ``cispo_loss`` (it has what :class:`PolicyLossOutput` and
    :class:`SequenceLossOutput` ask for): one type for every adapter, so that a library's names
    for them (verl's ``actor/pg_clipfrac``, OpenRLHF's ``clip_ratio``, ...) are mapped once, where
    the adapter calls the library.

    Attributes:
        loss: the loss, differentiable in logp.
        clipfrac: the library's clip fraction, or None where it reports none (the adapter then
            declares ``clipfrac: None``).
        approx_kl: the library's approximate KL, or None where it reports none (``approx_kl: None``).
        extra: other statistics the library reports, by the adapter's name for them (not checked).

    >>> LossReport(loss=1.5, clipfrac=0.25).approx_kl is None
    True
    """

    loss: Tensor | float
    clipfrac: Tensor | float | None = None
    approx_kl: Tensor | float | None = None
    extra: Mapping[str, float] = field(default_factory=dict)


class PenaltyLossOutput(Protocol):
    """What a ``ppo_penalty_loss`` op returns (``loss`` differentiable in logp)."""

    @property
    def loss(self) -> Tensor | float: ...


class TokenLogprobsOp(Protocol):
    def __call__(self, logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor: ...


class EntropyOp(Protocol):
    def __call__(self, logits: Tensor) -> Tensor: ...


class MaskedMeanOp(Protocol):
    def __call__(self, x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor: ...


class MaskedWhitenOp(Protocol):
    def __call__(self, x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor: ...


class KlPenaltyOp(Protocol):
    def __call__(
        self, logp: Tensor, ref_logp: Tensor, estimator: str = "k1", mask: Tensor | None = None
    ) -> Tensor: ...


class TokenRewardsOp(Protocol):
    def __call__(
        self,
        scores: Tensor,
        logp: Tensor,
        ref_logp: Tensor,
        mask: Tensor,
        kl_coef: float,
        estimator: str = "k1",
    ) -> Tensor: ...


class GaeOp(Protocol):
    def __call__(
        self,
        rewards: Tensor,
        values: Tensor,
        mask: Tensor,
        gamma: float,
        lam: float,
        last_values: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]: ...


class PolicyLossOp(Protocol):
    def __call__(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        clip_eps: float,
        loss_agg: str = "token-mean",
    ) -> PolicyLossOutput: ...


class ValueLossOp(Protocol):
    def __call__(
        self,
        values: Tensor,
        old_values: Tensor,
        returns: Tensor,
        mask: Tensor,
        clip_eps: float | None = None,
    ) -> Tensor | float: ...


class PpoPenaltyLossOp(Protocol):
    def __call__(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, beta: float
    ) -> PenaltyLossOutput: ...


class GroupAdvantagesOp(Protocol):
    def __call__(
        self,
        scores: Tensor,
        group_ids: Tensor,
        method: str = "grpo",
        *,
        std_scope: str = "group",
        eps: float = 1e-6,
        singleton: str = "zero",
    ) -> Tensor: ...


class AggregateLossOp(Protocol):
    def __call__(
        self,
        per_token: Tensor,
        mask: Tensor,
        loss_agg: str = "token-mean",
        *,
        norm_constant: float | None = None,
        token_count: int | Tensor | None = None,
        row_count: int | Tensor | None = None,
    ) -> Tensor | float: ...


class SequenceLossOutput(Protocol):
    """What ``gspo_loss`` and ``cispo_loss`` return: ``loss`` (differentiable in logp) and
    ``clipfrac`` (0-dim tensors or floats; ``clipfrac`` may be None where the library reports none)."""

    @property
    def loss(self) -> Tensor | float: ...

    @property
    def clipfrac(self) -> Tensor | float | None: ...


class GspoLossOp(Protocol):
    def __call__(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        clip_eps: float,
        *,
        clip_eps_high: float | None = None,
        row_count: int | Tensor | None = None,
    ) -> SequenceLossOutput: ...


class CispoLossOp(Protocol):
    def __call__(
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
    ) -> SequenceLossOutput: ...


class KlLossOp(Protocol):
    def __call__(
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
    ) -> Tensor | float: ...


class RolloutCorrectionOp(Protocol):
    def __call__(
        self,
        logp: Tensor,
        rollout_logp: Tensor,
        mask: Tensor,
        *,
        level: str = "token",
        mode: str = "truncate",
        high: float,
        low: float | None = None,
    ) -> Tensor: ...


class CompleteAdapter(Adapter, Protocol):
    """An adapter that provides every op (for static typing; the built-in ``mine`` is one)."""

    token_logprobs: TokenLogprobsOp
    entropy: EntropyOp
    masked_mean: MaskedMeanOp
    masked_whiten: MaskedWhitenOp
    kl_penalty: KlPenaltyOp
    token_rewards: TokenRewardsOp
    gae: GaeOp
    policy_loss: PolicyLossOp
    value_loss: ValueLossOp
    ppo_penalty_loss: PpoPenaltyLossOp
    group_advantages: GroupAdvantagesOp
    aggregate_loss: AggregateLossOp
    gspo_loss: GspoLossOp
    cispo_loss: CispoLossOp
    kl_loss: KlLossOp
    rollout_correction: RolloutCorrectionOp


def contract_problems(adapter: object) -> list[str]:
    """What is wrong with ``adapter`` as an adapter (empty list: nothing). Conventions not included.

    Checks the types of ``name``, ``version``, ``provenance``, ``ops`` and ``conventions``, that every
    listed op is known, and that every listed op is a callable attribute.
    """
    problems: list[str] = []
    for attribute in ("name", "version", "provenance"):
        value = getattr(adapter, attribute, None)
        if not isinstance(value, str) or not value:
            problems.append(f"{attribute}: expected a non-empty str, got {value!r}")
    ops = getattr(adapter, "ops", None)
    if not isinstance(ops, (frozenset, set)) or not all(isinstance(op, str) for op in ops):
        problems.append(f"ops: expected a frozenset of op names, got {ops!r}")
    else:
        unknown = sorted(set(ops) - set(OP_NAMES))
        if unknown:
            problems.append(f"ops: unknown op names {unknown}; known ops are {list(OP_NAMES)}")
        for op in sorted(set(ops) & set(OP_NAMES)):
            if not callable(getattr(adapter, op, None)):
                problems.append(f"ops lists {op!r} but the adapter has no callable attribute {op!r}")
    conventions = getattr(adapter, "conventions", None)
    if not isinstance(conventions, Mapping):
        problems.append(f"conventions: expected a Mapping[str, object], got {conventions!r}")
    return problems
