"""As first written (issue 28), kept for the before/after table: an adapter to ms-swift 4.6.0 written
from ppo-ref's README alone ("The adapter contract", "Writing an adapter for your trainer"), as a
newcomer would: op tier, no convention declared. Not the matrix adapter
(ppo_ref/adapters/thirdparty/swift.py is). Do not tune it: its FAILs are the point of the table in
findings/newcomer-trials/ms-swift.md.

ms-swift's PPO trainer is TRL's (swift/rlhf_trainers/ppo_trainer.py); its own RL math is GRPO, so the
newcomer wraps three of its functions: the request-aware advantage, the entropy and the loss
aggregation.

Run (from the repository root, in the swift environment):
PYTHONPATH=$PWD:examples/newcomer .envs/swift/bin/python -m pytest conformance/ \
    --impl=swift_adapter:make_adapter --conformance-output=compact
"""

from types import MappingProxyType

import torch
from swift.rl_core.advantage import _sdar_agg_loss, compute_advantages_dynamic
from swift.rlhf_trainers.utils import entropy_from_logits


def entropy(logits):
    return entropy_from_logits(logits)


def group_advantages(scores, group_ids, method="grpo", *, std_scope="group", eps=1e-6, singleton="zero"):
    estimator = {"grpo": "grpo", "rloo": "rloo"}.get(method, method)
    scale = {"group": "group", "batch": "batch", "none": "none"}.get(std_scope, std_scope)
    adv, _rewards = compute_advantages_dynamic(
        rewards_per_func=scores[:, None],
        reward_weights=torch.ones(1, dtype=scores.dtype),
        prompt_ids=[str(int(g)) for g in group_ids],
        request_ids=[str(i) for i in range(len(scores))],
        advantage_estimator=estimator,
        scale_rewards=scale,
    )
    return adv


def aggregate_loss(per_token, mask, loss_agg="token-mean"):
    return _sdar_agg_loss(per_token, mask, loss_agg)


class SwiftAdapter:
    name, version = "swift", "4.6.0"
    provenance = (
        "swift.rl_core.advantage.compute_advantages_dynamic / _sdar_agg_loss; "
        "swift.rlhf_trainers.utils.entropy_from_logits"
    )
    ops = frozenset({"entropy", "group_advantages", "aggregate_loss"})
    conventions = MappingProxyType({})
    entropy = staticmethod(entropy)
    group_advantages = staticmethod(group_advantages)
    aggregate_loss = staticmethod(aggregate_loss)


def make_adapter():
    return SwiftAdapter()
