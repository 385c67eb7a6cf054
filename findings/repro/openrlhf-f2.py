"""openrlhf-f2 (metrics-only: ``--actor.policy_loss_type gspo``).

Run from the repository root: ``.envs/openrlhf/bin/python findings/repro/openrlhf-f2.py``.

``PolicyLoss.forward`` with ``policy_loss_type="gspo"`` (what ``PPOActor`` builds) returns ``clip_ratio``,
logged as ``ppo_clip_ratio``, as the share of *tokens* on the flat branch. GSPO clips whole sequences
(spec GSPO-3: the share of sequences). Two sequences, the long one clipped: expected 0.5.
"""

from __future__ import annotations

from ppo_ref.adapters.thirdparty import _openrlhf_stubs

_openrlhf_stubs.install()
import torch  # noqa: E402
from openrlhf.models.loss import PolicyLoss  # noqa: E402

old = torch.zeros(2, 4)
logp = torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.0, 0.0, 0.0, 0.0]])  # row 1: s = e^0.5 > 1 + 0.2
mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
_, clip_ratio, *_ = PolicyLoss(policy_loss_type="gspo")(logp, old, torch.ones(2, 4) * mask, action_mask=mask)
print(f"ppo_clip_ratio: {clip_ratio.item():.4f}; expected 0.5 (one of two sequences)")
