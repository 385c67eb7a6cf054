"""The PPO-family benchmark's ppo-ref side: its public, validating functions on the shared inputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

import ppo_ref
from bench.family.cases import (
    CISPO_HIGH,
    CISPO_LOW,
    CLIP,
    CLIP_HIGH,
    CORRECTIONS,
    DUAL,
    GSPO_CLIP,
    GSPO_CLIP_HIGH,
    KL_ESTIMATORS,
    Case,
    call_of,
    passes,
    ref_agg,
    ref_cispo,
    ref_correction,
    ref_group,
    ref_gspo,
    ref_kl,
    ref_policy,
)
from ppo_ref.aggregation import LOSS_AGGREGATIONS
from ppo_ref.group import GROUP_METHODS


def mine_cases(data: dict[str, Tensor]) -> list[Case]:
    """ppo-ref's public, validating functions."""
    cases = [
        Case(
            f"group_advantages/{method}",
            "mine",
            ref_group(data, method, 1e-6),
            ref_group(data, method, 1e-6),
        )
        for method in GROUP_METHODS
    ]
    for mode in LOSS_AGGREGATIONS:
        agg = ref_agg(data, mode)
        cases += passes(
            f"aggregate_loss/{mode}",
            "mine",
            call_of(agg),
            data,
            agg,
            input_name="per_token",
        )
    policy, gspo, cispo = ref_policy(data), ref_gspo(data), ref_cispo(data)
    adv, seq_adv, old = data["advantages"], data["seq_advantages"], data["old_logp"]

    def policy_call(x: Tensor, m: Tensor) -> Callable[[], Any]:
        return lambda: ppo_ref.policy_loss(x, old, adv, m, CLIP, clip_eps_high=CLIP_HIGH, dual_clip=DUAL)

    def gspo_call(x: Tensor, m: Tensor) -> Callable[[], Any]:
        return lambda: ppo_ref.gspo_loss(x, old, seq_adv, m, GSPO_CLIP, clip_eps_high=GSPO_CLIP_HIGH)

    def cispo_call(x: Tensor, m: Tensor) -> Callable[[], Any]:
        return lambda: ppo_ref.cispo_loss(x, old, adv, m, CISPO_LOW, CISPO_HIGH)

    cases += passes("policy_loss/clip-higher+dual-clip", "mine", policy_call, data, policy)
    cases += passes("gspo_loss", "mine", gspo_call, data, gspo)
    cases += passes("cispo_loss", "mine", cispo_call, data, cispo)
    for estimator in KL_ESTIMATORS:
        kl = ref_kl(data, estimator)
        cases += passes(
            f"kl_loss/{estimator}",
            "mine",
            call_of(ref_kl(data, estimator)),
            data,
            kl,
        )
    for variant in CORRECTIONS:
        cases.append(
            Case(
                f"rollout_correction/{variant}",
                "mine",
                ref_correction(data, variant),
                ref_correction(data, variant),
            )
        )
    return cases
