"""Truncated sampling (top-k, top-p): which tokens a step keeps, and the mass a policy puts on them.

The sampler (:mod:`ppo_ref.trainer.generation`) draws from ``p = softmax(logits / T)`` restricted to
its kept set and renormalised: ``q = p / S`` on the set, ``S`` the set's mass under ``p``. A rollout
correction that weighs the trained policy's full-vocabulary log-prob against ``log q`` reads
``log S`` as a mismatch: with the two policies equal its weight is ``S``, not 1 (spec IS-3, the
pattern of TRL #6789). So the sampler records how many tokens each step kept (:func:`kept_count`):
the kept set is always the ``n`` most probable tokens. The trainer renormalises its old log-prob
over its own ``n`` most probable tokens (:func:`support_logmass`): the sampler's set replayed,
wherever the two rank the tokens alike (always, for the same weights at any temperature: dividing
by ``T`` keeps the order).
"""

from __future__ import annotations

import torch
from torch import Tensor


def kept_in_sorted(sorted_probs: Tensor, top_k: int, top_p: float) -> Tensor:
    """(..., V) bool: which of the probabilities ``sorted_probs`` (..., V), sorted in descending
    order, the sampler keeps: the ``top_k`` most probable (0 = all) and, of those, each token while
    the mass before it is below ``top_p`` (the smallest prefix whose mass reaches ``top_p``; 1 = all).
    Example: ``[0.5, 0.3, 0.2]`` with ``top_p=0.6`` -> ``[True, True, False]``; with ``top_k=1`` ->
    ``[True, False, False]``.
    """
    _check_top(top_k, top_p)
    keep = (sorted_probs.cumsum(dim=-1) - sorted_probs) < top_p
    if top_k > 0:
        keep[..., top_k:] = False
    return keep


def _check_sampling(logits: Tensor, temperature: float, top_k: int, top_p: float) -> None:
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits: expected shape (..., V) with V >= 1, got {tuple(logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature: expected a number > 0, got {temperature!r}")
    _check_top(top_k, top_p)


def _check_top(top_k: int, top_p: float) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k: expected an int >= 0 (0 = all tokens), got {top_k!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p: expected a number in (0, 1], got {top_p!r}")


def _log_softmax64(logits: Tensor, temperature: float) -> Tensor:
    """``log_softmax(logits / temperature)`` in float64, from at least float32 logits (as the sampler)."""
    wide = logits if logits.dtype == torch.float64 else logits.float()
    return torch.log_softmax(wide / temperature, dim=-1).double()


def kept_count(logits: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """(...,) int64: how many tokens the sampler keeps at each position of ``logits`` (..., V).

    The kept set of ``softmax(logits / temperature)`` under ``top_k`` / ``top_p``
    (:func:`kept_in_sorted`) is its ``n`` most probable tokens; ``n = V`` without truncation.
    Example: logits ``[[2., 1., 0.]]`` at temperature 1 (``p = [0.665, 0.245, 0.090]``) with
    ``top_p=0.8`` -> ``[2]``; with ``top_k=1`` -> ``[1]``; with neither -> ``[3]``.
    """
    _check_sampling(logits, temperature, top_k, top_p)
    if top_k == 0 and top_p == 1.0:
        return torch.full(logits.shape[:-1], logits.shape[-1], dtype=torch.int64, device=logits.device)
    probs = _log_softmax64(logits, temperature).exp().sort(dim=-1, descending=True).values
    return kept_in_sorted(probs, top_k, top_p).sum(dim=-1)


def support_logmass(logits: Tensor, counts: Tensor, temperature: float) -> Tensor:
    """(...,) float64 ``log S = log sum_{i < n} p_(i)``: the log of the mass ``p = softmax(logits /
    temperature)`` puts on its ``n`` most probable tokens, ``n = counts`` (...,) an integer tensor in
    ``[1, V]`` (what :func:`kept_count` records). A token ``y`` among them has, under ``p``
    renormalised over them, ``log q(y) = log p(y) - log S``; ``n = V`` gives exactly ``log S = 0``.
    Example: logits ``[[2., 1., 0.]]`` at temperature 1, counts ``[2]`` -> ``log(0.665 + 0.245) =
    -0.0943``; counts ``[3]`` -> ``0``.
    """
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits: expected shape (..., V) with V >= 1, got {tuple(logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature: expected a number > 0, got {temperature!r}")
    if counts.shape != logits.shape[:-1]:
        raise ValueError(
            f"counts: expected shape {tuple(logits.shape[:-1])} (logits' less V), got {tuple(counts.shape)}"
        )
    if counts.dtype.is_floating_point or counts.dtype == torch.bool or counts.is_complex():
        raise ValueError(f"counts: expected an integer tensor, got {counts.dtype}")
    vocabulary = logits.shape[-1]
    if counts.numel() and not bool(((counts >= 1) & (counts <= vocabulary)).all()):
        raise ValueError(
            f"counts: expected every count in [1, {vocabulary}] (V), got {counts.min()}..{counts.max()}"
        )
    ordered = _log_softmax64(logits, temperature).sort(dim=-1, descending=True).values
    running = torch.logcumsumexp(ordered, dim=-1)
    kept = running.gather(-1, (counts.long() - 1).unsqueeze(-1)).squeeze(-1)
    return torch.where(counts == vocabulary, torch.zeros((), dtype=kept.dtype, device=kept.device), kept)
