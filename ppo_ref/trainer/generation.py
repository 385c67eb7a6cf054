"""Stage 2: sampling responses with a manual KV-cache loop, and the layout of a prompt + response batch.

Prompts are left-padded; every forward pass gets ``position_ids = cumsum(attention_mask) - 1``, so a
token's position does not depend on the padding before it. Sampling uses inverse-CDF draws from
per-sample noise (see :mod:`ppo_ref.trainer.seeding`), so a sample does not depend on its batch.
A response ends at its first EOS (the EOS is part of it); later columns hold ``pad_id`` and are
off the response mask, which is built from the first EOS, never from ``!= pad_id`` (pad may equal
EOS).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel

from ppo_ref import entropy
from ppo_ref.trainer.data import SequenceBatch, position_ids_from_mask
from ppo_ref.trainer.models import call_model, output_cache, supports_logits_to_keep
from ppo_ref.trainer.static_sampler import SAMPLERS, draw_step, static_decode, static_supported
from ppo_ref.trainer.truncation import kept_count, kept_in_sorted

__all__ = [
    "SAMPLERS",
    "Generated",
    "SequenceBatch",
    "first_eos_mask",
    "generate",
    "left_pad",
    "position_ids_from_mask",
    "sample_from_logits",
    "sampling_logprob",
]


def left_pad(
    rows: Sequence[Sequence[int]], pad_id: int, device: torch.device | None = None, width: int | None = None
) -> tuple[Tensor, Tensor]:
    """Left-pad token-id lists to ``(input_ids, attention_mask)``, both (B, width) int64.

    ``width`` defaults to the longest row; a larger one adds pad columns (a process pads its rows
    to the width of the whole batch, so its layout is the one-process layout).
    """
    if not rows or any(len(row) == 0 for row in rows):
        raise ValueError("rows: expected a non-empty list of non-empty token-id lists (an empty prompt?)")
    longest = max(len(row) for row in rows)
    if width is not None and width < longest:
        raise ValueError(f"width: expected at least the longest row ({longest}), got {width}")
    width = longest if width is None else width
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, width - len(row) :] = torch.as_tensor(list(row), dtype=torch.long)
        mask[index, width - len(row) :] = 1
    return ids.to(device), mask.to(device)


def first_eos_mask(response_ids: Tensor, eos_id: int) -> tuple[Tensor, Tensor]:
    """``(mask, ended)``: mask (B, N) is True up to and including the first EOS; ended (B,) if one exists."""
    is_eos = response_ids == eos_id
    eos_seen = is_eos.long().cumsum(dim=1)
    mask = (eos_seen == 0) | (is_eos & (eos_seen == 1))
    return mask, is_eos.any(dim=1)


@dataclass(frozen=True)
class Generated:
    """Stage 2's result: ``response_ids`` (B, N) with pad after EOS, ``response_mask`` (B, N) bool,
    ``ended`` (B,) True where the response stopped at EOS (False: cut at ``max_new_tokens``);
    ``logprobs`` (B, N) float64, the sampling distribution's log-probability of each sampled token
    (0 after EOS), only when ``generate(..., return_logprobs=True)``, else None; ``entropy`` (B, N)
    the entropy of ``softmax(logits / temperature)`` before each token (0 after EOS; float32, or
    float64 for float64 logits), only when ``return_entropy=True``; ``kept_counts`` (B, N) int64,
    how many tokens top-k / top-p kept at each step (:func:`~ppo_ref.trainer.truncation.kept_count`;
    1 after EOS: off the mask, a count any vocabulary admits), only with ``return_logprobs`` and a
    truncation (``top_k > 0`` or ``top_p < 1``), so that a correction can weigh the old log-probs
    on the same support (spec IS-3)."""

    response_ids: Tensor
    response_mask: Tensor
    ended: Tensor
    logprobs: Tensor | None = None
    entropy: Tensor | None = None
    kept_counts: Tensor | None = None


def sample_from_logits(
    logits: Tensor, uniforms: Tensor, temperature: float, top_k: int, top_p: float
) -> Tensor:
    """Draw one token per row of ``logits`` (B, V) by inverse CDF with ``uniforms`` (B,) in [0, 1).

    The distribution is ``softmax(logits / temperature)`` restricted to the ``top_k`` most probable
    tokens (0 = all) and to the smallest set whose mass reaches ``top_p`` (1 = all).
    """
    wide = logits if logits.dtype == torch.float64 else logits.float()
    probs = torch.softmax(wide / temperature, dim=-1).double()
    if top_k > 0 or top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True)
        keep = kept_in_sorted(probs, top_k, top_p)
        probs = torch.where(keep, probs, torch.zeros((), dtype=probs.dtype, device=probs.device))
    else:
        order = None
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    targets = uniforms.to(device=cdf.device, dtype=cdf.dtype).unsqueeze(-1) * total
    choice = torch.searchsorted(cdf, targets, right=True).squeeze(-1)
    # Rounding could put a target at the very end; never pick a zero-probability tail token.
    choice = torch.minimum(choice, (cdf < total).sum(dim=-1))
    return choice if order is None else order.gather(-1, choice.unsqueeze(-1)).squeeze(-1)


def sampling_logprob(logits: Tensor, token: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """(B,) float64 ``log q(token)``, ``q`` the distribution :func:`sample_from_logits` draws from.

    ``q = softmax(logits / temperature)`` restricted to the ``top_k`` / ``top_p`` set and renormalised;
    a token outside that set gets ``-inf``. Example: logits ``[[0., 0.]]``, temperature 1, token 0 ->
    ``log 0.5``; with ``top_k=1`` the kept token gets ``log 1 = 0``.
    """
    wide = logits if logits.dtype == torch.float64 else logits.float()
    logq = torch.log_softmax(wide / temperature, dim=-1).double()
    if top_k > 0 or top_p < 1.0:
        probs, order = logq.exp().sort(dim=-1, descending=True)
        keep_sorted = kept_in_sorted(probs, top_k, top_p)
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        kept_mass = torch.where(keep, logq.exp(), torch.zeros((), dtype=logq.dtype, device=logq.device))
        logq = torch.where(keep, logq - kept_mass.sum(dim=-1, keepdim=True).log(), -torch.inf)
    return logq.gather(-1, token.unsqueeze(-1)).squeeze(-1)


def _dynamic_decode(
    model: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    uniforms: Tensor,
    sample: Callable[[Tensor, Tensor], Tensor],
    *,
    eos_id: int,
    pad_id: int,
    all_ended: Callable[[bool], bool] | None,
    keep_logits: bool,
    compile_step: bool = False,
) -> tuple[list[Tensor], list[Tensor]]:
    """The default loop: a cache that grows by one column per step (``compile_step`` unused)."""
    batch, steps = uniforms.shape
    tokens: list[Tensor] = []
    step_logits: list[Tensor] = []  # (B, V) each, kept only for the log-probs and entropies
    attention_mask = prompt_mask.long()
    position_ids = position_ids_from_mask(attention_mask)
    next_position = position_ids[:, -1:] + 1
    extra = {"logits_to_keep": 1} if supports_logits_to_keep(model) else {}
    output = call_model(
        model,
        input_ids=prompt_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        **extra,
    )
    finished = torch.zeros(batch, dtype=torch.bool, device=prompt_ids.device)
    pad = torch.full((batch,), pad_id, dtype=torch.long, device=prompt_ids.device)
    one = torch.ones(batch, 1, dtype=torch.long, device=prompt_ids.device)
    for step in range(steps):
        logits = output.logits[:, -1]
        if keep_logits:
            step_logits.append(logits)
        token, finished, done = draw_step(sample, logits, uniforms[:, step], finished, pad, eos_id, all_ended)
        tokens.append(token)
        if step == steps - 1 or done:
            break
        attention_mask = torch.cat([attention_mask, one], dim=1)
        output = call_model(
            model,
            input_ids=token.unsqueeze(1),
            attention_mask=attention_mask,
            position_ids=next_position,
            cache=output_cache(output),
            use_cache=True,
        )
        next_position = next_position + 1
    return tokens, step_logits


@torch.no_grad()
def generate(
    model: PreTrainedModel | Callable[..., Any],
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    uniforms: Tensor,
    *,
    eos_id: int,
    pad_id: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    all_ended: Callable[[bool], bool] | None = None,
    return_logprobs: bool = False,
    return_entropy: bool = False,
    inference_mode: bool = True,
    sampler: str = "dynamic",
) -> Generated:
    """Sample up to ``uniforms.shape[1]`` tokens per left-padded prompt, stopping each row at its first EOS.

    ``prompt_ids``/``prompt_mask`` are (B, P) with the last column real for every row; ``uniforms``
    (B, max_new_tokens) is the per-sample noise. The loop feeds one token per step with the KV
    cache and stops early once every row has ended; with several processes, ``all_ended`` turns
    "my rows have ended" into "every process's rows have ended", so all make the same forward
    calls (needed when parameters are sharded). Call it inside the autocast context wanted.
    ``return_logprobs`` also records each sampled token's log-probability under the sampling
    distribution (:func:`sampling_logprob`), the rollout log-probs of an importance correction
    (or, when the sampler draws from the trained distribution itself, the old log-probs), and
    under top-k / top-p each step's kept count (``Generated.kept_counts``);
    ``return_entropy`` the entropy of ``softmax(logits / temperature)`` at each step
    (``ppo_ref.entropy``, before top-k / top-p); both are computed once after the loop from the
    kept step logits, 0 after the first EOS. The loop runs under ``torch.inference_mode`` (the
    same kernels, less dispatch work per step) unless ``inference_mode=False`` (parameters
    sharded over processes, whose gathering must not run in inference mode); every returned
    tensor is an ordinary one. ``sampler`` (one of ``SAMPLERS``) picks how the forwards are fed:
    ``"dynamic"`` (a cache that grows each step), ``"static"`` or ``"static-compiled"`` (one
    prefill per group of identical consecutive prompts, a preallocated cache and mask, see
    :mod:`ppo_ref.trainer.static_sampler`); the draws, checks and results are the same.
    """
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler: expected one of {', '.join(SAMPLERS)}, got {sampler!r}")
    steps = uniforms.shape[1]
    if steps < 1:
        raise ValueError(f"uniforms: expected at least one column (max_new_tokens >= 1), got {steps}")
    if not bool(prompt_mask[:, -1].all()):
        raise ValueError("prompt_mask: expected left-padded prompts (the last column real in every row)")
    keep_logits = return_logprobs or return_entropy
    static = sampler != "dynamic" and static_supported(model)
    if sampler != "dynamic" and not static:
        print(f"sampler: {sampler!r} needs a transformers model with a cache argument; sampling dynamically")
    elif sampler == "static-compiled" and not inference_mode:
        print("sampler: no compiled step with sharded parameters (their gathering); decoding eagerly")

    def draw(logits: Tensor, noise: Tensor) -> Tensor:
        return sample_from_logits(logits, noise, temperature, top_k, top_p)

    with torch.inference_mode(inference_mode):
        decode = static_decode if static else _dynamic_decode
        tokens, step_logits = decode(
            model,
            prompt_ids,
            prompt_mask,
            uniforms,
            draw,
            eos_id=eos_id,
            pad_id=pad_id,
            all_ended=all_ended,
            keep_logits=keep_logits,
            compile_step=sampler == "static-compiled" and inference_mode,
        )
    # Outside inference mode: ordinary tensors, which later forwards with gradients may save.
    response_ids = torch.stack(tokens, dim=1)
    response_mask, ended = first_eos_mask(response_ids, eos_id)
    sampled = spreads = kept = None
    if keep_logits:  # once for all steps: (B, N, V), the size of the forward's logits it replaces
        every = torch.stack(step_logits, dim=1)
        zero = torch.zeros((), device=every.device)
        if return_logprobs:
            flat = sampling_logprob(every.flatten(0, 1), response_ids.flatten(), temperature, top_k, top_p)
            sampled = torch.where(response_mask, flat.view(response_ids.shape), zero.double())
            if top_k > 0 or top_p < 1.0:
                counts = kept_count(every, temperature, top_k, top_p)
                kept = torch.where(response_mask, counts, 1)
        if return_entropy:
            spreads = torch.where(response_mask, entropy(every / temperature), zero)
    return Generated(
        response_ids=response_ids,
        response_mask=response_mask,
        ended=ended,
        logprobs=sampled,
        entropy=spreads,
        kept_counts=kept,
    )
