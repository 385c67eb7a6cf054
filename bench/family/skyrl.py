"""The PPO-family benchmark's skyrl 0.4.0 side: ``skyrl/backends/skyrl_train/utils/ppo_utils.py``.

The column moved from skyrl-train 0.3.1 (module ``skyrl_train``) to skyrl 0.4.0 in issue 22. The
functions moved to ``skyrl.backends.skyrl_train.utils`` (imported after the adapter's TypedDict shim,
``ppo_ref.adapters.thirdparty.skyrl._import_tinker_types``: skyrl 0.4.0 declares Python >= 3.12), and
two changed what they compute, which the cases follow as the op adapter
(``ppo_ref/adapters/thirdparty/skyrl_family.py``) does:

- the losses no longer reduce: every registered policy loss ends with ``reduce_loss(loss,
  loss_mask)``, a masked *sum*, and the trainer folds the reduction into the advantages beforehand
  (``RayPPOTrainer._normalize_advantages`` -> ``apply_loss_reduction_to_advantages_minibatch``). The
  ``aggregate_loss`` cases time that scaling and then ``reduce_loss``; the policy-loss cases time the
  scaling of the advantages and then the loss (the call batch being one mini-batch), so each case
  still computes the number ppo-ref's reference gives;
- ``compute_approx_kl`` is no longer ``no_grad``, so ``kl_loss/k3`` now has its ``fwd+bwd`` case.

No case was dropped: 0.4.0 still has every function the 0.3.1 side called. The configs are skyrl's
own ``AlgorithmConfig`` dataclass (``skyrl.train.config``, an OmegaConf dict in 0.3.1).
"""

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

SCALED = "advantages scaled by apply_loss_reduction_to_advantages_minibatch({}) in the call; the loss sums"
"""The note of a policy-loss case: 0.4.0's losses sum and the trainer's step scales the advantages."""


def skyrl_cases(data: dict[str, Tensor]) -> list[Case]:
    """skyrl 0.4.0's group estimators, registered policy losses, loss reduction
    (``apply_loss_reduction_to_advantages_minibatch`` + ``reduce_loss``) and ``compute_approx_kl``."""
    importlib.import_module("skyrl")  # ImportError where skyrl is not installed (not the adapter's error)
    from ppo_ref.adapters.thirdparty.skyrl import PPO_UTILS_MODULE, TORCH_UTILS_MODULE, _import_tinker_types

    _import_tinker_types()
    ppo_utils = importlib.import_module(PPO_UTILS_MODULE)
    torch_utils = importlib.import_module(TORCH_UTILS_MODULE)
    skyrl_config = importlib.import_module("skyrl.train.config")
    width = data["mask"].shape[1]
    maskf = data["maskf"]
    rows = maskf.shape[0]

    def config(loss_type: str, reduction: str, low: float, high: float) -> Any:
        return skyrl_config.AlgorithmConfig(
            policy_loss_type=loss_type,
            loss_reduction=reduction,
            eps_clip_low=low,
            eps_clip_high=high,
            clip_ratio_c=DUAL,
            max_seq_len=width,
            cispo=skyrl_config.CISPOConfig(cispo_eps_clip_low=low, cispo_eps_clip_high=high),
        )

    def scaled(values: Tensor, reduction: str) -> Tensor:
        """What the trainer does to each mini-batch's advantages (here: the whole call batch)."""
        result: Tensor = ppo_utils.apply_loss_reduction_to_advantages_minibatch(
            values, maskf, reduction, rows, width
        )
        return result

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
    for mode, reduction in (
        ("token-mean", "token_mean"),
        ("seq-mean-token-mean", "sequence_mean"),
        ("seq-mean-token-sum-norm", "seq_mean_token_sum_norm"),
    ):

        def agg(x: Tensor, m: Tensor, reduction: str = reduction) -> Callable[[], Any]:
            return lambda: ppo_utils.reduce_loss(scaled(x, reduction), maskf)

        cases += passes(
            f"aggregate_loss/{mode}",
            "skyrl",
            agg,
            data,
            ref_agg(data, mode),
            input_name="per_token",
            note=f"apply_loss_reduction_to_advantages_minibatch({reduction}) then reduce_loss (a masked sum)",
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
        lambda x, m: lambda: ppo(x, old, scaled(adv, "token_mean"), ppo_config, loss_mask=maskf),
        data,
        ref_policy(data),
        note=SCALED.format("token_mean"),
    )
    cases += passes(
        "gspo_loss",
        "skyrl",
        lambda x, m: lambda: gspo(x, old, scaled(seq_adv, "sequence_mean"), gspo_config, loss_mask=maskf),
        data,
        ref_gspo(data),
        note="GSPO-token; " + SCALED.format("sequence_mean"),
    )
    cases += passes(
        "cispo_loss",
        "skyrl",
        lambda x, m: lambda: cispo(x, old, scaled(adv, "token_mean"), cispo_config, loss_mask=maskf),
        data,
        ref_cispo(data),
        note=SCALED.format("token_mean"),
    )

    def kl_call(x: Tensor, m: Tensor) -> Callable[[], Any]:
        return lambda: torch_utils.masked_mean(
            ppo_utils.compute_approx_kl(x, ref, loss_mask=maskf, kl_estimator_type="k3"), maskf, dim=-1
        ).mean()

    cases += passes(
        "kl_loss/k3",
        "skyrl",
        kl_call,
        data,
        ref_kl(data, "k3", "seq-mean-token-mean"),
        note="the worker's sequence mean (masked_mean(kl, loss_mask, dim=-1).mean())",
    )
    return cases
