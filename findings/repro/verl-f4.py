"""verl-f4 (metrics-only: ``policy_loss.loss_mode: gspo``).

Run from the repository root: ``.envs/verl/bin/python findings/repro/verl-f4.py``.

``compute_policy_loss_gspo`` (registered ``gspo``, called by ``verl/workers/utils/losses.py ppo_loss``)
logs ``actor/pg_clipfrac`` as the share of *tokens* on the flat branch. GSPO clips whole sequences
(spec GSPO-3: the share of sequences), so long sequences weigh more in the logged fraction. Two
sequences, the long one clipped: one of two sequences is clipped; verl logs 4 of 5 tokens.
"""

from __future__ import annotations

import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config import ActorConfig

config = ActorConfig(
    strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, loss_agg_mode="seq-mean-token-mean"
)
old = torch.zeros(2, 4)
logp = torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.0, 0.0, 0.0, 0.0]])  # row 1: s = e^0.5 > 1 + 0.2
mask = torch.tensor([[True, True, True, True], [True, False, False, False]])
_, metrics = get_policy_loss_fn("gspo")(
    old, logp, torch.ones(2, 4) * mask, mask, "seq-mean-token-mean", config
)
print(f"actor/pg_clipfrac: {metrics['actor/pg_clipfrac']:.4f}; expected 0.5 (one of two sequences)")
