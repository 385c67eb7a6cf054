"""skyrl-5 (non-default: ``trainer.algorithm.advantage_batch_normalize: true``).

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-5.py``.

skyrl-train 0.3.1's trainer computes the advantages with ``ppo_utils.compute_advantages_and_returns``
(default estimator ``grpo``, as ``RayPPOTrainer.compute_advantages_and_returns`` calls it), then, when
``advantage_batch_normalize`` is true (default false), ``normalize_advantages_dict`` (``trainer.py:264``).
That function subtracts the mean over every slot, padding included, and divides by a masked standard
deviation: on a right-padded batch the action-token advantages are not centred. Default settings
(``advantage_batch_normalize: false``) are unaffected.
"""

from __future__ import annotations

import numpy as np
import torch
from omegaconf import OmegaConf
from skyrl_train.training_batch import TrainingInputBatch
from skyrl_train.utils.ppo_utils import compute_advantages_and_returns, normalize_advantages_dict

# two prompts, two responses each, right-padded to 4 tokens; the score sits on the last action token
response_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.float32)
scores = torch.tensor([1.0, 0.0, 1.0, 1.0 / 3.0])
rewards = torch.zeros(4, 4)
last = response_mask.sum(-1).long() - 1
rewards[torch.arange(4), last] = scores
config = OmegaConf.create({"grpo_norm_by_std": True})
advantages, returns = compute_advantages_and_returns(
    token_level_rewards=rewards,
    response_mask=response_mask,
    index=np.array(["a", "a", "b", "b"]),
    adv_estimator="grpo",
    config=config,
    values=None,
    gamma=1.0,
    lambd=1.0,
    grpo_norm_by_std=True,
)
batch = TrainingInputBatch({"advantages": advantages.clone(), "response_mask": response_mask})
got = normalize_advantages_dict(batch)["advantages"]
action = response_mask.bool()
mean = advantages[action].mean()
std = advantages[action].var(unbiased=False).sqrt()
expected = torch.where(action, (advantages - mean) / std, 0.0)
print("GRPO advantages (0 on padding):      ", advantages.tolist())
print(
    "mean over action tokens after normalize_advantages_dict: got",
    round(float(got[action].mean()), 4),
    "expected 0.0",
)
print("action-token advantages: got     ", [round(x, 4) for x in got[action].tolist()])
print("                          expected", [round(x, 4) for x in expected[action].tolist()])
