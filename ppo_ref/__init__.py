"""ppo-ref: a verification-first reference implementation of PPO for RLHF.

The reference math is a set of pure functions over (B, T) torch tensors; each one's docstring
gives its formula, shapes, sign convention and spec clause (``spec/SPEC.md``).
"""

from ppo_ref.advantages import explained_variance, gae
from ppo_ref.aggregation import aggregate_loss
from ppo_ref.correction import rollout_correction
from ppo_ref.group import group_advantages
from ppo_ref.kl import AdaptiveKLController, FixedKLController, kl_penalty, token_rewards
from ppo_ref.kl_loss import kl_loss
from ppo_ref.logprobs import entropy, token_logprobs
from ppo_ref.losses import (
    PenaltyLossResult,
    PolicyLossResult,
    policy_loss,
    ppo_penalty_loss,
    update_penalty_beta,
    value_loss,
)
from ppo_ref.masked import masked_mean, masked_var, masked_whiten
from ppo_ref.variants import CISPOLossResult, GSPOLossResult, RatioLossResult, cispo_loss, gspo_loss

__version__ = "0.1.0"

__all__ = [
    "AdaptiveKLController",
    "CISPOLossResult",
    "FixedKLController",
    "GSPOLossResult",
    "PenaltyLossResult",
    "PolicyLossResult",
    "RatioLossResult",
    "aggregate_loss",
    "cispo_loss",
    "entropy",
    "explained_variance",
    "gae",
    "group_advantages",
    "gspo_loss",
    "kl_loss",
    "kl_penalty",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "policy_loss",
    "ppo_penalty_loss",
    "rollout_correction",
    "token_logprobs",
    "token_rewards",
    "update_penalty_beta",
    "value_loss",
]
