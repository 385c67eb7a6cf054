"""Mutants of the group-relative advantages (GRP-1..4, RPP-2): GRPO, Dr. GRPO and RLOO as trainers
write them, with one mistake each."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

import ppo_ref
from tests.mutants.base import MutantSpec, work_dtype

SQRT2 = math.sqrt(2.0)


def _groups(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(scores in the working dtype, each row's group index, group sizes per row, group means per row)."""
    r = scores.to(work_dtype(scores))
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    sums = torch.zeros(counts.shape[0], dtype=r.dtype).index_add(0, inverse, r)
    n = counts.to(r.dtype)[inverse]
    return r, inverse, n, (sums / counts.to(r.dtype))[inverse]


def _group_std(centered: Tensor, inverse: Tensor, n: Tensor, ddof: int) -> Tensor:
    """Each row's group standard deviation with ``n - ddof`` in the denominator."""
    squares = torch.zeros(int(inverse.max()) + 1, dtype=centered.dtype).index_add(0, inverse, centered**2)
    return (squares[inverse] / (n - ddof).clamp(min=1)).sqrt()


# --- GRP-1: the formulas ---------------------------------------------------------------------------


def group_advantages_population_std(
    scores: Tensor,
    group_ids: Tensor,
    method: str = "grpo",
    *,
    std_scope: str = "group",
    eps: float = 1e-6,
    singleton: str = "zero",
) -> Tensor:
    if method != "grpo" or std_scope != "group":
        return ppo_ref.group_advantages(
            scores, group_ids, method, std_scope=std_scope, eps=eps, singleton=singleton
        )
    r, inverse, n, mean = _groups(scores, group_ids)
    centered = r - mean
    # BUG (GRP-1): the group std divides by n (numpy's np.std default, torch unbiased=False), not n - 1
    advantages = centered / (_group_std(centered, inverse, n, ddof=0) + eps)
    return torch.where((n < 2) | (centered == 0), torch.zeros((), dtype=r.dtype), advantages)


def group_advantages_dr_grpo_scaled(
    scores: Tensor,
    group_ids: Tensor,
    method: str = "grpo",
    *,
    std_scope: str = "group",
    eps: float = 1e-6,
    singleton: str = "zero",
) -> Tensor:
    # BUG (axolotl PR #3731): `if args.scale_rewards:` is true for every non-empty string once TRL
    # turned the flag into "group"/"batch"/"none", so Dr. GRPO still divides by the group std
    if method == "dr_grpo":
        method = "grpo"
    return ppo_ref.group_advantages(
        scores, group_ids, method, std_scope=std_scope, eps=eps, singleton=singleton
    )


# --- GRP-2: std scope and epsilon -------------------------------------------------------------------


def group_advantages_eps_inside_sqrt(
    scores: Tensor,
    group_ids: Tensor,
    method: str = "grpo",
    *,
    std_scope: str = "group",
    eps: float = 1e-6,
    singleton: str = "zero",
) -> Tensor:
    if method != "grpo" or std_scope != "group":
        return ppo_ref.group_advantages(
            scores, group_ids, method, std_scope=std_scope, eps=eps, singleton=singleton
        )
    r, inverse, n, mean = _groups(scores, group_ids)
    centered = r - mean
    variance = _group_std(centered, inverse, n, ddof=1) ** 2
    # BUG (GRP-2): eps added to the variance under the square root, (r - mu) / sqrt(var + eps)
    advantages = centered / (variance + eps).sqrt()
    return torch.where((n < 2) | (centered == 0), torch.zeros((), dtype=r.dtype), advantages)


def group_advantages_batch_scope_ignored(
    scores: Tensor,
    group_ids: Tensor,
    method: str = "grpo",
    *,
    std_scope: str = "group",
    eps: float = 1e-6,
    singleton: str = "zero",
) -> Tensor:
    # BUG (axolotl PR #3731 again): the string flag tested for truth, so scale_rewards="batch"
    # takes the group branch: every group divided by its own std, not the batch's
    scope = "group" if std_scope == "batch" else std_scope
    return ppo_ref.group_advantages(scores, group_ids, method, std_scope=scope, eps=eps, singleton=singleton)


# --- GRP-3: singletons and constant groups ----------------------------------------------------------


def group_advantages_singleton_is_raw_score(
    scores: Tensor,
    group_ids: Tensor,
    method: str = "grpo",
    *,
    std_scope: str = "group",
    eps: float = 1e-6,
    singleton: str = "zero",
) -> Tensor:
    advantages = ppo_ref.group_advantages(
        scores, group_ids, method, std_scope=std_scope, eps=eps, singleton=singleton
    )
    r, _, n, _ = _groups(scores, group_ids)
    # BUG (GRP-3): verl's and skyrl's group normalisation set mu = 0 and sigma = 1 for a group of one,
    # so a singleton's advantage is its raw score (verl core_algos, skyrl-train ppo_utils)
    return torch.where(n < 2, r, advantages.to(r.dtype))


def group_advantages_rloo_unguarded(
    scores: Tensor,
    group_ids: Tensor,
    method: str = "grpo",
    *,
    std_scope: str = "group",
    eps: float = 1e-6,
    singleton: str = "zero",
) -> Tensor:
    if method != "rloo" or singleton == "error":
        return ppo_ref.group_advantages(
            scores, group_ids, method, std_scope=std_scope, eps=eps, singleton=singleton
        )
    r, _, n, mean = _groups(scores, group_ids)
    # BUG (GRP-3): OpenRLHF's rloo divides the leave-one-out sum by n - 1 with no guard: 0 / 0 = NaN
    # for a group of one (the larger groups as the reference computes them, so the mutant is exactly
    # the declarable group_singleton={"rloo": "unguarded"}: issue 20)
    baseline = (mean * n - r) / (n - 1)
    reference = ppo_ref.group_advantages(scores, group_ids, method, std_scope=std_scope, eps=eps)
    return torch.where(n < 2, r - baseline, reference.to(r.dtype))


def group_advantages_constant_group_unguarded(
    scores: Tensor,
    group_ids: Tensor,
    method: str = "grpo",
    *,
    std_scope: str = "group",
    eps: float = 1e-6,
    singleton: str = "zero",
) -> Tensor:
    if method != "grpo" or std_scope != "group":
        return ppo_ref.group_advantages(
            scores, group_ids, method, std_scope=std_scope, eps=eps, singleton=singleton
        )
    r, inverse, n, mean = _groups(scores, group_ids)
    centered = r - mean
    # BUG (GRP-3): no constant-group guard: with eps = 0 a group of equal scores gives 0 / 0 = NaN
    advantages = centered / (_group_std(centered, inverse, n, ddof=1) + eps)
    return torch.where(n < 2, torch.zeros((), dtype=r.dtype), advantages)


# --- GRP-4: identities (row order) ------------------------------------------------------------------


def group_advantages_contiguous_groups(
    scores: Tensor,
    group_ids: Tensor,
    method: str = "grpo",
    *,
    std_scope: str = "group",
    eps: float = 1e-6,
    singleton: str = "zero",
) -> Tensor:
    sizes = torch.unique(group_ids, return_counts=True)[1]
    n = int(sizes[0]) if sizes.numel() else 1
    if sizes.numel() == 0 or bool((sizes != n).any()) or n < 2:
        return ppo_ref.group_advantages(
            scores, group_ids, method, std_scope=std_scope, eps=eps, singleton=singleton
        )
    # BUG (GRP-4): TRL's rewards.view(-1, num_generations): groups are assumed to be consecutive
    # blocks of n rows, whatever group_ids says
    blocks = torch.arange(scores.shape[0]) // n
    return ppo_ref.group_advantages(scores, blocks, method, std_scope=std_scope, eps=eps, singleton=singleton)


# --- RPP-2: the REINFORCE++-baseline ----------------------------------------------------------------


def group_advantages_batch_mean_baseline(
    scores: Tensor,
    group_ids: Tensor,
    method: str = "grpo",
    *,
    std_scope: str = "group",
    eps: float = 1e-6,
    singleton: str = "zero",
) -> Tensor:
    if method != "dr_grpo":
        return ppo_ref.group_advantages(
            scores, group_ids, method, std_scope=std_scope, eps=eps, singleton=singleton
        )
    r, _, n, _ = _groups(scores, group_ids)
    if singleton == "error" and bool((n < 2).any()):
        return ppo_ref.group_advantages(scores, group_ids, method, singleton=singleton)
    # BUG (RPP-2): the baseline is the batch mean (REINFORCE++'s global baseline), not the group mean
    # of the REINFORCE++-baseline: prompts of different difficulty shift each other's advantages
    return torch.where(n < 2, torch.zeros((), dtype=r.dtype), r - r.mean())


# --- specs ------------------------------------------------------------------------------------------


def _group(
    scores: list[float], ids: list[int], method: str = "grpo", dtype: torch.dtype = torch.float64, **kw: Any
) -> dict[str, Any]:
    return {
        "scores": torch.tensor(scores, dtype=dtype),
        "group_ids": torch.tensor(ids),
        "method": method,
        **kw,
    }


TWO_GROUPS = ([1.0, 0.0, 0.0, 3.0, 2.0, 2.5], [4, 4, 4, 9, 9, 9])

SPECS: tuple[MutantSpec, ...] = (
    MutantSpec(
        "GRP1-grpo-population-std",
        "GRP-1",
        "group_advantages",
        "grpo divides by the group std with n in the denominator (np.std), not n - 1",
        None,
        group_advantages_population_std,
        shows_on=lambda: _group(*TWO_GROUPS),
        clause="GRP-1",
    ),
    MutantSpec(
        "axolotl-PR3731-dr-grpo-divides-by-std",
        "axolotl-PR#3731",
        "group_advantages",
        "dr_grpo divides by the group std (`if scale_rewards:` true for the string 'none')",
        "method='dr_grpo' with a group whose std is not 1",
        group_advantages_dr_grpo_scaled,
        shows_on=lambda: _group(*TWO_GROUPS, "dr_grpo"),
        # each group's std (Bessel) is exactly 1: dividing by it changes nothing
        hides_on=lambda: _group([0.0, SQRT2, 5.0, 5.0 + SQRT2], [4, 4, 9, 9], "dr_grpo", eps=0.0),
        clause="GRP-1",
    ),
    MutantSpec(
        "GRP2-eps-inside-sqrt",
        "GRP-2",
        "group_advantages",
        "grpo computes (r - mu) / sqrt(var + eps) instead of (r - mu) / (std + eps)",
        "a group whose std is comparable to sqrt(eps) (near-constant scores)",
        group_advantages_eps_inside_sqrt,
        shows_on=lambda: _group([1.0, 1.0 + 1e-3, 1.0], [0, 0, 0]),
        hides_on=lambda: _group([1.0, 2.0, 1.0], [0, 0, 0]),
        clause="GRP-2",
    ),
    MutantSpec(
        "axolotl-PR3731-batch-std-scope-ignored",
        "axolotl-PR#3731",
        "group_advantages",
        "std_scope='batch' takes the group branch: each group divided by its own std",
        "std_scope='batch' with several groups (the batch std differs from a group's)",
        group_advantages_batch_scope_ignored,
        shows_on=lambda: _group(*TWO_GROUPS, std_scope="batch"),
        hides_on=lambda: _group([1.0, 0.0, 0.0], [4, 4, 4], std_scope="batch"),
        clause="GRP-2",
    ),
    MutantSpec(
        "GRP3-singleton-is-raw-score",
        "GRP-3",
        "group_advantages",
        "a group of one gets mu = 0 and sigma = 1, so A = r (verl, skyrl-train group normalisation)",
        "a group with a single sample and a non-zero score",
        group_advantages_singleton_is_raw_score,
        shows_on=lambda: _group([1.0, 0.0, 0.0, 2.5], [4, 4, 4, 9]),
        hides_on=lambda: _group([1.0, 0.0, 0.0, 2.5, 2.0], [4, 4, 4, 9, 9]),
        clause="GRP-3",
    ),
    MutantSpec(
        "GRP3-rloo-divides-by-zero",
        "GRP-3",
        "group_advantages",
        "rloo divides the leave-one-out sum by n - 1 with no guard (OpenRLHF): NaN for a group of one",
        "method='rloo' with a group of a single sample",
        group_advantages_rloo_unguarded,
        shows_on=lambda: _group([1.0, 0.0, 0.0, 2.5], [4, 4, 4, 9], "rloo"),
        hides_on=lambda: _group([1.0, 0.0, 0.0, 2.5, 2.0], [4, 4, 4, 9, 9], "rloo"),
        clause="GRP-3",
        convention={"group_singleton": {"rloo": "unguarded"}},
    ),
    MutantSpec(
        "GRP3-constant-group-nan",
        "GRP-3",
        "group_advantages",
        "grpo has no constant-group guard: with eps = 0 equal scores give 0 / 0 = NaN",
        "a group of equal scores with eps = 0",
        group_advantages_constant_group_unguarded,
        shows_on=lambda: _group([1.0, 0.0, 0.5, 0.5], [4, 4, 9, 9], eps=0.0),
        hides_on=lambda: _group([1.0, 0.0, 0.5, 0.7], [4, 4, 9, 9], eps=0.0),
        clause="GRP-3",
    ),
    MutantSpec(
        "GRP4-groups-assumed-contiguous",
        "GRP-4",
        "group_advantages",
        "scores.view(-1, n) (TRL's num_generations): groups taken as consecutive blocks, ids ignored",
        "equal-size groups whose rows are not consecutive blocks in id order",
        group_advantages_contiguous_groups,
        shows_on=lambda: _group(TWO_GROUPS[0], [4, 9, 4, 9, 4, 9]),
        hides_on=lambda: _group(*TWO_GROUPS),
        clause="GRP-4",
    ),
    MutantSpec(
        "RPP2-baseline-is-batch-mean",
        "RPP-2",
        "group_advantages",
        "dr_grpo (the REINFORCE++-baseline's r - mean_g) subtracts the batch mean, not the group mean",
        "method='dr_grpo' with groups of different means",
        group_advantages_batch_mean_baseline,
        shows_on=lambda: _group(*TWO_GROUPS, "dr_grpo"),
        hides_on=lambda: _group([1.0, 0.0, 0.5, 0.0, 1.0, 0.5], [4, 4, 4, 9, 9, 9], "dr_grpo"),
        clause="RPP-2",
    ),
)
