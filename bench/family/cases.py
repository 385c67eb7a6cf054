"""The PPO-family benchmark's shared data: shapes, inputs, the case type and ppo-ref's expected values.

Every side (``bench/family/mine.py`` and one module per library) builds its cases from the inputs
of :func:`make_data` (the same numbers in every environment: same torch, same seed) with the
settings below, and gives each case ppo-ref's value under that library's conventions (the
``ref_*`` functions), so :func:`check` measures that both compute the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

import ppo_ref


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
KL_ESTIMATORS = ("k3", "k3+")
"""The KL-loss estimators GRPO trainers use, the ones benchmarked."""
CORRECTIONS = ("token-truncate", "sequence-mask")
"""The rollout corrections benchmarked: token-level truncated IS and a sequence-level mask."""


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


def loss_of(out: Any) -> Tensor:
    if isinstance(out, tuple):
        out = out[0]
    return out.loss if hasattr(out, "loss") else out  # type: ignore[no-any-return]


def with_backward(call: Callable[[], Any], leaf: Tensor, value: Callable[[Any], Tensor]) -> Callable[[], Any]:
    def run() -> Any:
        leaf.grad = None
        out = call()
        value(out).backward()  # type: ignore[no-untyped-call]
        return out

    return run


def passes(
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
            value=loss_of,
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
                with_backward(make(leaf, data["mask"]), leaf, loss_of),
                lambda: reference(plain, data["mask"]),
                grad_of=leaf,
                expected_grad=expected_grad,
                note=note,
                value=loss_of,
            )
        )
    return cases


# ---------------------------------------------------------------------------------------------
# ppo-ref's expected values (each side's reference; ppo-ref's own side calls the same functions)


def ref_group(data: dict[str, Tensor], method: str, eps: float) -> Callable[[], Tensor]:
    return lambda: ppo_ref.group_advantages(data["scores"], data["group_ids"], method, eps=eps)


def ref_policy(data: dict[str, Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    adv, old = data["advantages"], data["old_logp"]
    return lambda x, m: (
        ppo_ref.policy_loss(x, old, adv, m, CLIP, clip_eps_high=CLIP_HIGH, dual_clip=DUAL).loss
    )


def ref_gspo(data: dict[str, Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    adv, old = data["seq_advantages"], data["old_logp"]
    return lambda x, m: ppo_ref.gspo_loss(x, old, adv, m, GSPO_CLIP, clip_eps_high=GSPO_CLIP_HIGH).loss


def ref_cispo(data: dict[str, Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    adv, old = data["advantages"], data["old_logp"]
    return lambda x, m: ppo_ref.cispo_loss(x, old, adv, m, CISPO_LOW, CISPO_HIGH).loss


def ref_kl(
    data: dict[str, Tensor], estimator: str, agg: str = "token-mean"
) -> Callable[[Tensor, Tensor], Tensor]:
    ref = data["ref_logp"]
    return lambda x, m: ppo_ref.kl_loss(x, ref, m, estimator, agg)


def ref_agg(data: dict[str, Tensor], mode: str) -> Callable[[Tensor, Tensor], Tensor]:
    constant = float(data["mask"].shape[1]) if mode == "seq-mean-token-sum-norm" else None
    return lambda x, m: ppo_ref.aggregate_loss(x, m, mode, norm_constant=constant)


def ref_correction(data: dict[str, Tensor], variant: str) -> Callable[[], Tensor]:
    old, rollout, mask = data["old_logp"], data["rollout_logp"], data["mask"]
    if variant == "token-truncate":
        return lambda: ppo_ref.rollout_correction(old, rollout, mask, high=TIS_HIGH)
    return lambda: ppo_ref.rollout_correction(
        old, rollout, mask, level="sequence", mode="mask", low=MASK_LOW, high=MASK_HIGH
    )


def call_of(function: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Callable[[], Any]]:
    """``make(x, mask)`` for :func:`passes` from a function of (x, mask)."""
    return lambda x, m: lambda: function(x, m)


def check(case: Case) -> dict[str, float]:
    """Run ``case`` once; the largest difference of its value (and gradient) from ppo-ref's."""
    out = case.call()
    got = case.value(out).detach().double()
    expected_value = case.expected().detach().double()
    result = {"value": float((got - expected_value).abs().max()) if got.numel() else 0.0}
    if case.grad_of is not None and case.grad_of.grad is not None and case.expected_grad is not None:
        result["grad"] = float((case.grad_of.grad.double() - case.expected_grad().double()).abs().max())
    return result
