"""skyrl-f3 (non-default: ``trainer.algorithm.policy_loss_type: cispo`` with the ``cispo`` block of
``ppo_base_config.yaml``: ``cispo_eps_clip_low: 0``, ``cispo_eps_clip_high: 5``).

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-f3.py``.

skyrl-train 0.3.1's ``compute_policy_loss_cispo`` (registered ``cispo``, called by the policy worker)
clamps the importance ratio to [1 - low, 1 + high] = [1, 6] with the shipped defaults: every ratio
below 1 is raised to 1, so tokens the policy made less likely get a larger weight than the ratio itself.
ScaleRL's CISPO keeps [0, 5] (spec CISPO-2); SkyRL PR #1928 changed the defaults to 1 and 4 in skyrl
0.4.0. One token with ratio 0.5, A = 1, token_mean: the CISPO weight is minus the gradient.
"""

from __future__ import annotations

import pathlib

import skyrl_train
import torch
from omegaconf import OmegaConf
from skyrl_train.utils.ppo_utils import PolicyLossRegistry

defaults = OmegaConf.load(pathlib.Path(skyrl_train.__file__).parent / "config" / "ppo_base_config.yaml")
config = defaults.trainer.algorithm
config.policy_loss_type = "cispo"
config.max_seq_len = None  # filled in by skyrl's config validation; unused by token_mean
logp = torch.log(torch.tensor([[0.5]])).requires_grad_(True)  # ratio 0.5 against old log-prob 0
loss, _ = PolicyLossRegistry.get("cispo")(
    logp, torch.zeros(1, 1), torch.ones(1, 1), config, loss_mask=torch.ones(1, 1)
)
loss.backward()
print(
    f"bounds [{1 - config.cispo.cispo_eps_clip_low}, {1 + config.cispo.cispo_eps_clip_high}]; "
    f"IS weight of ratio 0.5: {-logp.grad.item():.4f}; expected 0.5 (ScaleRL's [0, 5])"
)
