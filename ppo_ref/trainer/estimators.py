"""The trainer's estimator tables: stage 6's advantage estimators and stage 7's policy losses, by name.

Adding an estimator or a loss adds an entry here; the loop (:mod:`ppo_ref.trainer.loop`) and the
update (:mod:`ppo_ref.trainer.update`) look them up and never change. Each entry only calls
ppo_ref's reference functions.

- :data:`ADVANTAGE_ESTIMATORS`: ``name -> estimator(rollout, config) -> (raw_advantages, returns)``,
  (B, N) each, from the whole (gathered) rollout batch: its token rewards, values, mask, stop
  reasons and prompts (its advantage fields are not filled yet). ``gae`` (with the critic), and
  the critic-free ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce++`` and ``reinforce++-baseline``.
  Each entry says whether stage 6 then whitens the advantages over the batch's action tokens.
- :data:`POLICY_LOSSES`: ``name -> loss(logprobs, old_logprobs, advantages, mask, config)``, a
  :class:`~ppo_ref.PolicyLossResult`. Today: ``ppo`` (PPO-Clip).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ppo_ref import gae, group_advantages, policy_loss
from ppo_ref.losses import PolicyLossResult
from ppo_ref.trainer.config import TrainerConfig
from ppo_ref.trainer.data import Rollout

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "AdvantageEstimator",
    "AdvantageFunction",
    "PolicyLoss",
    "advantage_estimator",
    "gae_advantages",
    "group_ids",
    "group_relative_advantages",
    "ppo_clip_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "sequence_returns",
    "trainer_policy_loss",
]

AdvantageFunction = Callable[[Rollout, TrainerConfig], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class AdvantageEstimator:
    """An entry of :data:`ADVANTAGE_ESTIMATORS`: ``compute(rollout, config) -> (raw_advantages,
    returns)`` on the whole rollout batch, and whether stage 6 whitens the raw advantages over all
    action tokens of the batch (``masked_whiten``). Calling the entry calls ``compute``."""

    compute: AdvantageFunction
    whiten: bool

    def __call__(self, rollout: Rollout, config: TrainerConfig) -> tuple[Tensor, Tensor]:
        return self.compute(rollout, config)


PolicyLoss = Callable[[Tensor, Tensor, Tensor, Tensor, TrainerConfig], PolicyLossResult]


def gae_advantages(rollout: Rollout, config: TrainerConfig) -> tuple[Tensor, Tensor]:
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


def reinforce_pp_advantages(rollout: Rollout, config: TrainerConfig) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (spec RPP-1): the discounted returns ``gae(rewards, 0, mask, gamma, lam=1)``
    over the token rewards (KL penalty included); stage 6 whitens them over the batch."""
    rewards = rollout.rewards
    return gae(rewards, torch.zeros_like(rewards), rollout.mask, config.gamma, 1.0)


def reinforce_pp_baseline_advantages(rollout: Rollout, config: TrainerConfig) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline (spec RPP-2): each return minus its group's mean (``dr_grpo``),
    broadcast to the action tokens; stage 6 whitens them over the batch."""
    return group_relative_advantages(rollout, "dr_grpo")


def _group_method(method: str) -> AdvantageFunction:
    def estimate(rollout: Rollout, config: TrainerConfig) -> tuple[Tensor, Tensor]:
        return group_relative_advantages(rollout, method)

    estimate.__name__ = estimate.__qualname__ = f"{method}_advantages"
    estimate.__doc__ = f"``group_advantages(..., method={method!r})`` of the sequence returns, not whitened."
    return estimate


def ppo_clip_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, config: TrainerConfig
) -> PolicyLossResult:
    """PPO-Clip with ``clip_eps``, aggregated by ``loss_agg``."""
    return policy_loss(logprobs, old_logprobs, advantages, mask, config.clip_eps, config.loss_agg)


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "gae": AdvantageEstimator(gae_advantages, whiten=True),
    "grpo": AdvantageEstimator(_group_method("grpo"), whiten=False),
    "dr_grpo": AdvantageEstimator(_group_method("dr_grpo"), whiten=False),
    "rloo": AdvantageEstimator(_group_method("rloo"), whiten=False),
    "reinforce++": AdvantageEstimator(reinforce_pp_advantages, whiten=True),
    "reinforce++-baseline": AdvantageEstimator(reinforce_pp_baseline_advantages, whiten=True),
}
"""Stage 6: advantage estimator name (``config.advantage_estimator``) -> its entry. Which ones use
a critic, and which group by prompt, is declared in :mod:`ppo_ref.trainer.config`
(``CRITIC_FREE_ESTIMATORS``, ``GROUP_ESTIMATORS``), so a config is checked before anything is built."""

POLICY_LOSSES: dict[str, PolicyLoss] = {"ppo": ppo_clip_loss}
"""Stage 7: policy loss name -> function of the new and old log-probs, advantages and mask."""


def advantage_estimator(config: TrainerConfig) -> AdvantageEstimator:
    """The run's advantage estimator: ``ADVANTAGE_ESTIMATORS[config.advantage_estimator]``."""
    return ADVANTAGE_ESTIMATORS[config.advantage_estimator]


def trainer_policy_loss(config: TrainerConfig) -> PolicyLoss:
    """The run's policy loss (``ppo``: the config has no other yet)."""
    return POLICY_LOSSES["ppo"]
