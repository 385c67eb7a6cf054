"""GAE has one implementation, and it is bit-identical to the plain recursion in the input's dtype.

``ppo_ref.gae`` vectorises the TD errors and keeps only the running advantage in a loop over
columns; its docstring promises the same float operations in the same order as the textbook
recursion (GAE-1..4). The trainer calls the same function, so its advantages are these bits too.
Here the recursion runs one element at a time on 0-dim tensors of the same dtype and must agree
with ``torch.equal`` (not a tolerance) on random batches with holes, padding, bootstrap values and
autograd on.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import Tensor

import ppo_ref
from ppo_ref import advantages


def _plain_gae(
    rewards: Tensor, values: Tensor, keep: Tensor, gamma: float, lam: float, last_values: Tensor | None
) -> tuple[Tensor, Tensor]:
    """The recursion of GAE-1..4, element by element on 0-dim tensors (holes skipped)."""
    advantages_out = torch.zeros_like(rewards)
    returns_out = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        next_value = last_values[b] if last_values is not None else torch.zeros((), dtype=rewards.dtype)
        running = torch.zeros((), dtype=rewards.dtype)
        for t in reversed(range(rewards.shape[1])):
            if not keep[b, t]:
                continue
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            running = delta + (gamma * lam) * running
            advantages_out[b, t] = running
            returns_out[b, t] = running + values[b, t]
            next_value = values[b, t]
    return advantages_out, returns_out


def _mask(kind: str, rows: int, steps: int, generator: torch.Generator) -> Tensor:
    if kind == "holes":
        return torch.rand(rows, steps, generator=generator) < 0.6
    if kind == "padded":  # prompt padding on the left is not GAE's business: responses, right-padded
        lengths = torch.randint(0, steps + 1, (rows,), generator=generator)
        return torch.arange(steps) < lengths.unsqueeze(1)
    return torch.ones(rows, steps, dtype=torch.bool)


CASES = [
    (kind, dtype, bootstrap, seed)
    for kind in ("holes", "padded", "full")
    for dtype in (torch.float32, torch.float64)
    for bootstrap in (False, True)
    for seed in range(4)
]


@pytest.mark.clause("GAE-1", "GAE-2", "GAE-3", "GAE-4")
@pytest.mark.parametrize(("kind", "dtype", "bootstrap", "seed"), CASES)
def test_gae_is_bitwise_the_plain_recursion(
    kind: str, dtype: torch.dtype, bootstrap: bool, seed: int
) -> None:
    generator = torch.Generator().manual_seed(1000 * seed + len(kind))
    rows, steps = 1 + seed * 5, 3 + seed * 7
    keep = _mask(kind, rows, steps, generator)
    rewards = (torch.randn(rows, steps, generator=generator) * 3).to(dtype)
    values = torch.randn(rows, steps, generator=generator).to(dtype)
    last_values = torch.randn(rows, generator=generator).to(dtype) if bootstrap else None
    gamma, lam = (1.0, 1.0) if seed == 0 else (float(torch.rand(1, generator=generator)), 0.95)
    # Off the mask: garbage that must never be read.
    rewards = torch.where(keep, rewards, torch.tensor(float("nan"), dtype=dtype))
    values = torch.where(keep, values, torch.tensor(float("inf"), dtype=dtype))

    got = ppo_ref.gae(rewards, values, keep, gamma, lam, last_values)
    want = _plain_gae(rewards, values, keep, gamma, lam, last_values)
    for name, g, w in zip(("advantages", "returns"), got, want, strict=True):
        assert g.dtype == dtype, name
        assert torch.equal(g, w), f"{name}: max |diff| {float((g - w).abs().max())}"

    # With autograd on, the same function (and so the same bits), and a finite gradient.
    graded = values.clone().requires_grad_(True)
    advantages_with_graph, _ = ppo_ref.gae(rewards, graded, keep, gamma, lam, last_values)
    assert torch.equal(advantages_with_graph.detach(), got[0])
    advantages_with_graph.sum().backward()  # type: ignore[no-untyped-call]
    assert graded.grad is not None and bool(torch.isfinite(graded.grad).all())


def test_gae_has_a_single_torch_implementation() -> None:
    """No second code path (the numpy recurrence is gone): the module does not import numpy."""
    source = inspect.getsource(advantages)
    assert "numpy" not in source
    assert [name for name in vars(advantages) if name.startswith("_recurrence")] == ["_recurrence"]
