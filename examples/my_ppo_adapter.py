"""A complete adapter for a trainer outside ppo-ref: its own GAE and clipped loss, checked by the suite.

Run: PYTHONPATH=examples python -m pytest conformance/ --impl=my_ppo_adapter:make_adapter
(from a ppo-ref checkout), or with ppo-ref installed, in the directory that holds this file:
python -m pytest --pyargs ppo_ref_conformance --impl=my_ppo_adapter:make_adapter
"""

from types import MappingProxyType, SimpleNamespace

import torch


def my_gae(rewards, values, mask, gamma, lam, last_values=None):  # the trainer's code under test
    adv, next_value, running = torch.zeros_like(values), torch.zeros(len(values), dtype=values.dtype), 0.0
    if last_values is not None:
        next_value = last_values.to(values.dtype)
    for t in reversed(range(values.shape[1])):
        on = mask[:, t].bool()
        delta = torch.where(on, rewards[:, t], 0) + gamma * next_value - torch.where(on, values[:, t], 0)
        running = torch.where(on, delta + gamma * lam * running, running)
        next_value = torch.where(on, values[:, t], next_value)
        adv[:, t] = torch.where(on, running, 0)
    return adv, torch.where(mask.bool(), adv + values, 0)


def my_policy_loss(logp, old_logp, advantages, mask, clip_eps, loss_agg="token-mean"):
    on = mask.bool()
    ratio = torch.exp(torch.where(on, logp - old_logp, 0))
    adv = torch.where(on, advantages, 0)
    objective = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    n = on.sum().clamp(min=1)
    return SimpleNamespace(
        loss=-objective[on].sum() / n,
        clipfrac=((ratio - 1).abs() > clip_eps)[on].sum() / n,  # |ratio - 1| > eps: declared below
        approx_kl=((ratio - 1) - ratio.log())[on].sum().detach() / n,
    )


class MyAdapter:
    name, version, provenance = "my-trainer", "0.1", "gae: my_gae; policy_loss: my_policy_loss"
    ops = frozenset({"gae", "policy_loss"})
    conventions = MappingProxyType({"clipfrac": "ratio-outside", "loss_aggregations": ["token-mean"]})
    gae = staticmethod(my_gae)
    policy_loss = staticmethod(my_policy_loss)


def make_adapter():
    return MyAdapter()
