"""The PPO-family benchmark's verl 0.9.1 side: ``core_algos`` and ``rollout_corr_helper``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from bench.family.cases import (
    CISPO_HIGH,
    CISPO_LOW,
    CLIP,
    CLIP_HIGH,
    DUAL,
    GSPO_CLIP,
    GSPO_CLIP_HIGH,
    MASK_HIGH,
    MASK_LOW,
    TIS_HIGH,
    Case,
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


def verl_cases(data: dict[str, Tensor]) -> list[Case]:
    """verl's ``core_algos`` estimators, ``agg_loss``, registered policy losses and ``kl_penalty``;
    ``rollout_corr_helper.compute_rollout_correction_weights``."""

    core = importlib.import_module("verl.trainer.ppo.core_algos")
    corr = importlib.import_module("verl.trainer.ppo.rollout_corr_helper")
    actor_config = importlib.import_module("verl.workers.config").ActorConfig

    def config(low: float, high: float) -> Any:
        return actor_config(
            strategy="fsdp",
            rollout_n=1,
            ppo_micro_batch_size_per_gpu=1,
            clip_ratio=low,
            clip_ratio_low=low,
            clip_ratio_high=high,
            clip_ratio_c=DUAL,
        )

    rewards = data["scores"][:, None].clone()
    ones = torch.ones_like(rewards)
    index = data["group_ids"].numpy().copy()
    first = lambda out: out[0][:, 0]  # noqa: E731  (advantages, returns), width 1
    cases = []
    estimators = {
        ("verl", "grpo"): lambda: core.compute_grpo_vectorized_outcome_advantage(rewards, ones, index),
        ("verl", "dr_grpo"): lambda: core.compute_grpo_vectorized_outcome_advantage(
            rewards, ones, index, norm_adv_by_std_in_grpo=False
        ),
        ("verl", "rloo"): lambda: core.compute_rloo_vectorized_outcome_advantage(rewards, ones, index),
        ("verl-loop", "grpo"): lambda: core.compute_grpo_outcome_advantage(rewards, ones, index),
        ("verl-loop", "dr_grpo"): lambda: core.compute_grpo_outcome_advantage(
            rewards, ones, index, norm_adv_by_std_in_grpo=False
        ),
        ("verl-loop", "rloo"): lambda: core.compute_rloo_outcome_advantage(rewards, ones, index),
    }
    for (label, method), call in estimators.items():
        cases.append(
            Case(f"group_advantages/{method}", label, call, ref_group(data, method, 1e-6), value=first)
        )
    maskf, width = data["maskf"], data["mask"].shape[1]
    for mode in LOSS_AGGREGATIONS:
        scale = width if mode == "seq-mean-token-sum-norm" else None

        def agg(x: Tensor, m: Tensor, mode: str = mode, scale: int | None = scale) -> Callable[[], Any]:
            return lambda: core.agg_loss(x, maskf, mode, loss_scale_factor=scale)

        cases += passes(
            f"aggregate_loss/{mode}", "verl", agg, data, ref_agg(data, mode), input_name="per_token"
        )
    old, adv, ref = data["old_logp"], data["advantages"], data["ref_logp"]
    seq_adv = data["seq_advantages"][:, None].expand_as(adv).contiguous()
    vanilla, gspo, cispo = (core.get_policy_loss_fn(name) for name in ("vanilla", "gspo", "cispo"))
    ppo_config, gspo_config = config(CLIP, CLIP_HIGH), config(GSPO_CLIP, GSPO_CLIP_HIGH)
    cispo_config = config(CISPO_LOW, CISPO_HIGH)

    def policy_call(x: Tensor, m: Tensor) -> Callable[[], Any]:
        return lambda: vanilla(old, x, adv, maskf, "token-mean", ppo_config)

    def gspo_call(x: Tensor, m: Tensor) -> Callable[[], Any]:
        return lambda: gspo(old, x, seq_adv, maskf, "seq-mean-token-mean", gspo_config)

    def cispo_call(x: Tensor, m: Tensor) -> Callable[[], Any]:
        return lambda: cispo(old, x, adv, maskf, "token-mean", cispo_config)

    cases += passes("policy_loss/clip-higher+dual-clip", "verl", policy_call, data, ref_policy(data))
    cases += passes(
        "gspo_loss", "verl", gspo_call, data, ref_gspo(data), note="GSPO-token, seq-mean-token-mean"
    )
    cases += passes("cispo_loss", "verl", cispo_call, data, ref_cispo(data))
    for estimator, name in (("k3", "low_var_kl"), ("k3+", "k3+")):

        def kl_call(x: Tensor, m: Tensor, name: str = name) -> Callable[[], Any]:
            return lambda: core.agg_loss(core.kl_penalty(x, ref, name), maskf, "token-mean")

        cases += passes(
            f"kl_loss/{estimator}",
            "verl",
            kl_call,
            data,
            ref_kl(data, estimator),
            note=f"kl_penalty({name!r}) + agg_loss",
        )
    rollout = data["rollout_logp"]
    thresholds = {
        "token-truncate": ("token", TIS_HIGH),
        "sequence-mask": ("sequence", f"{MASK_LOW}_{MASK_HIGH}"),
    }
    for variant, (level, threshold) in thresholds.items():

        def weights(level: str = level, threshold: Any = threshold) -> Tensor:
            result: Tensor = corr.compute_rollout_correction_weights(old - rollout, maskf, level, threshold)[
                0
            ]
            return result

        cases.append(
            Case(
                f"rollout_correction/{variant}",
                "verl",
                weights,
                ref_correction(data, variant),
                note="log-ratio subtraction included; its metrics too",
            )
        )
    return cases
