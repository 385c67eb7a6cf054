"""verl-f3 (non-default: ``actor.loss_agg_mode: seq-mean-token-sum-norm`` with ``loss_scale_factor``
left at its default ``null``; the default ``token-mean`` is unaffected).

Run from the repository root: ``.envs/verl/bin/python findings/repro/verl-f3.py``.

``verl/workers/utils/losses.py ppo_loss`` hands ``agg_loss`` the global batch info
(``global_batch_size``, ``loss_scale_factor = config.loss_scale_factor``); with the factor None,
``agg_loss`` divides by ``loss_mask.shape[-1]``: the padded width of this micro-batch (verl #3741). The
Dr. GRPO normaliser must be a constant (spec AGG-1), so the same tokens padded to another width give
another loss and gradient. This script calls ``agg_loss`` as ``ppo_loss`` does, on one micro-batch
padded to width 3 and to width 8.
"""

from __future__ import annotations

import torch
from verl.trainer.ppo.core_algos import agg_loss

per_token, mask = torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool)
info = {"dp_size": 1, "batch_num_tokens": 6, "global_batch_size": 2, "loss_scale_factor": None}
narrow = agg_loss(per_token, mask, "seq-mean-token-sum-norm", **info)
wide = agg_loss(
    torch.nn.functional.pad(per_token, (0, 5)),
    torch.nn.functional.pad(mask, (0, 5)),
    "seq-mean-token-sum-norm",
    **info,
)
print(
    f"loss at padded width 3: {narrow.item():.4f}; at width 8: {wide.item():.4f}; expected equal "
    "(the same tokens; any fixed constant C)"
)
