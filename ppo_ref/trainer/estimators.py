"""The trainer's estimator tables: stage 6's advantage estimators and stage 7's policy losses, by name.

Adding an estimator or a loss adds an entry to its table here, and its name to the ``Literal``
beside the table (the config field's type, so the CLI's choices and mypy see it; a test checks the
two agree). Nothing else changes: the loop (:mod:`ppo_ref.trainer.loop`) and the update
(:mod:`ppo_ref.trainer.update`) look the entries up, and the config (:mod:`ppo_ref.trainer.config`)
derives from the entries' properties which estimators build a critic, group by prompt or give one
advantage per sequence. Each entry only calls ppo_ref's reference functions.

- :data:`ADVANTAGE_ESTIMATORS`: ``name -> estimator(rollout, config) -> (raw_advantages, returns)``,
  (B, N) each, from the whole (gathered) rollout batch: its token rewards, values, mask, stop
  reasons and prompts (its advantage fields are not filled yet). ``gae`` (with the critic), and
  the critic-free ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce++`` and ``reinforce++-baseline``.
  Each entry says whether stage 6 then whitens the advantages over the batch's action tokens.
- :data:`POLICY_LOSSES`: ``name -> loss(logprobs, old_logprobs, advantages, mask, config, whole)``,
  a :class:`~ppo_ref.PolicyLossResult`: ``ppo`` (PPO-Clip with ``clip_eps_high`` and
  ``dual_clip``), ``gspo`` and ``cispo``. ``whole`` (:class:`WholeMinibatch`) holds the counts of
  the whole minibatch, so a call on one micro-batch or one process's rows is its share of the
  minibatch's loss (the reference's ``token_count`` / ``row_count``, spec AGG-2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from ppo_ref import cispo_loss, gae, group_advantages, gspo_loss, policy_loss
from ppo_ref.aggregation import LossAggregation
from ppo_ref.group import GROUP_METHODS, GroupMethod
from ppo_ref.losses import PolicyLossResult
from ppo_ref.trainer.data import Rollout
from ppo_ref.variants import RatioLossResult

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "AdvantageEstimator",
    "AdvantageEstimatorName",
    "AdvantageFunction",
    "EstimatorSettings",
    "PolicyLoss",
    "PolicyLossName",
    "WholeMinibatch",
    "advantage_estimator",
    "cispo_trainer_loss",
    "gae_advantages",
    "group_ids",
    "group_relative_advantages",
    "gspo_trainer_loss",
    "ppo_clip_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "sequence_returns",
    "trainer_policy_loss",
]


class EstimatorSettings(Protocol):
    """The run settings the estimators and losses here read: :class:`ppo_ref.trainer.config.TrainerConfig`
    has them all. Stated as a protocol, not by importing the config, because the config derives its
    checks from the tables below: this module depends on what it reads, the config on this module
    (no import circle, ``tests/test_import_graph.py``)."""

    @property
    def advantage_estimator(self) -> str: ...
    @property
    def policy_loss(self) -> str: ...
    @property
    def gamma(self) -> float: ...
    @property
    def lam(self) -> float: ...
    @property
    def truncation(self) -> Literal["terminal", "bootstrap"]: ...
    @property
    def clip_eps(self) -> float: ...
    @property
    def clip_eps_high(self) -> float | None: ...
    @property
    def dual_clip(self) -> float | None: ...
    @property
    def loss_agg(self) -> LossAggregation: ...
    @property
    def loss_norm_constant(self) -> float | None: ...


AdvantageFunction = Callable[[Rollout, EstimatorSettings], tuple[Tensor, Tensor]]

AdvantageEstimatorName = Literal["gae", GroupMethod, "reinforce++", "reinforce++-baseline"]
"""The names of :data:`ADVANTAGE_ESTIMATORS` (``config.advantage_estimator``'s type)."""

PolicyLossName = Literal["ppo", "gspo", "cispo"]
"""The names of :data:`POLICY_LOSSES` (``config.policy_loss``'s type)."""


@dataclass(frozen=True)
class AdvantageEstimator:
    """An entry of :data:`ADVANTAGE_ESTIMATORS`: ``compute(rollout, config) -> (raw_advantages,
    returns)`` on the whole rollout batch, and what the config checks and the loop need to know of
    it. Calling the entry calls ``compute``.

    Attributes:
        compute: the estimator.
        whiten: whether stage 6 whitens the raw advantages over all action tokens of the batch
            (``masked_whiten``).
        critic: whether it uses the critic's values (only then does the trainer build a value
            model; the critic's fields are rejected otherwise, ``config.CRITIC_FIELDS``).
        group_baseline: whether its baseline is the group of responses to the same prompt
            (``group_size >= 2``; it uses no discount, so ``gamma`` is rejected).
        per_sequence: whether it gives one advantage per sequence, the same on each of its action
            tokens (whitening keeps that): the estimators ``policy_loss = gspo`` accepts.
    """

    compute: AdvantageFunction
    whiten: bool
    critic: bool = False
    group_baseline: bool = False
    per_sequence: bool = False

    def __call__(self, rollout: Rollout, config: EstimatorSettings) -> tuple[Tensor, Tensor]:
        return self.compute(rollout, config)


@dataclass(frozen=True)
class WholeMinibatch:
    """The counts of a whole minibatch that each part of it (a micro-batch, a process's rows)
    normalises its loss by, so that the parts' losses sum to the whole minibatch's (spec AGG-2).

    Attributes:
        tokens: action tokens of the minibatch (0-dim int64 tensor): ``token_count``.
        rows: rows with at least one action token (0-dim int64 tensor): ``row_count`` of the
            ``seq-mean-*`` modes.
        all_rows: every row, empty ones included: ``row_count`` of ``seq-mean-token-sum-norm``.
    """

    tokens: Tensor
    rows: Tensor
    all_rows: int

    @staticmethod
    def of(mask: Tensor) -> WholeMinibatch:
        """The counts of the (B, N) bool action mask of the whole minibatch.

        Example: ``WholeMinibatch.of(torch.tensor([[True, True], [False, False]]))`` has 2 tokens,
        1 row with a token and 2 rows in all.
        """
        if mask.dim() != 2 or mask.dtype != torch.bool:
            raise ValueError(f"mask: expected a (B, N) bool tensor, got {tuple(mask.shape)} {mask.dtype}")
        return WholeMinibatch(tokens=mask.sum(), rows=mask.any(dim=1).sum(), all_rows=mask.shape[0])

    def keywords(self, loss_agg: str, norm_constant: float | None) -> dict[str, Any]:
        """The aggregation keywords of ppo_ref's losses for ``loss_agg``: ``token_count`` for
        ``token-mean``, else ``row_count`` (every row for ``seq-mean-token-sum-norm``, with
        ``norm_constant``; the rows with an action token otherwise)."""
        if loss_agg == "token-mean":
            return {"token_count": self.tokens}
        if loss_agg == "seq-mean-token-sum-norm":
            return {"norm_constant": norm_constant, "row_count": self.all_rows}
        return {"row_count": self.rows}


PolicyLoss = Callable[[Tensor, Tensor, Tensor, Tensor, EstimatorSettings, WholeMinibatch], PolicyLossResult]


def gae_advantages(rollout: Rollout, config: EstimatorSettings) -> tuple[Tensor, Tensor]:
    """GAE with the critic's values: terminal, or bootstrapped from the critic for responses cut at
    max length (``truncation = "bootstrap"``). Rows are independent."""
    last_values = None
    if config.truncation == "bootstrap":
        last_values = torch.where(rollout.ended, 0.0, rollout.bootstrap_values)
    return gae(rollout.rewards, rollout.values, rollout.mask, config.gamma, config.lam, last_values)


def sequence_returns(rollout: Rollout) -> Tensor:
    r"""(B,) each response's return :math:`R_i = \sum_t r_{i,t}` over its action tokens.

    With the KL penalty in the reward (stage 5) this is the score minus ``kl_coef`` times the
    sequence's summed KL estimate; 0 for a row without action tokens (a skipped sample). Example:
    token rewards ``[[-0.1, -0.1, 0.8]]`` on three action tokens give ``[0.6]``.
    """
    return torch.where(rollout.mask, rollout.rewards, 0.0).sum(dim=1)


def group_ids(prompts: Sequence[str]) -> Tensor:
    """(B,) int64 group id of each row, keyed by its prompt text: rows with the same prompt share
    an id (numbered by first appearance), whatever process generated them and in whatever order.

    Example: ``group_ids(["a", "b", "a"])`` is ``tensor([0, 1, 0])``.
    """
    if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
        raise ValueError("prompts: expected a sequence of prompt strings")
    numbers: dict[str, int] = {}
    return torch.tensor([numbers.setdefault(p, len(numbers)) for p in prompts], dtype=torch.int64)


def group_relative_advantages(rollout: Rollout, method: str) -> tuple[Tensor, Tensor]:
    """``group_advantages(R, group_ids(prompts), method)`` over the valid rows, broadcast to every
    action token of each row (0 elsewhere): ``(advantages, returns)``, (B, N) each, where
    ``returns`` broadcasts the sequence return ``R`` (:func:`sequence_returns`).

    A skipped sample (``valid`` False) enters no group; a group left with one valid sample has no
    baseline and gets advantage 0 (``singleton="zero"``).
    """
    mask, valid = rollout.mask, rollout.valid
    returns = sequence_returns(rollout)
    ids = group_ids(rollout.prompts).to(returns.device)
    advantages = torch.zeros_like(returns)
    advantages[valid] = group_advantages(returns[valid], ids[valid], method)
    column = mask.new_zeros((), dtype=returns.dtype)
    return (
        torch.where(mask, advantages.unsqueeze(1), column),
        torch.where(mask, returns.unsqueeze(1), column),
    )


def reinforce_pp_advantages(rollout: Rollout, config: EstimatorSettings) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (spec RPP-1): the discounted returns ``gae(rewards, 0, mask, gamma, lam=1)``
    over the token rewards (KL penalty included); stage 6 whitens them over the batch."""
    rewards = rollout.rewards
    return gae(rewards, torch.zeros_like(rewards), rollout.mask, config.gamma, 1.0)


def reinforce_pp_baseline_advantages(rollout: Rollout, config: EstimatorSettings) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline (spec RPP-2): each return minus its group's mean (``dr_grpo``),
    broadcast to the action tokens; stage 6 whitens them over the batch."""
    return group_relative_advantages(rollout, "dr_grpo")


def _group_method(method: str) -> AdvantageFunction:
    def estimate(rollout: Rollout, config: EstimatorSettings) -> tuple[Tensor, Tensor]:
        return group_relative_advantages(rollout, method)

    estimate.__name__ = estimate.__qualname__ = f"{method}_advantages"
    estimate.__doc__ = f"``group_advantages(..., method={method!r})`` of the sequence returns, not whitened."
    return estimate


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: EstimatorSettings,
    whole: WholeMinibatch,
) -> PolicyLossResult:
    """``policy_loss``: PPO-Clip with ``clip_eps`` (and ``clip_eps_high``, ``dual_clip``), aggregated
    by ``loss_agg`` over the whole minibatch."""
    return policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        config.clip_eps,
        config.loss_agg,
        clip_eps_high=config.clip_eps_high,
        dual_clip=config.dual_clip,
        **whole.keywords(config.loss_agg, config.loss_norm_constant),
    )


def _row_advantages(advantages: Tensor, mask: Tensor) -> Tensor:
    """(B,) each row's advantage, read at its first action token (a sequence-level estimator puts
    the same value on every action token of the row); 0 for a row without one."""
    first = mask.long().argmax(dim=1, keepdim=True)
    return torch.where(mask.any(dim=1), advantages.gather(1, first).squeeze(1), 0.0)


def _as_policy_loss_result(result: RatioLossResult) -> PolicyLossResult:
    """A GSPO or CISPO result as stage 7's :class:`~ppo_ref.PolicyLossResult`: its clipfrac is
    also the ``ratio_outside_frac`` (each clips one weight, never a dual branch), and
    ``dual_clip_frac`` is 0."""
    return PolicyLossResult(
        loss=result.loss,
        clipfrac=result.clipfrac,
        ratio_outside_frac=result.clipfrac,
        approx_kl=result.approx_kl,
        ratio_mean=result.ratio_mean,
        ratio_max=result.ratio_max,
        dual_clip_frac=torch.zeros_like(result.clipfrac),
    )


def gspo_trainer_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: EstimatorSettings,
    whole: WholeMinibatch,
) -> PolicyLossResult:
    """``gspo_loss`` on each row's advantage, the mean over the minibatch's sequences.

    ``ratio_outside_frac`` is the share of sequences on the flat branch (the clipfrac: GSPO clips
    sequence ratios, never token ones) and ``dual_clip_frac`` is 0.
    """
    result = gspo_loss(
        logprobs,
        old_logprobs,
        _row_advantages(advantages, mask),
        mask,
        config.clip_eps,
        clip_eps_high=config.clip_eps_high,
        row_count=whole.rows,
    )
    return _as_policy_loss_result(result)


def cispo_trainer_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: EstimatorSettings,
    whole: WholeMinibatch,
) -> PolicyLossResult:
    """``cispo_loss`` with the weight clipped to ``[1 - clip_eps, 1 + clip_eps_high]``
    (``clip_eps_high`` None: ``clip_eps``), aggregated by ``loss_agg`` over the whole minibatch.

    Its clipfrac (share of tokens whose weight the clip changed) is also the ``ratio_outside_frac``;
    ``dual_clip_frac`` is 0.
    """
    result = cispo_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        config.clip_eps,
        config.clip_eps if config.clip_eps_high is None else config.clip_eps_high,
        config.loss_agg,
        **whole.keywords(config.loss_agg, config.loss_norm_constant),
    )
    return _as_policy_loss_result(result)


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "gae": AdvantageEstimator(gae_advantages, whiten=True, critic=True),
    **{
        name: AdvantageEstimator(_group_method(name), whiten=False, group_baseline=True, per_sequence=True)
        for name in GROUP_METHODS
    },
    "reinforce++": AdvantageEstimator(reinforce_pp_advantages, whiten=True),
    "reinforce++-baseline": AdvantageEstimator(
        reinforce_pp_baseline_advantages, whiten=True, group_baseline=True, per_sequence=True
    ),
}
"""Stage 6: advantage estimator name (``config.advantage_estimator``, :data:`AdvantageEstimatorName`)
-> its entry. Every group method of the math layer (``ppo_ref.group.GROUP_METHODS``) is one. The
config derives its checks from the entries' properties (``CRITIC_FREE_ESTIMATORS``,
``GROUP_ESTIMATORS``, ``SEQUENCE_LEVEL_ESTIMATORS``), so a config is checked before anything is built."""

POLICY_LOSSES: dict[str, PolicyLoss] = {
    "ppo": ppo_clip_loss,
    "gspo": gspo_trainer_loss,
    "cispo": cispo_trainer_loss,
}
"""Stage 7: policy loss name (``config.policy_loss``, :data:`PolicyLossName`) -> function of the
new and old log-probs, advantages, mask, config and the whole minibatch's counts. Which estimators
each accepts is checked in :mod:`ppo_ref.trainer.config` (gspo: ``SEQUENCE_LEVEL_ESTIMATORS``)."""


def advantage_estimator(config: EstimatorSettings) -> AdvantageEstimator:
    """The run's advantage estimator: ``ADVANTAGE_ESTIMATORS[config.advantage_estimator]``."""
    return ADVANTAGE_ESTIMATORS[config.advantage_estimator]


def trainer_policy_loss(config: EstimatorSettings) -> PolicyLoss:
    """The run's policy loss: ``POLICY_LOSSES[config.policy_loss]``."""
    return POLICY_LOSSES[config.policy_loss]
