"""The PPO-family ops at large shapes, ppo-ref and each library side by side (issue 14, part 4).

Cases (one per op, variant and pass; ``fwd`` runs without autograd, ``fwd+bwd`` builds the graph
and calls ``backward()``):

- ``group_advantages/{grpo,dr_grpo,rloo}``: B = 65,536 scores in 4,096 groups of 16;
- ``aggregate_loss/{token-mean,seq-mean-token-mean,seq-mean-token-sum,seq-mean-token-sum-norm}``,
  ``policy_loss/clip-higher+dual-clip``, ``gspo_loss``, ``cispo_loss``, ``kl_loss/{k3,k3+}`` and
  ``rollout_correction/{token-truncate,sequence-mask}``: B = 256, T = 2048, right padding (each
  row keeps between T/2 and T tokens).

Every side calls the library's own function (verl 0.9.1 ``core_algos.py`` and
``rollout_corr_helper.py``; OpenRLHF 0.11.2 ``models/loss.py``, ``models/utils.py`` and, for the
group advantages it keeps inline, the pinned lines of ``experience_maker.py`` run through
:mod:`ppo_ref.adapters.thirdparty._inline`; skyrl-train 0.3.1 ``utils/ppo_utils.py``; TRL 1.16
``GRPOTrainer``'s inline group block, pinned the same way: its losses are inline code that reads
trainer attributes and are not benchmarked), with the
arguments the library's trainer hands it (float masks, token-level rewards of width 1 and a numpy
index for verl's and skyrl's estimators, per-token advantages for the sequence losses). Argument
conversion happens once, outside the timed call; ppo-ref gets bool masks and (B,) group ids.
Each case also knows ppo-ref's result under the library's conventions (its epsilon, its
aggregation), so :func:`check` measures that both sides compute the same numbers.

Two ways to run it:

- ``python bench/family_side.py --compare`` (from ``.venv``): one long-lived worker per
  implementation (``mine`` in this interpreter's environment, each library in ``.envs/NAME``),
  driven in rounds that alternate the order, so the machine's changing load hits every side alike.
  Prints a markdown table of median milliseconds and the ratio ppo-ref / fastest library per round
  (median, min, max over the rounds) and writes ``bench/results/family.json``.
- ``bench/test_family_ops.py``: the same cases under pytest-benchmark, one implementation per run
  (``--bench-impl``); small shapes under ``--benchmark-disable``.

Side names: ``mine``, ``verl``, ``openrlhf``, ``skyrl``, ``trl116``; a library's second implementation of an
op gets its own label (verl's Python-loop ``grpo``/``rloo`` estimators, the defaults of its
``adv_estimator``, are ``verl-loop``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any

import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ppo_ref  # noqa: E402
from ppo_ref.aggregation import LOSS_AGGREGATIONS  # noqa: E402
from ppo_ref.group import GROUP_METHODS  # noqa: E402

SIDES = ("mine", "verl", "openrlhf", "skyrl", "trl116")
LIBRARIES = SIDES[1:]


@dataclass(frozen=True)
class Shapes:
    """Group advantages: ``group_rows`` scores in groups of ``group_size``; losses: (rows, steps)."""

    group_rows: int
    group_size: int
    rows: int
    steps: int


FULL = Shapes(group_rows=65_536, group_size=16, rows=256, steps=2048)
SMALL = Shapes(group_rows=512, group_size=16, rows=8, steps=64)

CLIP, CLIP_HIGH, DUAL = 0.2, 0.28, 3.0
GSPO_CLIP, GSPO_CLIP_HIGH = 3e-4, 4e-4
CISPO_LOW, CISPO_HIGH = 0.2, 0.28
TIS_HIGH, MASK_LOW, MASK_HIGH = 2.0, 0.5, 2.0


def make_data(shapes: Shapes, seed: int = 0) -> dict[str, Tensor]:
    """The inputs every side uses (the same numbers in every environment: same torch, same seed)."""
    g = torch.Generator().manual_seed(seed)
    rows, steps = shapes.rows, shapes.steps
    lengths = torch.randint(steps // 2, steps + 1, (rows,), generator=g)
    mask = torch.arange(steps).expand(rows, steps) < lengths[:, None]
    logp = -torch.rand(rows, steps, generator=g) * 3
    old_logp = logp + 0.1 * torch.randn(rows, steps, generator=g)
    return {
        "scores": torch.randint(0, 2, (shapes.group_rows,), generator=g).float(),
        "group_ids": torch.arange(shapes.group_rows) // shapes.group_size,
        "mask": mask,
        "maskf": mask.float(),
        "logp": logp,
        "old_logp": old_logp,
        "ref_logp": logp + 0.1 * torch.randn(rows, steps, generator=g),
        "rollout_logp": old_logp + 0.05 * torch.randn(rows, steps, generator=g),
        "advantages": torch.randn(rows, steps, generator=g),
        "seq_advantages": torch.randn(rows, generator=g),
        "per_token": torch.randn(rows, steps, generator=g),
    }


@dataclass
class Case:
    """One timed call. ``call()`` returns what :func:`_outputs` reads; ``grad_of`` names the input
    whose gradient the ``fwd+bwd`` pass produces; ``expected()`` is ppo-ref's value under the
    library's conventions (for the check)."""

    key: str
    label: str
    call: Callable[[], Any]
    expected: Callable[[], Tensor]
    grad_of: Tensor | None = None
    expected_grad: Callable[[], Tensor] | None = None
    note: str = ""
    value: Callable[[Any], Tensor] = field(default=lambda out: out)


def _loss_of(out: Any) -> Tensor:
    if isinstance(out, tuple):
        out = out[0]
    return out.loss if hasattr(out, "loss") else out  # type: ignore[no-any-return]


def _with_backward(
    call: Callable[[], Any], leaf: Tensor, value: Callable[[Any], Tensor]
) -> Callable[[], Any]:
    def run() -> Any:
        leaf.grad = None
        out = call()
        value(out).backward()  # type: ignore[no-untyped-call]
        return out

    return run


def _passes(
    key: str,
    label: str,
    make: Callable[[Tensor, Tensor], Callable[[], Any]],
    data: dict[str, Tensor],
    reference: Callable[[Tensor, Tensor], Tensor],
    *,
    input_name: str = "logp",
    backward: bool = True,
    note: str = "",
) -> list[Case]:
    """The ``fwd`` case (plain inputs) and, if ``backward``, the ``fwd+bwd`` case (a leaf copy of
    ``data[input_name]`` that requires grad). ``make(x, mask)`` builds the call on input ``x``."""
    plain = data[input_name]
    cases = [
        Case(
            f"{key}/fwd",
            label,
            make(plain, data["mask"]),
            lambda: reference(plain, data["mask"]),
            note=note,
            value=_loss_of,
        )
    ]
    if backward:
        leaf = plain.clone().requires_grad_()

        def expected_grad() -> Tensor:
            fresh = plain.clone().requires_grad_()
            reference(fresh, data["mask"]).backward()  # type: ignore[no-untyped-call]
            assert fresh.grad is not None
            return fresh.grad

        cases.append(
            Case(
                f"{key}/fwd+bwd",
                label,
                _with_backward(make(leaf, data["mask"]), leaf, _loss_of),
                lambda: reference(plain, data["mask"]),
                grad_of=leaf,
                expected_grad=expected_grad,
                note=note,
                value=_loss_of,
            )
        )
    return cases


# ---------------------------------------------------------------------------------------------
# ppo-ref's expected values (also its own side)


def _ref_group(data: dict[str, Tensor], method: str, eps: float) -> Callable[[], Tensor]:
    return lambda: ppo_ref.group_advantages(data["scores"], data["group_ids"], method, eps=eps)


def _ref_policy(data: dict[str, Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    adv, old = data["advantages"], data["old_logp"]
    return lambda x, m: (
        ppo_ref.policy_loss(x, old, adv, m, CLIP, clip_eps_high=CLIP_HIGH, dual_clip=DUAL).loss
    )


def _ref_gspo(data: dict[str, Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    adv, old = data["seq_advantages"], data["old_logp"]
    return lambda x, m: ppo_ref.gspo_loss(x, old, adv, m, GSPO_CLIP, clip_eps_high=GSPO_CLIP_HIGH).loss


def _ref_cispo(data: dict[str, Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    adv, old = data["advantages"], data["old_logp"]
    return lambda x, m: ppo_ref.cispo_loss(x, old, adv, m, CISPO_LOW, CISPO_HIGH).loss


def _ref_kl(
    data: dict[str, Tensor], estimator: str, agg: str = "token-mean"
) -> Callable[[Tensor, Tensor], Tensor]:
    ref = data["ref_logp"]
    return lambda x, m: ppo_ref.kl_loss(x, ref, m, estimator, agg)


def _ref_agg(data: dict[str, Tensor], mode: str) -> Callable[[Tensor, Tensor], Tensor]:
    constant = float(data["mask"].shape[1]) if mode == "seq-mean-token-sum-norm" else None
    return lambda x, m: ppo_ref.aggregate_loss(x, m, mode, norm_constant=constant)


def _ref_correction(data: dict[str, Tensor], variant: str) -> Callable[[], Tensor]:
    old, rollout, mask = data["old_logp"], data["rollout_logp"], data["mask"]
    if variant == "token-truncate":
        return lambda: ppo_ref.rollout_correction(old, rollout, mask, high=TIS_HIGH)
    return lambda: ppo_ref.rollout_correction(
        old, rollout, mask, level="sequence", mode="mask", low=MASK_LOW, high=MASK_HIGH
    )


def _call_of(function: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Callable[[], Any]]:
    """``make(x, mask)`` for :func:`_passes` from a function of (x, mask)."""
    return lambda x, m: lambda: function(x, m)


def mine_cases(data: dict[str, Tensor]) -> list[Case]:
    """ppo-ref's public, validating functions."""
    cases = [
        Case(
            f"group_advantages/{method}",
            "mine",
            _ref_group(data, method, 1e-6),
            _ref_group(data, method, 1e-6),
        )
        for method in GROUP_METHODS
    ]
    for mode in LOSS_AGGREGATIONS:
        agg = _ref_agg(data, mode)
        cases += _passes(
            f"aggregate_loss/{mode}",
            "mine",
            _call_of(agg),
            data,
            agg,
            input_name="per_token",
        )
    policy, gspo, cispo = _ref_policy(data), _ref_gspo(data), _ref_cispo(data)
    adv, seq_adv, old = data["advantages"], data["seq_advantages"], data["old_logp"]

    def policy_call(x: Tensor, m: Tensor) -> Callable[[], Any]:
        return lambda: ppo_ref.policy_loss(x, old, adv, m, CLIP, clip_eps_high=CLIP_HIGH, dual_clip=DUAL)

    def gspo_call(x: Tensor, m: Tensor) -> Callable[[], Any]:
        return lambda: ppo_ref.gspo_loss(x, old, seq_adv, m, GSPO_CLIP, clip_eps_high=GSPO_CLIP_HIGH)

    def cispo_call(x: Tensor, m: Tensor) -> Callable[[], Any]:
        return lambda: ppo_ref.cispo_loss(x, old, adv, m, CISPO_LOW, CISPO_HIGH)

    cases += _passes("policy_loss/clip-higher+dual-clip", "mine", policy_call, data, policy)
    cases += _passes("gspo_loss", "mine", gspo_call, data, gspo)
    cases += _passes("cispo_loss", "mine", cispo_call, data, cispo)
    for estimator in ("k3", "k3+"):
        kl = _ref_kl(data, estimator)
        cases += _passes(
            f"kl_loss/{estimator}",
            "mine",
            _call_of(_ref_kl(data, estimator)),
            data,
            kl,
        )
    for variant in ("token-truncate", "sequence-mask"):
        cases.append(
            Case(
                f"rollout_correction/{variant}",
                "mine",
                _ref_correction(data, variant),
                _ref_correction(data, variant),
            )
        )
    return cases


# ---------------------------------------------------------------------------------------------
# verl 0.9.1


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
            Case(f"group_advantages/{method}", label, call, _ref_group(data, method, 1e-6), value=first)
        )
    maskf, width = data["maskf"], data["mask"].shape[1]
    for mode in LOSS_AGGREGATIONS:
        scale = width if mode == "seq-mean-token-sum-norm" else None

        def agg(x: Tensor, m: Tensor, mode: str = mode, scale: int | None = scale) -> Callable[[], Any]:
            return lambda: core.agg_loss(x, maskf, mode, loss_scale_factor=scale)

        cases += _passes(
            f"aggregate_loss/{mode}", "verl", agg, data, _ref_agg(data, mode), input_name="per_token"
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

    cases += _passes("policy_loss/clip-higher+dual-clip", "verl", policy_call, data, _ref_policy(data))
    cases += _passes(
        "gspo_loss", "verl", gspo_call, data, _ref_gspo(data), note="GSPO-token, seq-mean-token-mean"
    )
    cases += _passes("cispo_loss", "verl", cispo_call, data, _ref_cispo(data))
    for estimator, name in (("k3", "low_var_kl"), ("k3+", "k3+")):

        def kl_call(x: Tensor, m: Tensor, name: str = name) -> Callable[[], Any]:
            return lambda: core.agg_loss(core.kl_penalty(x, ref, name), maskf, "token-mean")

        cases += _passes(
            f"kl_loss/{estimator}",
            "verl",
            kl_call,
            data,
            _ref_kl(data, estimator),
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
                _ref_correction(data, variant),
                note="log-ratio subtraction included; its metrics too",
            )
        )
    return cases


# ---------------------------------------------------------------------------------------------
# OpenRLHF 0.11.2

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
                _ref_group(data, method, eps),
                note=f"estimator={estimator!r}, contiguous groups of equal size",
            )
        )
    maskf = data["maskf"]
    for mode in ("token-mean", "seq-mean-token-mean"):

        def agg(x: Tensor, m: Tensor, token: bool = mode == "token-mean") -> Callable[[], Any]:
            return lambda: loss_module.aggregate_loss(x, maskf, token_level_loss=token)

        cases += _passes(
            f"aggregate_loss/{mode}", "openrlhf", agg, data, _ref_agg(data, mode), input_name="per_token"
        )
    old, adv, ref = data["old_logp"], data["advantages"], data["ref_logp"]
    seq_adv = data["seq_advantages"][:, None].expand_as(adv).contiguous()
    ppo = loss_module.PolicyLoss(clip_eps_low=CLIP, clip_eps_high=CLIP_HIGH, dual_clip=DUAL)
    gspo = loss_module.PolicyLoss(
        clip_eps_low=GSPO_CLIP, clip_eps_high=GSPO_CLIP_HIGH, policy_loss_type="gspo"
    )
    cases += _passes(
        "policy_loss/clip-higher+dual-clip",
        "openrlhf",
        lambda x, m: lambda: ppo(x, old, adv, action_mask=maskf),
        data,
        _ref_policy(data),
    )
    cases += _passes(
        "gspo_loss",
        "openrlhf",
        lambda x, m: lambda: gspo(x, old, seq_adv, action_mask=maskf),
        data,
        _ref_gspo(data),
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
        cases += _passes(
            f"kl_loss/{estimator}", "openrlhf", kl_call, data, _ref_kl(data, estimator), note=note
        )
    return cases


# ---------------------------------------------------------------------------------------------
# skyrl-train 0.3.1


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
            _ref_group(data, "grpo", 1e-6),
            value=first,
        ),
        Case(
            "group_advantages/dr_grpo",
            "skyrl",
            lambda: grpo(rewards, ones, index, grpo_norm_by_std=False),
            _ref_group(data, "dr_grpo", 1e-6),
            value=first,
        ),
        Case(
            "group_advantages/rloo",
            "skyrl",
            lambda: rloo(rewards, ones, index),
            _ref_group(data, "rloo", 1e-6),
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

        cases += _passes(
            f"aggregate_loss/{mode}", "skyrl", agg, data, _ref_agg(data, mode), input_name="per_token"
        )
    old, adv, ref = data["old_logp"], data["advantages"], data["ref_logp"]
    seq_adv = data["seq_advantages"][:, None].expand_as(adv).contiguous()
    losses = ppo_utils.PolicyLossRegistry
    ppo, gspo, cispo = losses.get("dual_clip"), losses.get("gspo"), losses.get("cispo")
    ppo_config = config("dual_clip", "token_mean", CLIP, CLIP_HIGH)
    gspo_config = config("gspo", "sequence_mean", GSPO_CLIP, GSPO_CLIP_HIGH)
    cispo_config = config("cispo", "token_mean", CISPO_LOW, CISPO_HIGH)
    cases += _passes(
        "policy_loss/clip-higher+dual-clip",
        "skyrl",
        lambda x, m: lambda: ppo(x, old, adv, ppo_config, loss_mask=maskf),
        data,
        _ref_policy(data),
    )
    cases += _passes(
        "gspo_loss",
        "skyrl",
        lambda x, m: lambda: gspo(x, old, seq_adv, gspo_config, loss_mask=maskf),
        data,
        _ref_gspo(data),
        note="GSPO-token, sequence_mean",
    )
    cases += _passes(
        "cispo_loss",
        "skyrl",
        lambda x, m: lambda: cispo(x, old, adv, cispo_config, loss_mask=maskf),
        data,
        _ref_cispo(data),
    )

    def kl_call(x: Tensor, m: Tensor) -> Callable[[], Any]:
        return lambda: ppo_utils.masked_mean(
            ppo_utils.compute_approx_kl(x, ref, maskf, "k3"), maskf, dim=-1
        ).mean()

    cases += _passes(
        "kl_loss/k3",
        "skyrl",
        kl_call,
        data,
        _ref_kl(data, "k3", "seq-mean-token-mean"),
        backward=False,
        note="worker's sequence mean; compute_approx_kl is no_grad (no fwd+bwd)",
    )
    return cases


# ---------------------------------------------------------------------------------------------
# TRL 1.16 (GRPOTrainer): the group block only

TRL_ADVANTAGE_BLOCK = dict(
    module="trl.trainer.grpo_trainer",
    qualname="GRPOTrainer._generate_and_score_completions",
    first="mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)",
    last="is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))  # for logging",
    digest="e4b94e8e0e40da30",
)


def trl116_cases(data: dict[str, Tensor]) -> list[Case]:
    """TRL 1.16 ``GRPOTrainer``'s inline advantage block (``scale_rewards`` "group" for grpo, "none"
    for dr_grpo; TRL's epsilon 1e-4), run from the installed source. Its losses are inline in
    ``_compute_loss`` and read a dozen trainer attributes: not benchmarked here."""
    from ppo_ref.adapters.thirdparty import _inline

    block = _inline.locate(_inline.InlineBlock(**TRL_ADVANTAGE_BLOCK))
    size = int(torch.bincount(data["group_ids"]).max())
    scores = data["scores"]
    cases = []
    for method, scale in (("grpo", "group"), ("dr_grpo", "none")):
        trainer = SimpleNamespace(scale_rewards=scale)

        def run(trainer: Any = trainer) -> Tensor:
            result: Tensor = block.run(self=trainer, rewards=scores, num_generations=size)["advantages"]
            return result

        note = f"scale_rewards={scale!r}, contiguous groups of equal size"
        cases.append(
            Case(f"group_advantages/{method}", "trl116", run, _ref_group(data, method, 1e-4), note=note)
        )
    return cases


BUILDERS: dict[str, Callable[[dict[str, Tensor]], list[Case]]] = {
    "mine": mine_cases,
    "verl": verl_cases,
    "openrlhf": openrlhf_cases,
    "skyrl": skyrl_cases,
    "trl116": trl116_cases,
}


def cases_for(side: str, shapes: Shapes) -> dict[tuple[str, str], Case]:
    """Every case of ``side`` at ``shapes``, by (key, label)."""
    if side not in BUILDERS:
        raise ValueError(f"side: expected one of {SIDES}, got {side!r}")
    return {(case.key, case.label): case for case in BUILDERS[side](make_data(shapes))}


def check(case: Case) -> dict[str, float]:
    """Run ``case`` once; the largest difference of its value (and gradient) from ppo-ref's."""
    out = case.call()
    got = case.value(out).detach().double()
    expected_value = case.expected().detach().double()
    result = {"value": float((got - expected_value).abs().max()) if got.numel() else 0.0}
    if case.grad_of is not None and case.grad_of.grad is not None and case.expected_grad is not None:
        result["grad"] = float((case.grad_of.grad.double() - case.expected_grad().double()).abs().max())
    return result


# ---------------------------------------------------------------------------------------------
# worker: one process per side, JSON lines on a private copy of stdout


def _threads() -> int:
    return int(os.environ.get("PPO_REF_BENCH_THREADS", "2"))


def serve(side: str, shapes: Shapes) -> None:
    """Answer ``{"cmd": "list" | "warm" | "time" | "check", ...}`` lines until EOF."""
    out: IO[str] = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # library prints and warnings go to stderr, never into the protocol
    torch.set_num_threads(_threads())
    try:
        cases = cases_for(side, shapes)
        out.write(
            json.dumps(
                {
                    "ok": True,
                    "cases": [list(k) for k in cases],
                    "notes": {f"{k[0]}|{k[1]}": c.note for k, c in cases.items() if c.note},
                }
            )
            + "\n"
        )
    except Exception as error:  # reported to the coordinator, which leaves the side out
        out.write(json.dumps({"ok": False, "error": f"{type(error).__name__}: {error}"}) + "\n")
        return
    for line in sys.stdin:
        request = json.loads(line)
        case = cases.get((request.get("key", ""), request.get("label", "")))
        if request["cmd"] == "time" and case is not None:
            wall, cpu = [], []
            for _ in range(int(request["reps"])):
                w0, c0 = time.perf_counter(), time.process_time()
                case.call()
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - w0)
            out.write(json.dumps({"wall": wall, "cpu": cpu}) + "\n")
        elif request["cmd"] == "check" and case is not None:
            out.write(json.dumps(check(case)) + "\n")
        else:
            out.write(json.dumps({"error": f"bad request {request}"}) + "\n")


# ---------------------------------------------------------------------------------------------
# coordinator


class Worker:
    def __init__(self, side: str, python: Path, env: dict[str, str], log: IO[str], small: bool) -> None:
        command = [str(python), str(Path(__file__).resolve()), "--serve", side] + (
            ["--small"] if small else []
        )
        self.side = side
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=ROOT
        )
        hello = self.read()
        self.error: str | None = None if hello.get("ok") else str(hello.get("error", "no answer"))
        self.cases: list[tuple[str, str]] = [(str(k[0]), str(k[1])) for k in hello.get("cases", [])]
        self.notes: dict[str, str] = hello.get("notes", {})

    def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        return json.loads(line) if line else {"ok": False, "error": "worker exited"}

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def _pythons() -> dict[str, Path]:
    found = {"mine": Path(sys.executable)}
    for name in LIBRARIES:
        python = ROOT / ".envs" / name / "bin" / "python"
        if python.exists():
            found[name] = python
    return found


def _load() -> tuple[float, float, float]:
    return os.getloadavg()


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Alternating rounds over every (case, implementation); the per-round ratios."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        PYTHONPATH=str(ROOT),
        PYTHONNOUSERSITE="1",
        PPO_REF_BENCH_THREADS=str(args.threads),
        OMP_WAIT_POLICY=args.omp_wait_policy,
    )
    if args.malloc_keep:
        # glibc otherwise hands a 2 MiB temporary's pages back to the kernel when it is freed and
        # faults fresh ones in for the next: thousands of page faults per call, several times the
        # arithmetic at these shapes, and their number depends on each implementation's
        # allocation order, not its arithmetic (bench/PERF-NOTES.md).
        env.update(MALLOC_TRIM_THRESHOLD_=str(2**30), MALLOC_MMAP_THRESHOLD_=str(2**25))
    log_path = Path(args.log)
    started = time.time()
    loads = {"start": _load()}
    workers: dict[str, Worker] = {}
    skipped: dict[str, str] = {}
    with log_path.open("w") as log:
        for side, python in _pythons().items():
            if args.only and side != "mine" and side not in args.only:
                continue
            worker = Worker(side, python, env, log, args.small)
            if worker.error is None:
                workers[side] = worker
            else:
                skipped[side] = worker.error
                worker.close()
        for side in LIBRARIES:
            if side not in workers and side not in skipped:
                skipped[side] = f".envs/{side} is missing (python tools/thirdparty_envs.py {side})"
        keys = sorted({key for w in workers.values() for key, _ in w.cases}, key=_order)
        if args.cases:
            keys = [k for k in keys if any(k.startswith(prefix) for prefix in args.cases)]
        results: dict[str, Any] = {}
        for key in keys:
            impls = [(w, label) for w in workers.values() for k, label in w.cases if k == key]
            if not any(w.side == "mine" for w, _ in impls):
                continue
            results[key] = _measure(key, impls, args)
            _progress(key, results[key])
        loads["end"] = _load()
        for worker in workers.values():
            worker.close()
    return {
        "when": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": round(time.time() - started, 1),
        "shapes": (SMALL if args.small else FULL).__dict__,
        "threads": args.threads,
        "omp_wait_policy": args.omp_wait_policy,
        "malloc_keep": bool(args.malloc_keep),
        "rounds": args.rounds,
        "load": loads,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "torch": torch.__version__,
        "skipped": skipped,
        "notes": {k: v for w in workers.values() for k, v in w.notes.items()},
        "results": results,
    }


def _order(key: str) -> tuple[int, str]:
    ops = (
        "group_advantages",
        "aggregate_loss",
        "policy_loss",
        "gspo_loss",
        "cispo_loss",
        "kl_loss",
        "rollout_correction",
    )
    return ops.index(key.split("/")[0]), key


def _measure(key: str, impls: list[tuple[Worker, str]], args: argparse.Namespace) -> dict[str, Any]:
    """Warm up each implementation, pick its repetitions per block, then alternate blocks."""
    reps: dict[str, int] = {}
    checks: dict[str, dict[str, float]] = {}
    for worker, label in impls:
        checks[label] = worker.ask(cmd="check", key=key, label=label)
        first = worker.ask(cmd="time", key=key, label=label, reps=1)["wall"][0]
        reps[label] = max(1, min(args.max_reps, int(args.block_seconds / max(first, 1e-6))))
    blocks: dict[str, list[dict[str, float]]] = {label: [] for _, label in impls}
    samples: dict[str, dict[str, list[float]]] = {label: {"wall": [], "cpu": []} for _, label in impls}
    for round_index in range(args.rounds):
        order = impls if round_index % 2 == 0 else impls[::-1]
        for worker, label in order:
            timed = worker.ask(cmd="time", key=key, label=label, reps=reps[label])
            samples[label]["wall"] += timed["wall"]
            samples[label]["cpu"] += timed["cpu"]
            blocks[label].append({m: statistics.median(timed[m]) for m in ("wall", "cpu")})
    summary: dict[str, Any] = {"impls": {}, "checks": checks, "reps": reps}
    for label, timing in samples.items():
        summary["impls"][label] = {
            "median_ms": 1e3 * statistics.median(timing["wall"]),
            "min_ms": 1e3 * min(timing["wall"]),
            "cpu_median_ms": 1e3 * statistics.median(timing["cpu"]),
            "calls": len(timing["wall"]),
        }
    others = [label for _, label in impls if label != "mine"]
    if others:
        for metric in ("wall", "cpu"):
            ratios = [
                blocks["mine"][r][metric] / min(blocks[o][r][metric] for o in others)
                for r in range(args.rounds)
            ]
            fastest = min(others, key=lambda o: statistics.median(b[metric] for b in blocks[o]))
            summary[f"ratio_{metric}"] = {
                "median": statistics.median(ratios),
                "min": min(ratios),
                "max": max(ratios),
                "rounds": ratios,
                "fastest": fastest,
            }
    return summary


def _progress(key: str, result: dict[str, Any]) -> None:
    cells = ", ".join(f"{label} {v['median_ms']:.2f}" for label, v in result["impls"].items())
    ratio = result.get("ratio_wall")
    tail = f"; mine/fastest {ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})" if ratio else ""
    print(f"[family {time.strftime('%H:%M:%S')}] {key}: {cells} ms{tail}", file=sys.stderr, flush=True)


LABELS = ("mine", "verl", "verl-loop", "openrlhf", "skyrl", "trl116")
TARGET = 1.1
"""Issue 14's target: ppo-ref within 1.1x of the fastest library."""


def _ratio_cell(result: dict[str, Any], metric: str) -> str:
    ratio = result.get(f"ratio_{metric}")
    if not ratio:
        return "-"
    return f"{ratio['median']:.2f} vs {ratio['fastest']} ({ratio['min']:.2f}-{ratio['max']:.2f})"


def table(reports: list[dict[str, Any]]) -> str:
    """Markdown table of the first report's median milliseconds (wall), and mine / fastest library
    per report in process CPU time and in wall time (median of the per-round ratios, min-max in
    brackets). The verdict reads the CPU-time ratios: met when every run's median is within 1.1."""
    first = reports[0]
    runs = []
    for i in range(len(reports)):
        runs += [f"run {i + 1}: mine / fastest, CPU time", f"run {i + 1}: wall time"]
    lines = [
        "| op / variant / pass | " + " | ".join(LABELS) + " | " + " | ".join(runs) + " | target 1.1x |",
        "|---|" + "---|" * (len(LABELS) + len(runs) + 1),
    ]
    for key, result in first["results"].items():
        cells = [
            f"{result['impls'][label]['median_ms']:.2f}" if label in result["impls"] else "-"
            for label in LABELS
        ]
        ratios = []
        for report in reports:
            other = report["results"].get(key, {})
            ratios += [_ratio_cell(other, "cpu"), _ratio_cell(other, "wall")]
        medians = [
            r["results"][key]["ratio_cpu"]["median"]
            for r in reports
            if "ratio_cpu" in r["results"].get(key, {})
        ]
        verdict = "-" if not medians else ("met" if max(medians) <= TARGET else "**missed**")
        lines.append(f"| {key} | " + " | ".join(cells) + " | " + " | ".join(ratios) + f" | {verdict} |")
    return "\n".join(lines)


def section(reports: list[dict[str, Any]], notes: Sequence[str] = ()) -> str:
    """The RESULTS.md section for one or more :func:`compare` reports (the first gives the times);
    ``notes`` (markdown list items, from ``bench/RESULTS-notes.md``) go at the end of its list."""
    first = reports[0]
    shapes = first["shapes"]
    runs = []
    for i, report in enumerate(reports):
        load = report["load"]
        runs.append(
            f"run {i + 1} {report['when']} ({report.get('commit', '?')}), {report['rounds']} rounds, "
            f"{report['seconds']:.0f} s, load average (1/5/15 min) at the start "
            f"{'/'.join(f'{v:.1f}' for v in load['start'])}, at "
            f"the end {'/'.join(f'{v:.1f}' for v in load['end'])}"
            + (
                ", `--malloc-keep` (glibc keeps freed memory: no page faults for fresh temporaries)"
                if report.get("malloc_keep")
                else ""
            )
        )
    differences: dict[str, float] = {}
    for result in first["results"].values():
        for label, check in result["checks"].items():
            differences[label] = max([differences.get(label, 0.0), *check.values()])
    lines = [
        "## PPO-family ops at large shapes, side by side (issue 14, part 4)",
        "",
        "`python bench/family_side.py --compare --rounds "
        f"{first['rounds']} --write-results` (from `.venv`; each "
        "library in its own `.envs/NAME`, one long-lived worker process per implementation, "
        f"{first['threads']} torch threads, `OMP_WAIT_POLICY={first['omp_wait_policy']}`). Raw data: "
        "`bench/results/family*.json`. Group advantages: B = "
        f"{shapes['group_rows']:,} scores in groups of "
        f"{shapes['group_size']}; the rest: B = {shapes['rows']}, "
        f"T = {shapes['steps']}, right padding (each row keeps "
        "T/2 to T tokens). `fwd` runs without autograd, "
        "`fwd+bwd` builds the graph and calls `backward()`. Each round times a block of calls of every "
        "implementation, in an order that alternates between rounds; the ratio is ppo-ref's median over the "
        "fastest library's median in the same round, and the "
        "table gives the median over the rounds (min-max). "
        "Milliseconds are run 1's medians over all its calls. The machine (2 cores) was shared with other "
        "jobs throughout: absolute times vary several-fold; only the ratios within a round compare.",
        "",
        *[f"- {line}" for line in runs],
        f"- {first['machine']}, torch {first['torch']}.",
        "- What each side calls (arguments converted once, "
        "outside the timed call; ppo-ref gets bool masks and "
        "(B,) group ids, the libraries float masks, width-1 token rewards with a numpy index, per-token "
        "advantages for the sequence losses): verl 0.9.1 `compute_grpo_vectorized_outcome_advantage`, "
        "`compute_rloo_vectorized_outcome_advantage` (`verl-loop`: `compute_grpo_outcome_advantage` and "
        "`compute_rloo_outcome_advantage`, the ones the "
        "`grpo`/`rloo` estimator names select), `agg_loss`, the "
        "registered `vanilla`/`gspo`/`cispo` policy losses with an `ActorConfig`, `kl_penalty` + `agg_loss`, "
        "`compute_rollout_correction_weights` (its metrics "
        "included); OpenRLHF 0.11.2 the pinned group block of "
        "`compute_advantages_and_returns` (equal contiguous groups "
        "only), `PolicyLoss` (ppo with `dual_clip`, gspo), "
        "`aggregate_loss`, `compute_approx_kl` + `aggregate_loss`; skyrl-train 0.3.1 "
        "`compute_grpo_outcome_advantage`, `compute_rloo_outcome_advantage`, `reduce_loss`, the registered "
        "`dual_clip`/`gspo`/`cispo` losses, `compute_approx_kl` + the worker's sequence mean (no gradient: "
        "`@torch.no_grad`, SkyRL #1340); TRL 1.16 GRPOTrainer's pinned group block (its losses are inline in "
        "`_compute_loss` and not benchmarked). A `-` is an "
        "op the library has no function for (OpenRLHF's and "
        "skyrl's rollout corrections live inside their policy losses).",
        "- Same numbers: every case's value (and gradient) minus ppo-ref's under the library's conventions "
        "(epsilon, aggregation), largest over the cases: "
        + ", ".join(f"{label} {diff:.1e}" for label, diff in sorted(differences.items()))
        + ".",
    ]
    lines += notes
    lines.append(
        "- Where ppo-ref misses the target, and why: `bench/PERF-NOTES.md`, section "
        '"PPO-family ops (issue 14)".'
    )
    if first["skipped"]:
        lines.append("- Not run: " + "; ".join(f"{k} ({v})" for k, v in first["skipped"].items()) + ".")
    lines += ["", table(reports)]
    return "\n".join(lines) + "\n"


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    measured = [f"ppo_ref/{name}.py" for name in MEASURED_MODULES]
    dirty = subprocess.run(
        ["git", "status", "--porcelain", *measured], cwd=ROOT, capture_output=True, text=True
    )
    suffix = " + uncommitted changes to the measured functions" if dirty.stdout.strip() else ""
    return done.stdout.strip() + suffix


MEASURED_MODULES = (
    "group",
    "aggregation",
    "losses",
    "variants",
    "kl_loss",
    "correction",
    "masked",
    "_validate",
)
"""The modules of ppo_ref whose functions the cases call (a change elsewhere does not move the figures)."""


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", choices=SIDES, help="run as a worker for this side")
    parser.add_argument("--compare", action="store_true", help="run every side, side by side")
    parser.add_argument("--small", action="store_true", help="small shapes (a quick pipeline check)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=0.25, help="target seconds per timed block")
    parser.add_argument("--max-reps", type=int, default=25)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--omp-wait-policy", default="PASSIVE")
    parser.add_argument(
        "--malloc-keep",
        action="store_true",
        help="every worker's glibc malloc keeps freed memory (MALLOC_TRIM_THRESHOLD_ and _MMAP_THRESHOLD_)",
    )
    parser.add_argument(
        "--only", nargs="*", default=[], help="library sides to run (default: every built one)"
    )
    parser.add_argument("--cases", nargs="*", default=[], help="case-key prefixes to run (default: all)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "family.json"))
    parser.add_argument("--log", default="/tmp/ppo-ref-family-bench.log", help="the workers' stderr")
    parser.add_argument(
        "--write-results",
        action="store_true",
        help="name the report (and --also) as the family data in bench/results/manifest.json and "
        "re-render bench/RESULTS.md whole (bench/results_document.py)",
    )
    parser.add_argument(
        "--also",
        nargs="*",
        default=[],
        help="earlier reports (JSON) whose ratios the section adds as columns",
    )
    parser.add_argument("--render", help="no run: render the section from this report (JSON) and --also")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    shapes = SMALL if args.small else FULL
    if args.serve:
        serve(args.serve, shapes)
        return 0
    if args.render:
        report = json.loads(Path(args.render).read_text())
    elif args.compare:
        report = compare(args)
        report["commit"] = _commit()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    else:
        print("pass --compare, --render REPORT or --serve SIDE", file=sys.stderr)
        return 2
    reports = [report] + [json.loads(Path(path).read_text()) for path in args.also]
    print(section(reports))
    if args.write_results:
        from bench import results_document as document

        files = [Path(args.render or args.out), *map(Path, args.also)]
        if any(f.resolve().parent != document.RESULTS_DIR for f in files):
            print("--write-results: the reports must be in bench/results/", file=sys.stderr)
            return 2
        document.write_manifest(
            document.RESULTS_DIR,
            {"family": [f.name for f in files]},
            header=None,
            new_data=not args.render,
        )
        for path in document.write():
            print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
    return 0


def iter_keys(side: str, shapes: Shapes) -> Iterator[tuple[str, str]]:
    """(key, label) of every case of ``side`` (builds the inputs; for test parametrisation)."""
    yield from cases_for(side, shapes)


if __name__ == "__main__":
    sys.exit(main())
