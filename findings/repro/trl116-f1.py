"""trl116-f1 (non-default: ``mask_truncated_completions=True`` with ``loss_type="grpo"`` or ``"luspo"``;
the default ``loss_type="dapo"`` is unaffected).

Run from the repository root: ``.envs/trl116/bin/python findings/repro/trl116-f1.py``.

TRL 1.16's ``GRPOTrainer._compute_loss`` normalises ``grpo`` as ``((per_token_loss * mask).sum(-1) /
mask.sum(-1).clamp(min=1)).mean()`` and ``luspo`` as ``(per_token_loss * mask).sum(-1).mean()``: the mean
runs over every completion, so a completion without action tokens adds a 0 and dilutes the others
(spec PG-2: the mean over sequences that have an action token). ``mask_truncated_completions=True`` (the
DAPO overlong filtering) zeroes the whole completion mask of every truncated completion, which makes
exactly such rows. This script runs the installed normalisation lines (pinned by content, through
ppo-ref's ``trl116`` adapter) on two completions, the second one truncated and masked out.
"""

from __future__ import annotations

import torch

from ppo_ref.adapters import get_adapter

trl = get_adapter("trl116")
per_token_loss = torch.tensor([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]])
mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])  # the truncated completion, masked out
for loss_agg, loss_type, expected in (
    ("seq-mean-token-mean", "grpo", 2.0),
    ("seq-mean-token-sum", "luspo", 6.0),
):
    loss = trl.aggregate_loss(per_token_loss, mask, loss_agg)
    print(f"loss_type={loss_type}: {loss.item():.4f}; expected {expected} (the one completion with tokens)")
