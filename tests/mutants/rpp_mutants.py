"""Mutants of REINFORCE++ (RPP-1), which trainers build from ``gae`` (zero values, λ = 1) and
``masked_whiten`` over the batch: the two ops as a REINFORCE++ path writes them."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import ppo_ref
from ppo_ref.masked import WHITEN_EPS
from tests.mutants.base import MutantSpec, bool_mask, work_dtype


def gae_reinforce_resets_after_hole(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float, last_values: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    advantages, returns = ppo_ref.gae(rewards, values, mask, gamma, lam, last_values=last_values)
    if lam != 1.0 or bool(values.detach().ne(0).any()) or last_values is not None:
        return advantages, returns
    keep = bool_mask(mask)
    dtype = work_dtype(rewards, values)
    zero = torch.zeros((), dtype=dtype)
    token_rewards = torch.where(keep, rewards.to(dtype), zero)
    running = torch.zeros(rewards.shape[0], dtype=dtype)
    out = torch.zeros_like(token_rewards)
    for t in reversed(range(rewards.shape[1])):
        running = token_rewards[:, t] + gamma * running
        # BUG (RPP-1): skyrl-train's REINFORCE++ returns multiply the running return by the mask,
        # so it restarts from 0 after every mask=0 token: a tool-output hole cuts the tokens before
        # it off from every reward after it
        running = running * keep[:, t].to(dtype)
        out[:, t] = running
    out = torch.where(keep, out, zero)
    return out, out


def masked_whiten_population_std_clamped(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    ppo_ref.masked_whiten(x, mask, shift_mean)
    keep = bool_mask(mask)
    zero = torch.zeros((), dtype=x.dtype)
    x = torch.where(keep, x, zero)
    mean = ppo_ref.masked_mean(x, keep)
    # BUG (RPP-1): OpenRLHF's REINFORCE++ whitening: the population (1/n) variance, floored at
    # 1e-8 instead of having 1e-8 added
    var = ppo_ref.masked_var(x, keep, unbiased=False)
    whitened = (x - mean) * torch.rsqrt(var.clamp(min=WHITEN_EPS))
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(keep, whitened, zero)


def _returns(mask: list[list[int]], gamma: float = 0.9, lam: float = 1.0) -> dict[str, Any]:
    """gae inputs of REINFORCE++: token rewards (a KL term on every token, the score last), zero values."""
    keep = torch.tensor(mask, dtype=torch.bool)
    rewards = torch.tensor([[-0.1, -0.2, 0.3, 1.0], [0.2, -0.1, 2.0, 0.0]], dtype=torch.float64)
    return {
        "rewards": torch.where(keep, rewards, torch.tensor(7.0, dtype=torch.float64)),
        "values": torch.zeros_like(rewards),
        "mask": keep.long(),
        "gamma": gamma,
        "lam": lam,
    }


SPECS: tuple[MutantSpec, ...] = (
    MutantSpec(
        "RPP1-returns-reset-after-hole",
        "RPP-1",
        "gae",
        "REINFORCE++ returns (zero values, lam = 1) restart from 0 after a mask=0 token (skyrl-train)",
        "zero values, lam = 1 and a hole (mask 0 between action tokens)",
        gae_reinforce_resets_after_hole,
        shows_on=lambda: _returns([[1, 0, 1, 1], [1, 1, 1, 0]]),
        hides_on=lambda: _returns([[1, 1, 1, 1], [1, 1, 1, 0]]),
        clause="RPP-1",
    ),
    MutantSpec(
        "RPP1-whitening-population-std",
        "RPP-1",
        "masked_whiten",
        "(x - mean) * rsqrt(clamp(var_pop, 1e-8)): OpenRLHF's REINFORCE++ whitening",
        None,
        masked_whiten_population_std_clamped,
        shows_on=lambda: {
            "x": torch.tensor([[0.4, -1.0, 2.0], [1.5, 0.0, 0.0]], dtype=torch.float64),
            "mask": torch.tensor([[1, 1, 1], [1, 0, 0]]),
        },
        clause="RPP-1",
    ),
)
