"""verl-f5 (non-default: ``algorithm.rollout_correction.rollout_is`` with a ``"lower_upper"`` threshold,
IcePop).

Run from the repository root: ``.envs/verl/bin/python findings/repro/verl-f5.py``.

``compute_rollout_correction_and_rejection_mask`` (the function ``ray_trainer`` calls through
``compute_rollout_correction_and_add_to_batch``) computes the IcePop weights, then its metrics:
``compute_is_metrics`` takes the effective sample size as ``1.0 / masked_mean(w_norm ** 2).item()``. When
IcePop rejects every action token of the batch (every ratio outside [low, high]: a large
trainer/rollout mismatch, or a one-sequence batch), that is a Python ``1.0 / 0.0``: the training step
stops with ``ZeroDivisionError`` instead of returning zero weights (spec IS-1, IS-3).
"""

from __future__ import annotations

import torch
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

old = torch.tensor([[-1.0, -2.0]])
rollout = torch.tensor([[-2.5, -3.5]])  # w = e^1.5 = 4.48 on both tokens, outside [0.5, 2]
mask = torch.ones(1, 2)
try:
    weights, _, _ = compute_rollout_correction_and_rejection_mask(
        old, rollout, mask, rollout_is="token", rollout_is_threshold="0.5_2.0"
    )
    print("weights:", weights.batch["rollout_is_weights"].tolist(), "expected [[0.0, 0.0]]")
except ZeroDivisionError as error:
    print(f"ZeroDivisionError: {error}; expected weights [[0.0, 0.0]] (both tokens rejected)")
