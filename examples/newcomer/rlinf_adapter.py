"""As first written (issue 28), kept for the before/after table: an adapter to RLinf 0.3.0 written
from ppo-ref's README alone ("The adapter contract", "Writing an adapter for your trainer"), as a
newcomer would: op tier, no convention declared. Not the matrix adapter
(ppo_ref/adapters/thirdparty/rlinf.py is).

Run (from the repository root, in the rlinf environment):
PYTHONPATH=$PWD:examples/newcomer .envs/rlinf/bin/python -m pytest conformance/ \
    --impl=rlinf_adapter:make_adapter --conformance-output=compact
"""

from types import MappingProxyType, SimpleNamespace

import torch
from rlinf.algorithms.advantages import compute_gae_advantages_and_returns, compute_grpo_advantages
from rlinf.algorithms.losses import compute_ppo_actor_loss, compute_ppo_critic_loss
from rlinf.algorithms.utils import kl_penalty as rlinf_kl_penalty
from rlinf.algorithms.utils import safe_normalize
from rlinf.utils.utils import (
    compute_entropy_from_logits,
    compute_logprobs_from_logits,
    get_loss_agg_func,
)
from rlinf.utils.utils import masked_mean as rlinf_masked_mean


def token_logprobs(logits, input_ids, temperature=1.0):
    return compute_logprobs_from_logits(logits[:, :-1] / temperature, input_ids[:, 1:])


def entropy(logits):
    return compute_entropy_from_logits(logits)


def masked_mean(x, mask, dim=None):
    return rlinf_masked_mean(x, mask, axis=dim)


def masked_whiten(x, mask, shift_mean=True):
    out = safe_normalize(x, mask.bool())
    if not shift_mean:
        out = out + x[mask.bool()].mean()
    return out * mask


def kl_penalty(logp, ref_logp, estimator="k1", mask=None):
    kl = rlinf_kl_penalty(logp, ref_logp, kl_penalty=estimator)
    return kl if mask is None else kl * mask


def gae(rewards, values, mask, gamma, lam, last_values=None):
    # rlinf is time-major: rewards [T, B], values [T + 1, B], dones [T + 1, B]
    b, t = rewards.shape
    boot = torch.zeros(b, dtype=values.dtype) if last_values is None else last_values.to(values.dtype)
    vals = torch.cat([values * mask, boot[:, None]], dim=1).T
    dones = torch.zeros(t + 1, b, dtype=torch.bool)
    dones[1:t] = ~mask[:, 1:].bool().T
    dones[t] = last_values is None
    adv, ret = compute_gae_advantages_and_returns(
        rewards=(rewards * mask).T,
        gamma=gamma,
        gae_lambda=lam,
        values=vals,
        normalize_advantages=False,
        dones=dones,
    )
    return adv.T * mask, ret.T * mask


def policy_loss(
    logp,
    old_logp,
    advantages,
    mask,
    clip_eps,
    loss_agg="token-mean",
    *,
    clip_eps_high=None,
    dual_clip=None,
    norm_constant=None,
    token_count=None,
    row_count=None,
):
    loss, metrics = compute_ppo_actor_loss(
        logprobs=logp.float(),
        old_logprobs=old_logp.float(),
        clip_ratio_low=clip_eps,
        clip_ratio_high=clip_eps if clip_eps_high is None else clip_eps_high,
        advantages=advantages.float(),
        loss_mask=mask.bool(),
        clip_ratio_c=dual_clip,
        loss_agg_func=get_loss_agg_func(loss_agg),
    )
    return SimpleNamespace(
        loss=loss,
        clipfrac=metrics["actor/clip_fraction"],
        approx_kl=metrics["actor/approx_kl"],
    )


def value_loss(values, old_values, returns, mask, clip_eps=None, loss_agg="token-mean", **_):
    loss, _metrics = compute_ppo_critic_loss(
        values=values,
        returns=returns,
        prev_values=old_values,
        value_clip=float("inf") if clip_eps is None else clip_eps,
        huber_delta=1e10,
        loss_mask=mask.bool(),
    )
    return loss


def group_advantages(scores, group_ids, method="grpo", *, std_scope="group", eps=1e-6, singleton="zero"):
    order = torch.argsort(group_ids, stable=True)
    group_size = int((group_ids == group_ids[0]).sum())
    adv, _ = compute_grpo_advantages(
        rewards=scores[order], loss_mask=torch.ones(1, len(scores), dtype=scores.dtype), group_size=group_size
    )
    out = torch.empty_like(scores)
    out[order] = adv.view(-1)
    return out


def aggregate_loss(
    per_token, mask, loss_agg="token-mean", *, norm_constant=None, token_count=None, row_count=None
):
    return get_loss_agg_func(loss_agg)(per_token, mask)


class RlinfAdapter:
    name, version = "rlinf", "0.3.0"
    provenance = (
        "rlinf.algorithms.advantages.compute_gae_advantages_and_returns / compute_grpo_advantages; "
        "rlinf.algorithms.losses.compute_ppo_actor_loss / compute_ppo_critic_loss; "
        "rlinf.algorithms.utils.kl_penalty / safe_normalize; rlinf.utils.utils"
    )
    ops = frozenset(
        {
            "token_logprobs",
            "entropy",
            "masked_mean",
            "masked_whiten",
            "kl_penalty",
            "gae",
            "policy_loss",
            "value_loss",
            "group_advantages",
            "aggregate_loss",
        }
    )
    conventions = MappingProxyType({})
    token_logprobs = staticmethod(token_logprobs)
    entropy = staticmethod(entropy)
    masked_mean = staticmethod(masked_mean)
    masked_whiten = staticmethod(masked_whiten)
    kl_penalty = staticmethod(kl_penalty)
    gae = staticmethod(gae)
    policy_loss = staticmethod(policy_loss)
    value_loss = staticmethod(value_loss)
    group_advantages = staticmethod(group_advantages)
    aggregate_loss = staticmethod(aggregate_loss)


def make_adapter():
    return RlinfAdapter()
