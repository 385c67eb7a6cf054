"""verl-f1 (non-default: ``actor.use_kl_loss: true``; its default ``kl_loss_type: low_var_kl``).

Run from the repository root: ``.envs/verl/bin/python findings/repro/verl-f1.py``.

verl 0.9.1's engine loss ``verl/workers/utils/losses.py ppo_loss`` adds the KL loss as
``kl_penalty(logprob, ref_logprob, kl_loss_type)`` aggregated by ``agg_loss`` with the global batch
info; this script makes those two calls in that order (``use_kl_loss`` is off by default; the GRPO
examples turn it on with ``low_var_kl``). ``kl_penalty_forward`` clamps k3 to [-10, 10] (and the
log-ratio to +-20), so a token whose log-prob fell more than about 2.6 nats below the reference's gets
k3 = 10 and no gradient: the KL loss stops pulling back exactly the tokens that drifted most (spec
KLL-1: k3's gradient is 1 - exp(ref_logp - logp)).
"""

from __future__ import annotations

import torch
from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

logp = torch.tensor([[-1.0, -4.0]], requires_grad=True)  # token 2: 3 nats below the reference
ref = torch.tensor([[-1.2, -1.0]])
mask = torch.tensor([[True, True]])
kld = kl_penalty(logprob=logp, ref_logprob=ref, kl_penalty="low_var_kl")
loss = agg_loss(
    loss_mat=kld, loss_mask=mask, loss_agg_mode="token-mean", batch_num_tokens=2, global_batch_size=1
)
loss.backward()
expected_k3 = torch.exp(ref - logp.detach()) - (ref - logp.detach()) - 1
expected_grad = (1 - torch.exp(ref - logp.detach())) / 2
print(
    "k3 per token:",
    [round(v, 4) for v in kld[0].tolist()],
    "expected",
    [round(v, 4) for v in expected_k3[0].tolist()],
)
print(
    "d loss / d logp:",
    [round(v, 4) for v in logp.grad[0].tolist()],
    "expected",
    [round(v, 4) for v in expected_grad[0].tolist()],
)
