"""STEP-8 of the trainer-step tier: the step-0 ratio and the rollout-correction weight when the
rollout sampled with top-k / top-p.

A sampler that truncates draws from ``q = p / S`` on its kept set (``p = softmax(logits / T)``,
``S`` the kept set's mass under ``p``) and reports ``log q`` for each token it drew (vLLM's
``processed_logprobs``). A trainer that recomputes the old log-probs over the whole vocabulary
gets ``log p = log q + log S``. Two facts follow, which STEP-8 checks on a library's own step:

1. The PPO ratio at step 0 must be 1 on every action token: its two log-probs must be on one
   support (both full, or both renormalised on the kept set). A ratio built from the sampler's
   ``log q`` and a full ``log p`` is ``S`` at step 0 (known-bugs A3; TRL #6945, verl's
   ``bypass_mode``): a FAIL whatever the library declares.
2. The rollout-correction weight ``exp(log old - log q)`` must be what the library's declared
   convention (:data:`SAMPLING_CONVENTIONS`) gives: 1 where it replays the sampler's support
   (``"truncated"``, spec IS-3), the kept mass ``S`` per token where it compares the full
   distribution with the truncated one (``"full"``: the bias of TRL #6789, a declared convention,
   measured and shown).

The suite builds the rollout itself (:func:`sampled_rollout`): completions drawn token by token
from the runner's own model (its ``policy_logits``) under one truncation, the sampler's
``log q`` of every drawn token and its kept set, in float64. A runner feeds them to its library's
step with its rollout correction at the token level (``sampling_run``) and returns the weights as
the output ``correction_weights``; :func:`sampling_problems` judges them.

Example (the kept set of ``p = [0.5, 0.25, 0.15, 0.10]`` at ``top_p = 0.8``: a token is kept
while the mass before it is below 0.8)::

    >>> import torch
    >>> kept_set(torch.tensor([0.5, 0.25, 0.15, 0.10], dtype=torch.float64).log(), 0, 0.8)
    (0, 1, 2)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ppo_ref.adapters.step_types import RATIO_TOLERANCE, StepBatch, StepResult

__all__ = [
    "BOUNDARY_MARGIN",
    "SAMPLINGS",
    "SAMPLING_CONVENTIONS",
    "WEIGHT_TOLERANCE",
    "SampledRollout",
    "kept_set",
    "sampled_rollout",
    "sampling_problems",
]

SAMPLING_CONVENTIONS: tuple[str, ...] = ("full", "truncated")
"""STEP-8: the support of the old log-probs a library's rollout correction compares with the
sampler's: ``"full"`` (a softmax over the whole vocabulary: the weight is the kept mass ``S``) or
``"truncated"`` (renormalised over the sampler's kept set: the weight is 1 where the policies agree)."""
SAMPLINGS: tuple[tuple[int, float], ...] = ((0, 0.8), (4, 1.0))
"""STEP-8's truncations, ``(top_k, top_p)``: nucleus sampling at 0.8, then the 4 most probable tokens."""
WEIGHT_TOLERANCE = 1e-5
"""STEP-8: ``max |weight - expected|`` over the action tokens (float32 trainers agree to about 1e-7)."""
BOUNDARY_MARGIN = 1e-5
"""STEP-8: every cumulative mass stays this far from ``top_p``, and the log-probs on either side of
the top-k cut this far apart, so that kernels that locate the boundary differently (``cumsum - p <
top_p``, or an ascending cumsum ``<= 1 - top_p``) or in float32 keep the same set."""
_FIRST_ORDINARY = 3  # the step vocabulary's <pad> 0, <eos> 1, <bos> 2, then ordinary tokens
_PLACEHOLDER = _FIRST_ORDINARY  # the column whose logits the next draw reads is never scored


@dataclass(frozen=True)
class SampledRollout:
    """A rollout sampled under one truncation, with what the sampler reported (STEP-8).

    Attributes:
        batch: the completions drawn (a :class:`StepBatch`; rows stop at their first EOS or the budget).
        top_k, top_p: the truncation (0 / 1.0: off).
        logprobs: per row, the sampler's ``log q`` of each completion token (renormalised over the
            kept set, at the runner's sampling temperature).
        full_logprobs: per row, ``log p`` of each token under the whole vocabulary.
        kept: per row and token, the kept set's token ids, most probable first.
    """

    batch: StepBatch
    top_k: int
    top_p: float
    logprobs: tuple[tuple[float, ...], ...]
    full_logprobs: tuple[tuple[float, ...], ...]
    kept: tuple[tuple[tuple[int, ...], ...], ...]

    def padded(self, name: str, width: int | None = None, fill: float = 0.0) -> Tensor:
        """(B, width) float64: ``logprobs``, ``full_logprobs`` or ``kept_mass`` (``exp(log p - log
        q)``), right-padded with ``fill`` to ``width`` (None: the longest row)."""
        if name not in ("logprobs", "full_logprobs", "kept_mass"):
            raise ValueError(f"name: expected logprobs, full_logprobs or kept_mass, got {name!r}")
        longest = max(len(row) for row in self.logprobs)
        width = longest if width is None else width
        if width < longest:
            raise ValueError(f"width: expected an int >= {longest}, got {width!r}")
        out = torch.full((len(self.logprobs), width), fill, dtype=torch.float64)
        for i, (q, p) in enumerate(zip(self.logprobs, self.full_logprobs, strict=True)):
            if name == "kept_mass":
                row: tuple[float, ...] = tuple(math.exp(a - b) for a, b in zip(p, q, strict=True))
            else:
                row = q if name == "logprobs" else p
            out[i, : len(q)] = torch.tensor(row, dtype=torch.float64)
        return out

    def kept_counts(self, width: int | None = None) -> Tensor:
        """(B, width) int64: the kept set's size at each completion token, 1 in the padding."""
        longest = max(len(row) for row in self.kept)
        width = longest if width is None else width
        out = torch.ones((len(self.kept), width), dtype=torch.long)
        for i, row in enumerate(self.kept):
            out[i, : len(row)] = torch.tensor([len(s) for s in row])
        return out


def kept_set(logprobs: Tensor, top_k: int, top_p: float) -> tuple[int, ...]:
    """The token ids a sampler keeps from the distribution ``logprobs`` (V,) (float64 log-probs),
    most probable first: the ``top_k`` most probable (0: all) and, of those, each token while the
    mass before it is below ``top_p``. ValueError where a boundary lies within
    :data:`BOUNDARY_MARGIN` (two kernels could keep different sets)."""
    _check_truncation(top_k, top_p)
    probs, order = torch.sort(logprobs.double().exp(), descending=True)
    before = torch.cumsum(probs, 0) - probs
    n = len(probs) if top_p >= 1 else int((before < top_p).sum())
    if top_p < 1 and bool(((before[1:] - top_p).abs() < BOUNDARY_MARGIN).any()):
        raise ValueError(
            f"top_p: {top_p} lies within {BOUNDARY_MARGIN:g} of a cumulative mass {before.tolist()}"
        )
    if 0 < top_k < len(probs):
        if float(probs[top_k - 1].log() - probs[top_k].log()) < BOUNDARY_MARGIN:
            raise ValueError(
                f"top_k: the log-probs on either side of the cut at {top_k} tie within {BOUNDARY_MARGIN:g}"
            )
        n = min(n, top_k)
    return tuple(int(t) for t in order[:n])


def _check_truncation(top_k: int, top_p: float) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k: expected an int >= 0 (0 = off), got {top_k!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"top_p: expected a number in (0, 1], got {top_p!r}")


def sampled_rollout(
    logits_of: Callable[[StepBatch], Tensor],
    template: StepBatch,
    top_k: int,
    top_p: float,
    seed: int = 0,
) -> SampledRollout:
    """Draw ``template``'s rows again from the model behind ``logits_of`` under ``top_k`` / ``top_p``.

    ``logits_of(batch)`` gives (B, L, V) logits at each completion position of ``batch`` (the
    runner's ``policy_logits``: its model before any update, divided by its sampling temperature;
    position t predicts token t). The prompts, scores, group size, budget and ids are
    ``template``'s. Each row is drawn token by token (``budget`` calls): a token among the kept set
    (EOS or an ordinary token, never the pad or BOS id of the step vocabulary), chosen with a
    seeded uniform in proportion to ``q``; a row ends at its first EOS or at the budget. Returns the
    batch, the sampler's ``log q`` of each token, its ``log p`` and the kept sets.
    """
    if not callable(logits_of):
        raise ValueError(f"logits_of: expected a callable batch -> (B, L, V) logits, got {logits_of!r}")
    if not isinstance(template, StepBatch):
        raise ValueError(f"template: expected a StepBatch, got {type(template).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: expected an int, got {seed!r}")
    _check_truncation(top_k, top_p)
    B, V = template.size, template.vocab_size
    generator = torch.Generator().manual_seed(seed)
    rows: list[list[int]] = [[] for _ in range(template.size)]
    q_rows: list[list[float]] = [[] for _ in rows]
    p_rows: list[list[float]] = [[] for _ in rows]
    kept_rows: list[list[tuple[int, ...]]] = [[] for _ in rows]
    for t in range(template.budget):
        open_rows = [i for i, row in enumerate(rows) if not row or row[-1] != template.eos_id]
        if not open_rows:
            break
        prefix = tuple(
            tuple(row) if i not in open_rows else (*row, _PLACEHOLDER) for i, row in enumerate(rows)
        )
        logits = logits_of(replace(template, completions=prefix, budget=t + 1))
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else None
        if shape is None or len(shape) != 3 or shape[1] <= t or (shape[0], shape[2]) != (B, V):
            raise ValueError(
                f"logits_of: expected a (B={B}, L > {t}, V={V}) tensor, got {shape or type(logits).__name__}"
            )
        for i in open_rows:
            logp = torch.log_softmax(logits[i, t].double(), dim=-1)
            kept = kept_set(logp, top_k, top_p)
            allowed = [token for token in kept if token == template.eos_id or token >= _FIRST_ORDINARY]
            if not allowed:
                raise ValueError(
                    f"template: row {i}'s kept set {kept} at token {t} holds no EOS or ordinary token"
                )
            weights = logp[allowed].exp()
            draw = float(torch.rand((), generator=generator, dtype=torch.float64)) * float(weights.sum())
            index = min(int((torch.cumsum(weights, 0) <= draw).sum()), len(allowed) - 1)
            token = allowed[index]
            log_mass = math.log(float(logp[list(kept)].exp().sum()))
            rows[i].append(token)
            p_rows[i].append(float(logp[token]))
            q_rows[i].append(float(logp[token]) - log_mass)
            kept_rows[i].append(kept)
    batch = replace(template, completions=tuple(tuple(r) for r in rows))
    return SampledRollout(
        batch,
        top_k,
        float(top_p),
        tuple(map(tuple, q_rows)),
        tuple(map(tuple, p_rows)),
        tuple(map(tuple, kept_rows)),
    )


def sampling_problems(sampled: SampledRollout, result: StepResult, convention: str) -> tuple[list[str], str]:
    """STEP-8's verdict on ``result``, a runner's ``sampling_run`` on ``sampled``: the failures, and
    a measure to show (the kept mass and the weights).

    Fails where the step-0 PPO ratio is not 1 (``max_abs_log_ratio`` above
    :data:`~ppo_ref.adapters.step.RATIO_TOLERANCE`, or not reported), where the output
    ``correction_weights`` is missing or not (B, >= longest row), or where a weight on an action
    token is more than :data:`WEIGHT_TOLERANCE` from the convention's: 1 (``"truncated"``) or the
    token's kept mass ``S`` (``"full"``).
    """
    if not isinstance(sampled, SampledRollout):
        raise ValueError(f"sampled: expected a SampledRollout, got {type(sampled).__name__}")
    if not isinstance(result, StepResult):
        raise ValueError(f"result: expected a StepResult, got {type(result).__name__}")
    if convention not in SAMPLING_CONVENTIONS:
        raise ValueError(f"convention: expected one of {', '.join(SAMPLING_CONVENTIONS)}, got {convention!r}")
    label = f"top_k {sampled.top_k}, top_p {sampled.top_p:g}"
    problems: list[str] = []
    ratio = result.stats.get("max_abs_log_ratio")
    if ratio is None:
        problems.append(f"{label}: the runner reports no max_abs_log_ratio")
    elif not ratio <= RATIO_TOLERANCE:
        problems.append(
            f"{label}: max |logp - old_logp| = {ratio:.3g} before any update: the PPO ratio's two log-probs "
            "are not on one support (a full softmax against the sampler's renormalised log-probs)"
        )
    mass = sampled.padded("kept_mass")
    action = torch.zeros_like(mass, dtype=torch.bool)
    for i, row in enumerate(sampled.logprobs):
        action[i, : len(row)] = True
    outside = float(((mass < 0.9) | (mass > 1.1))[action].double().mean())
    measure = (
        f"{label}: kept mass S over {int(action.sum())} action tokens: mean "
        f"{float(mass[action].mean()):.4f}, min {float(mass[action].min()):.4f}, {outside:.0%} outside "
        "[0.9, 1.1]"
    )
    weights = result.outputs.get("correction_weights")
    if (
        not isinstance(weights, Tensor)
        or weights.dim() != 2
        or weights.shape[0] != mass.shape[0]
        or (weights.shape[1] < mass.shape[1])
    ):
        problems.append(
            f"{label}: expected the output correction_weights (B={mass.shape[0]}, >= {mass.shape[1]}), got "
            f"{getattr(weights, 'shape', None)}"
        )
        return problems, measure
    got = weights[:, : mass.shape[1]].double()
    expected = torch.ones_like(mass) if convention == "truncated" else mass
    diff = float((got - expected).abs()[action].max())
    measure += f"; weights: mean {float(got[action].mean()):.4f}, min {float(got[action].min()):.4f}"
    if not diff <= WEIGHT_TOLERANCE:
        other = mass if convention == "truncated" else torch.ones_like(mass)
        hint = (
            f" (they are the other convention's: within {float((got - other).abs()[action].max()):.2g} of "
            f"{'S' if convention == 'truncated' else '1'})"
        )
        problems.append(
            f"{label}: the correction weights differ from the declared {convention!r} convention's "
            f"({'1' if convention == 'truncated' else 'the kept mass S'}) by up to {diff:.3g}"
            f"{hint if float((got - other).abs()[action].max()) <= WEIGHT_TOLERANCE else ''}"
        )
    return problems, measure
