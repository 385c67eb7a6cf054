"""skyrl-f6 (metrics-only: ``trainer.algorithm.policy_loss_type: gspo``).

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-f6.py``.

``gspo_policy_loss`` (registered ``gspo``, called by the policy worker, logged as ``ppo_clip_ratio``)
returns the share of *tokens* on the flat branch. GSPO clips whole sequences (spec GSPO-3: the share
of sequences). Two sequences, the long one clipped: expected 0.5.
"""

from __future__ import annotations

import torch
from omegaconf import OmegaConf
from skyrl_train.utils.ppo_utils import PolicyLossRegistry

config = OmegaConf.create(
    {
        "policy_loss_type": "gspo",
        "loss_reduction": "sequence_mean",
        "max_seq_len": None,
        "eps_clip_low": 0.2,
        "eps_clip_high": 0.2,
    }
)
old = torch.zeros(2, 4)
logp = torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.0, 0.0, 0.0, 0.0]])  # row 1: s = e^0.5 > 1 + 0.2
mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
_, clip_ratio = PolicyLossRegistry.get("gspo")(logp, old, torch.ones(2, 4) * mask, config, loss_mask=mask)
print(f"ppo_clip_ratio: {clip_ratio:.4f}; expected 0.5 (one of two sequences)")
