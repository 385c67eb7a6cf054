"""The PPO-family benchmark's skyrl-train 0.3.1 side: ``utils/ppo_utils.py``."""

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
    Case,
    passes,
    ref_agg,
    ref_cispo,
    ref_group,
    ref_gspo,
    ref_kl,
    ref_policy,
)


def skyrl_cases(data: dict[str, Tensor]) -> list[Case]:
    """skyrl-train's registered estimators and policy losses, ``reduce_loss`` and ``compute_approx_kl``."""
    ppo_utils = importlib.import_module("skyrl_train.utils.ppo_utils")
    omegaconf = importlib.import_module("omegaconf").OmegaConf
    width = data["mask"].shape[1]

    def config(loss_type: str, reduction: str, low: float, high: float) -> Any:
        return omegaconf.create(
            {
                "policy_loss_type": loss_type,
                "loss_reduction": reduction,
                "eps_clip_low": low,
                "eps_clip_high": high,
                "clip_ratio_c": DUAL,
                "use_tis": False,
                "tis_imp_ratio_cap": -1.0,
                "max_seq_len": width,
                "cispo": {"cispo_eps_clip_low": low, "cispo_eps_clip_high": high},
            }
        )

    rewards = data["scores"][:, None].clone()
    ones = torch.ones_like(rewards)
    index = data["group_ids"].numpy().copy()
    first = lambda out: out[0][:, 0]  # noqa: E731
    grpo, rloo = ppo_utils.compute_grpo_outcome_advantage, ppo_utils.compute_rloo_outcome_advantage
    cases = [
        Case(
            "group_advantages/grpo",
            "skyrl",
            lambda: grpo(rewards, ones, index),
            ref_group(data, "grpo", 1e-6),
            value=first,
        ),
        Case(
            "group_advantages/dr_grpo",
            "skyrl",
            lambda: grpo(rewards, ones, index, grpo_norm_by_std=False),
            ref_group(data, "dr_grpo", 1e-6),
            value=first,
        ),
        Case(
            "group_advantages/rloo",
            "skyrl",
            lambda: rloo(rewards, ones, index),
            ref_group(data, "rloo", 1e-6),
            value=first,
        ),
    ]
    maskf = data["maskf"]
    for mode, reduction in (
        ("token-mean", "token_mean"),
        ("seq-mean-token-mean", "sequence_mean"),
        ("seq-mean-token-sum-norm", "seq_mean_token_sum_norm"),
    ):

        def agg(x: Tensor, m: Tensor, reduction: str = reduction) -> Callable[[], Any]:
            return lambda: ppo_utils.reduce_loss(x, maskf, reduction, width)

        cases += passes(
            f"aggregate_loss/{mode}", "skyrl", agg, data, ref_agg(data, mode), input_name="per_token"
        )
    old, adv, ref = data["old_logp"], data["advantages"], data["ref_logp"]
    seq_adv = data["seq_advantages"][:, None].expand_as(adv).contiguous()
    losses = ppo_utils.PolicyLossRegistry
    ppo, gspo, cispo = losses.get("dual_clip"), losses.get("gspo"), losses.get("cispo")
    ppo_config = config("dual_clip", "token_mean", CLIP, CLIP_HIGH)
    gspo_config = config("gspo", "sequence_mean", GSPO_CLIP, GSPO_CLIP_HIGH)
    cispo_config = config("cispo", "token_mean", CISPO_LOW, CISPO_HIGH)
    cases += passes(
        "policy_loss/clip-higher+dual-clip",
        "skyrl",
        lambda x, m: lambda: ppo(x, old, adv, ppo_config, loss_mask=maskf),
        data,
        ref_policy(data),
    )
    cases += passes(
        "gspo_loss",
        "skyrl",
        lambda x, m: lambda: gspo(x, old, seq_adv, gspo_config, loss_mask=maskf),
        data,
        ref_gspo(data),
        note="GSPO-token, sequence_mean",
    )
    cases += passes(
        "cispo_loss",
        "skyrl",
        lambda x, m: lambda: cispo(x, old, adv, cispo_config, loss_mask=maskf),
        data,
        ref_cispo(data),
    )

    def kl_call(x: Tensor, m: Tensor) -> Callable[[], Any]:
        return lambda: ppo_utils.masked_mean(
            ppo_utils.compute_approx_kl(x, ref, maskf, "k3"), maskf, dim=-1
        ).mean()

    cases += passes(
        "kl_loss/k3",
        "skyrl",
        kl_call,
        data,
        ref_kl(data, "k3", "seq-mean-token-mean"),
        backward=False,
        note="worker's sequence mean; compute_approx_kl is no_grad (no fwd+bwd)",
    )
    return cases
