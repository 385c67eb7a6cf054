"""Mutants of GAE (GAE-1..4): the backward recursion as trainers write it, with one mistake each."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

import ppo_ref
from ppo_ref.kl import last_action_index
from tests.mutants.base import MutantSpec, bool_mask, work_dtype

NAN = math.nan


def _start(
    rewards: Tensor, values: Tensor, last_values: Tensor | None
) -> tuple[torch.dtype, Tensor, Tensor, Tensor]:
    """(dtype, rewards, values, next value after the last column) in the working dtype."""
    dtype = work_dtype(rewards, values, *(() if last_values is None else (last_values,)))
    batch = rewards.shape[0]
    next_value = torch.zeros(batch, dtype=dtype) if last_values is None else last_values.to(dtype)
    return dtype, rewards.to(dtype), values.to(dtype), next_value


def _finish(advantages: Tensor, values: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    zero = torch.zeros((), dtype=advantages.dtype)
    advantages = torch.where(keep, advantages, zero)
    return advantages, torch.where(keep, advantages + values, zero)


def _backward(
    rewards: Tensor, values: Tensor, steps: Tensor, gamma: float, lam: float, next_value: Tensor
) -> Tensor:
    """The backward recursion over the positions where ``steps`` is True, carrying the next value
    and the running advantage across the others (correct when ``steps`` is the action mask)."""
    running = torch.zeros_like(next_value)
    advantages = torch.zeros_like(values)
    for t in reversed(range(steps.shape[1])):
        here = steps[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(here, delta + gamma * lam * running, running)
        next_value = torch.where(here, values[:, t], next_value)
        advantages[:, t] = running
    return advantages


def gae_over_response_attention_mask(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float, last_values: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    keep = bool_mask(mask)
    _, rewards, values, next_value = _start(rewards, values, last_values)
    # BUG (C8): the recursion's steps are the response's attention mask (every position up to the
    # last action token), so tool/observation tokens inside a response are ordinary steps
    steps = torch.arange(keep.shape[1]) <= last_action_index(keep).unsqueeze(1)
    return _finish(_backward(rewards, values, steps, gamma, lam, next_value), values, keep)


def gae_decaying_across_holes(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float, last_values: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    keep = bool_mask(mask)
    _, rewards, values, next_value = _start(rewards, values, last_values)
    running = torch.zeros_like(next_value)
    advantages = torch.zeros_like(values)
    for t in reversed(range(keep.shape[1])):
        here = keep[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        # BUG (C8, miles PR #1827): a skipped position still decays the running advantage by gamma*lam
        running = torch.where(here, delta + gamma * lam * running, gamma * lam * running)
        next_value = torch.where(here, values[:, t], next_value)
        advantages[:, t] = running
    return _finish(advantages, values, keep)


def gae_over_every_position(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float, last_values: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    keep = bool_mask(mask)
    dtype, rewards, values, next_value = _start(rewards, values, last_values)
    rewards = torch.where(keep, rewards, torch.zeros((), dtype=dtype))
    # BUG (C1, ROLL PR #447): the values are not masked and the loop runs over every position, so the
    # critic's values at padding and holes enter the deltas of the action tokens
    running = torch.zeros_like(next_value)
    advantages = torch.zeros_like(values)
    for t in reversed(range(keep.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running
        next_value = values[:, t]
        advantages[:, t] = running
    return _finish(advantages, values, keep)


def gae_terminal_value_after_eos(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float, last_values: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    keep = bool_mask(mask)
    dtype, rewards, values, next_value = _start(rewards, values, last_values)
    steps = keep.shape[1]
    if last_values is None and steps:
        after = last_action_index(keep) + 1
        stored = values.gather(1, after.clamp(max=steps - 1).unsqueeze(1)).squeeze(1)
        # BUG (C2, verl #1758): the value mask is shifted by one, so V(EOS + 1) is kept and used as
        # the value after a terminated response instead of 0
        next_value = torch.where(after < steps, stored, torch.zeros((), dtype=dtype))
    return _finish(_backward(rewards, values, keep, gamma, lam, next_value), values, keep)


def gae_ignoring_bootstrap(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float, last_values: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    # BUG (C3): last_values is not passed on, every length-cut response is treated as terminal
    return ppo_ref.gae(rewards, values, mask, gamma, lam)


def gae_truncation_from_padded_width(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float, last_values: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    if last_values is not None:
        keep = bool_mask(mask)
        # BUG (C3, AReaL PR #1637): "truncated" inferred from reaching the padded batch width
        reaches_width = last_action_index(keep) == keep.shape[1] - 1
        last_values = torch.where(reaches_width, last_values, torch.zeros((), dtype=last_values.dtype))
    return ppo_ref.gae(rewards, values, mask, gamma, lam, last_values=last_values)


def gae_returns_from_whitened_advantages(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float, last_values: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    keep = bool_mask(mask)
    advantages, _ = ppo_ref.gae(rewards, values, mask, gamma, lam, last_values=last_values)
    whitened = ppo_ref.masked_whiten(advantages, keep) if int(keep.sum()) >= 2 else advantages
    zero = torch.zeros((), dtype=advantages.dtype)
    # BUG (C4): the value targets are built after the advantages were whitened
    returns = torch.where(keep, whitened + values.to(advantages.dtype), zero)
    return advantages, returns


def gae_reward_one_step_late(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float, last_values: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    keep = bool_mask(mask)
    rewards = torch.where(keep, rewards, torch.zeros((), dtype=rewards.dtype))
    # BUG (C5, Spinning Up #50): the reward is stored with the next step (r_t placed at t + 1)
    shifted = torch.cat([torch.zeros_like(rewards[:, :1]), rewards[:, :-1]], dim=1)
    return ppo_ref.gae(shifted, values, mask, gamma, lam, last_values=last_values)


# --- specs ------------------------------------------------------------------------------------------


def _gae(mask: list[list[int]], gamma: float = 0.9, lam: float = 0.8, **extra: Any) -> dict[str, Any]:
    """Two rows of four positions; masked-out rewards and values hold junk (NaN unless given)."""
    keep = torch.tensor(mask, dtype=torch.bool)
    fill = extra.pop("fill", NAN)
    rewards = torch.tensor([[0.1, -0.2, 0.3, 1.0], [0.0, 0.5, -0.4, 2.0]])
    values = torch.tensor([[0.2, 0.4, 0.7, -0.3], [1.0, -0.5, 0.3, 0.6]])
    return {
        "rewards": torch.where(keep, rewards, torch.tensor(fill)),
        "values": torch.where(keep, values, torch.tensor(fill)),
        "mask": keep.long(),
        "gamma": gamma,
        "lam": lam,
        **extra,
    }


FULL = [[1, 1, 1, 1], [1, 1, 1, 1]]
PADDED = [[1, 1, 0, 0], [1, 1, 1, 0]]
HOLES = [[1, 0, 1, 1], [1, 1, 0, 1]]
BOOTSTRAP = torch.tensor([0.5, -1.5])

SPECS: tuple[MutantSpec, ...] = (
    MutantSpec(
        "C8-holes-as-ordinary-steps",
        "C8",
        "gae",
        "the recursion runs over the response's attention mask, observation tokens as ordinary steps",
        "masks with holes",
        gae_over_response_attention_mask,
        shows_on=lambda: _gae(HOLES, fill=0.0),
        hides_on=lambda: _gae(PADDED, last_values=BOOTSTRAP),
    ),
    MutantSpec(
        "C8-holes-decay-running-advantage",
        "C8",
        "gae",
        "holes carry the next value but decay the running advantage by gamma*lam (miles PR #1827)",
        "holes with gamma * lam < 1",
        gae_decaying_across_holes,
        shows_on=lambda: _gae(HOLES),
        hides_on=lambda: _gae(HOLES, gamma=1.0, lam=1.0, last_values=BOOTSTRAP),
    ),
    MutantSpec(
        "C1-padding-values-leak-into-gae",
        "C1",
        "gae",
        "values are not masked and the loop runs over every position (ROLL PR #447)",
        "padding or holes (masked-out values enter the deltas)",
        gae_over_every_position,
        shows_on=lambda: _gae(PADDED, fill=100.0),
        hides_on=lambda: _gae(FULL, last_values=BOOTSTRAP),
    ),
    MutantSpec(
        "C2-terminal-value-after-eos",
        "C2",
        "gae",
        "a terminated row bootstraps from V(EOS + 1), the value stored after its last action token",
        "terminal rows shorter than T",
        gae_terminal_value_after_eos,
        shows_on=lambda: _gae(PADDED, fill=0.5),
        hides_on=lambda: _gae(HOLES),
    ),
    MutantSpec(
        "C3-bootstrap-dropped",
        "C3",
        "gae",
        "last_values is not passed on: a length-cut response is treated as terminal",
        "truncated rows (last_values given)",
        gae_ignoring_bootstrap,
        shows_on=lambda: _gae(PADDED, last_values=BOOTSTRAP),
        hides_on=lambda: _gae(PADDED),
    ),
    MutantSpec(
        "C3-truncation-from-padded-width",
        "C3",
        "gae",
        "only rows reaching the padded width bootstrap (AReaL PR #1637 infers truncation from length)",
        "truncated rows shorter than the padded width",
        gae_truncation_from_padded_width,
        shows_on=lambda: _gae(PADDED, last_values=BOOTSTRAP),
        hides_on=lambda: _gae(HOLES, last_values=BOOTSTRAP),
    ),
    MutantSpec(
        "C4-returns-from-whitened-advantages",
        "C4",
        "gae",
        "returns = whiten(advantages) + values instead of the raw advantages plus values",
        None,
        gae_returns_from_whitened_advantages,
        shows_on=lambda: _gae(PADDED),
    ),
    MutantSpec(
        "C5-reward-one-step-late",
        "C5",
        "gae",
        "the reward of action t is used at step t + 1 (Spinning Up #50)",
        None,
        gae_reward_one_step_late,
        shows_on=lambda: _gae(FULL),
    ),
)
