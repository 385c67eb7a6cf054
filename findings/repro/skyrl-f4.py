"""skyrl-f4 (trainer-path, default settings: ``loss_reduction: token_mean`` with more than one
micro-batch per mini-batch).

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-f4.py``.

skyrl-train 0.3.1's policy worker (``skyrl_train/workers/worker.py``, ``forward_backward``) reduces each
micro-batch with the loss's own ``token_mean`` (``reduce_loss``: the mean over *this micro-batch's*
tokens) and divides by ``accumulation_steps``. The accumulated gradient is a mean of micro-batch means:
a token of a short micro-batch weighs more than a token of a long one, so the gradient depends on how
the mini-batch is split (spec AGG-2; SkyRL PR #925 and #1296, fixed in skyrl 0.4.0 by folding the
reduction into the advantages). This script calls the registered ``regular`` loss per micro-batch and
divides by the accumulation steps, as the worker does.
"""

from __future__ import annotations

import pathlib

import skyrl_train
import torch
from omegaconf import OmegaConf
from skyrl_train.utils.ppo_utils import PolicyLossRegistry

defaults = OmegaConf.load(pathlib.Path(skyrl_train.__file__).parent / "config" / "ppo_base_config.yaml")
config = defaults.trainer.algorithm
config.max_seq_len = None  # filled in by skyrl's config validation; unused by token_mean
loss_fn = PolicyLossRegistry.get(config.policy_loss_type)
mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])  # responses of 4 tokens and 1 token
advantages = mask.clone()
logp = torch.zeros(2, 4, requires_grad=True)
whole, _ = loss_fn(logp, logp.detach(), advantages, config, loss_mask=mask)
(one_batch,) = torch.autograd.grad(whole, logp)
steps = 2
split = sum(
    loss_fn(
        logp[i : i + 1], logp.detach()[i : i + 1], advantages[i : i + 1], config, loss_mask=mask[i : i + 1]
    )[0]
    / steps
    for i in range(steps)
)
(two_micro,) = torch.autograd.grad(split, logp)
print("d loss / d logp of each response's first token, one micro-batch:", one_batch[:, 0].tolist())
print("the same mini-batch as 2 micro-batches of 1 response:", two_micro[:, 0].tolist(), "expected the same")
