"""The PPO-family benchmark's OpenRLHF 0.11.2 side: ``models/loss.py``, ``models/utils.py`` and the
pinned group-baseline block of ``experience_maker.py``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from bench.family.cases import (
    CLIP,
    CLIP_HIGH,
    DUAL,
    GSPO_CLIP,
    GSPO_CLIP_HIGH,
    Case,
    passes,
    ref_agg,
    ref_group,
    ref_gspo,
    ref_kl,
    ref_policy,
)

OPENRLHF_ADVANTAGE_BLOCK = dict(
    module="openrlhf.trainer.ppo_utils.experience_maker",
    qualname="RemoteExperienceMaker.compute_advantages_and_returns",
    first='if args.algo.advantage.estimator == "rloo":',
    last="rewards = rewards - rewards.mean()",
    digest="01f6322b94822d58",
)


def openrlhf_cases(data: dict[str, Tensor]) -> list[Case]:
    """OpenRLHF's ``PolicyLoss`` (ppo with dual clip, gspo), ``aggregate_loss``, ``compute_approx_kl``
    and the inline group-baseline block of ``compute_advantages_and_returns``."""
    from ppo_ref.adapters.thirdparty import _inline, _openrlhf_stubs

    _openrlhf_stubs.install()
    loss_module = importlib.import_module("openrlhf.models.loss")
    utils = importlib.import_module("openrlhf.models.utils")
    block = _inline.locate(_inline.InlineBlock(**OPENRLHF_ADVANTAGE_BLOCK))
    size = int(torch.bincount(data["group_ids"]).max())
    scores = data["scores"]
    cases = []
    for method, (estimator, eps) in {
        "grpo": ("group_norm", 1e-9),
        "dr_grpo": ("dr_grpo", 1e-6),
        "rloo": ("rloo", 1e-6),
    }.items():
        args = SimpleNamespace(
            algo=SimpleNamespace(advantage=SimpleNamespace(estimator=estimator)),
            rollout=SimpleNamespace(n_samples_per_prompt=size),
        )

        def run(args: Any = args) -> Tensor:
            result: Tensor = block.run(args=args, rewards=scores.reshape(-1, size))["rewards"].reshape(-1)
            return result

        cases.append(
            Case(
                f"group_advantages/{method}",
                "openrlhf",
                run,
                ref_group(data, method, eps),
                note=f"estimator={estimator!r}, contiguous groups of equal size",
            )
        )
    maskf = data["maskf"]
    for mode in ("token-mean", "seq-mean-token-mean"):

        def agg(x: Tensor, m: Tensor, token: bool = mode == "token-mean") -> Callable[[], Any]:
            return lambda: loss_module.aggregate_loss(x, maskf, token_level_loss=token)

        cases += passes(
            f"aggregate_loss/{mode}", "openrlhf", agg, data, ref_agg(data, mode), input_name="per_token"
        )
    old, adv, ref = data["old_logp"], data["advantages"], data["ref_logp"]
    seq_adv = data["seq_advantages"][:, None].expand_as(adv).contiguous()
    ppo = loss_module.PolicyLoss(clip_eps_low=CLIP, clip_eps_high=CLIP_HIGH, dual_clip=DUAL)
    gspo = loss_module.PolicyLoss(
        clip_eps_low=GSPO_CLIP, clip_eps_high=GSPO_CLIP_HIGH, policy_loss_type="gspo"
    )
    cases += passes(
        "policy_loss/clip-higher+dual-clip",
        "openrlhf",
        lambda x, m: lambda: ppo(x, old, adv, action_mask=maskf),
        data,
        ref_policy(data),
    )
    cases += passes(
        "gspo_loss",
        "openrlhf",
        lambda x, m: lambda: gspo(x, old, seq_adv, action_mask=maskf),
        data,
        ref_gspo(data),
        note="ratio differentiable (no stop-gradient)",
    )
    for estimator, unbiased in (("k3", False), ("k3+", True)):

        def kl_call(x: Tensor, m: Tensor, unbiased: bool = unbiased) -> Callable[[], Any]:
            return lambda: loss_module.aggregate_loss(
                utils.compute_approx_kl(x, ref, kl_estimator="k3", unbiased_gradient=unbiased), maskf
            )

        note = (
            "compute_approx_kl(k3, unbiased_gradient=True) without log_probs_old: w = 1" if unbiased else ""
        )
        cases += passes(f"kl_loss/{estimator}", "openrlhf", kl_call, data, ref_kl(data, estimator), note=note)
    return cases
