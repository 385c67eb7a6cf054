"""The trainer's estimator tables: stage 6's advantage estimators and stage 7's policy losses, by name.

Adding an estimator or a loss adds an entry here; the loop (:mod:`ppo_ref.trainer.loop`) and the
update (:mod:`ppo_ref.trainer.update`) look them up and never change. Each entry only calls
ppo_ref's reference functions.

- :data:`ADVANTAGE_ESTIMATORS`: ``name -> estimator(rollout, config) -> (raw_advantages, returns)``,
  (B, N) each, from the rollout's token rewards, values, mask and stop reasons (its advantage
  fields are not filled yet). Today: ``gae`` (with the critic).
- :data:`POLICY_LOSSES`: ``name -> loss(logprobs, old_logprobs, advantages, mask, config)``, a
  :class:`~ppo_ref.PolicyLossResult`. Today: ``ppo`` (PPO-Clip).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ppo_ref import gae, policy_loss
from ppo_ref.losses import PolicyLossResult
from ppo_ref.trainer.config import TrainerConfig
from ppo_ref.trainer.data import Rollout

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "AdvantageEstimator",
    "PolicyLoss",
    "advantage_estimator",
    "gae_advantages",
    "ppo_clip_loss",
    "trainer_policy_loss",
]

AdvantageEstimator = Callable[[Rollout, TrainerConfig], tuple[Tensor, Tensor]]
PolicyLoss = Callable[[Tensor, Tensor, Tensor, Tensor, TrainerConfig], PolicyLossResult]


def gae_advantages(rollout: Rollout, config: TrainerConfig) -> tuple[Tensor, Tensor]:
    """GAE with the critic's values: terminal, or bootstrapped from the critic for responses cut at
    max length (``truncation = "bootstrap"``). Rows are independent."""
    last_values = None
    if config.truncation == "bootstrap":
        last_values = torch.where(rollout.ended, 0.0, rollout.bootstrap_values)
    return gae(rollout.rewards, rollout.values, rollout.mask, config.gamma, config.lam, last_values)


def ppo_clip_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, config: TrainerConfig
) -> PolicyLossResult:
    """PPO-Clip with ``clip_eps``, aggregated by ``loss_agg``."""
    return policy_loss(logprobs, old_logprobs, advantages, mask, config.clip_eps, config.loss_agg)


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {"gae": gae_advantages}
"""Stage 6: advantage estimator name -> function of the rollout."""

POLICY_LOSSES: dict[str, PolicyLoss] = {"ppo": ppo_clip_loss}
"""Stage 7: policy loss name -> function of the new and old log-probs, advantages and mask."""


def advantage_estimator(config: TrainerConfig) -> AdvantageEstimator:
    """The run's advantage estimator (``gae``: the config has no other yet)."""
    return ADVANTAGE_ESTIMATORS["gae"]


def trainer_policy_loss(config: TrainerConfig) -> PolicyLoss:
    """The run's policy loss (``ppo``: the config has no other yet)."""
    return POLICY_LOSSES["ppo"]
