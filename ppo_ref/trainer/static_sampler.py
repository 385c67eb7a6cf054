"""The ``sampler="static"`` mode of :func:`ppo_ref.trainer.generation.generate` (issue 26).

The same draws as the default (dynamic) sampler: inverse-CDF sampling from the same per-sample
uniforms with :func:`~ppo_ref.trainer.generation.sample_from_logits`, the same stop rule and the
same returned tensors; only how the model's forward is fed differs:

- one prefill per distinct prompt: consecutive identical rows (a group of ``group_size`` samples
  of one prompt) are prefilled once and their KV cache is repeated for the group;
- a static KV cache (transformers' ``StaticCache``, preallocated for ``P + max_new_tokens - 1``
  positions) and one preallocated attention mask ``[prompt_mask, ones]``: a decode step writes one
  slot and allocates nothing that grows with the step;
- rows stopped at EOS are dropped from the forward once at most half of the computed rows still
  run (the cache, mask and positions are compacted; a row's own computation is row-wise, so its
  tokens do not change; the shapes stay fixed between compactions);
- optionally (``compile_step=True``) the decode step is ``torch.compile``d; where compilation is
  unavailable one line is printed and the step runs eagerly.

A model whose cache this mode cannot preallocate (no ``config``, a forward without a ``cache``
or ``past_key_values`` argument, or a layer that is not full attention) falls back to the dynamic
sampler with one printed line.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ppo_ref.trainer.data import position_ids_from_mask
from ppo_ref.trainer.models import call_model, output_cache, supports_logits_to_keep

__all__ = ["SAMPLERS", "group_runs", "static_decode", "static_supported"]

SAMPLERS = ("dynamic", "static", "static-compiled")
"""The sampler modes: today's growing-cache loop, the static cache, and the static cache with a
compiled decode step."""

_compiled: dict[str, Callable[..., Any]] = {}
_warned: set[str] = set()


def _say_once(key: str, line: str) -> None:
    if key not in _warned:
        _warned.add(key)
        print(line, file=sys.stderr)


def _config_of(model: Any) -> Any:
    inner = getattr(model, "module", model)
    return getattr(inner, "config", None)


def static_supported(model: Any) -> bool:
    """Whether ``model`` (or the ``module`` it wraps) has a transformers config, a cache argument and
    only full-attention layers (what the prefilled cache is copied into)."""
    from ppo_ref.trainer.models import _forward_parameters

    config = _config_of(model)
    if config is None:
        return False
    parameters = _forward_parameters(model)
    if "cache" not in parameters and "past_key_values" not in parameters:
        return False
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    try:  # full-attention layers only: a sliding-window or linear-attention layer is not filled so
        layers = StaticCache(config=config, max_cache_len=1).layers
    except (TypeError, ValueError, AttributeError, KeyError):
        return False
    return all(type(layer) is StaticLayer for layer in layers)


def group_runs(prompt_ids: Tensor, prompt_mask: Tensor) -> Tensor:
    """(R,) the lengths of the runs of consecutive identical rows (ids and mask), summing to B."""
    if prompt_ids.shape != prompt_mask.shape or prompt_ids.dim() != 2:
        raise ValueError(
            f"prompt_ids, prompt_mask: expected two (B, P) tensors of one shape, got "
            f"{tuple(prompt_ids.shape)} and {tuple(prompt_mask.shape)}"
        )
    rows = prompt_ids.shape[0]
    if rows == 1:
        return torch.ones(1, dtype=torch.long)
    same = (prompt_ids[1:] == prompt_ids[:-1]).all(dim=1) & (prompt_mask[1:] == prompt_mask[:-1]).all(dim=1)
    starts = torch.cat([torch.ones(1, dtype=torch.bool), ~same.cpu()])
    first = torch.nonzero(starts).squeeze(1)
    return torch.diff(torch.cat([first, torch.tensor([rows])]))


def _decode_step(model: Any, token: Tensor, mask: Tensor, position: Tensor, cache: Any) -> Tensor:
    output = call_model(
        model,
        input_ids=token.unsqueeze(1),
        attention_mask=mask,
        position_ids=position,
        cache=cache,
        use_cache=True,
    )
    logits: Tensor = output.logits[:, -1]
    return logits


def _step_function(compile_step: bool) -> Callable[..., Tensor]:
    """The decode step, compiled once per process (dynamo guards on the module and the shapes)."""
    if not compile_step or "eager" in _compiled:
        return _decode_step
    compiled = _compiled.get("compiled")
    if compiled is None:
        compiled = _compiled["compiled"] = torch.compile(_decode_step, dynamic=False)

    def step(model: Any, token: Tensor, mask: Tensor, position: Tensor, cache: Any) -> Tensor:
        try:
            logits: Tensor = compiled(model, token, mask, position, cache)
        except (torch._dynamo.exc.TorchDynamoException, OSError, ImportError) as error:
            # Raised while compiling, before the step runs: the cache is as it was.
            _compiled["eager"] = _decode_step
            _say_once("compile", f"sampler: torch.compile failed ({type(error).__name__}); decoding eagerly")
            return _decode_step(model, token, mask, position, cache)
        return logits

    return step


def _expanded_static_cache(model: Any, prefill_cache: Any, runs: Tensor, max_len: int) -> Any:
    from transformers import StaticCache

    cache: Any = StaticCache(config=_config_of(model), max_cache_len=max_len)
    layers = getattr(prefill_cache, "layers", None)
    if layers is None or len(layers) != len(cache.layers):
        raise TypeError("prefill cache: expected a transformers Cache with one layer per static layer")
    runs = runs.to(prefill_cache.layers[0].keys.device)
    for static, prefilled in zip(cache.layers, layers, strict=True):
        keys = prefilled.keys.repeat_interleave(runs, dim=0)
        values = prefilled.values.repeat_interleave(runs, dim=0)
        static.lazy_initialization(keys, values)
        static.update(keys, values)
    return cache


def draw_step(
    sample: Callable[[Tensor, Tensor], Tensor],
    logits: Tensor,
    uniforms: Tensor,
    finished: Tensor,
    pad: Tensor,
    eos_id: int,
    all_ended: Callable[[bool], bool] | None,
) -> tuple[Tensor, Tensor, bool]:
    """One step of either decode loop: the token of every row (``pad`` for a row already finished),
    the rows finished after it (EOS), and whether every row has ended (``all_ended`` agrees it
    across processes)."""
    token = torch.where(finished, pad, sample(logits, uniforms))
    finished = finished | (token == eos_id)
    done = bool(finished.all())
    return token, finished, all_ended(done) if all_ended is not None else done


def _compact(cache: Any, keep: Tensor) -> None:
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(0, keep)
        layer.values = layer.values.index_select(0, keep)
        layer.batch_size = int(keep.numel())


def static_decode(
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
    compile_step: bool,
) -> tuple[list[Tensor], list[Tensor]]:
    """The sampling loop of the static mode: ``(tokens, step_logits)``, each a list of (B,) / (B, V)
    tensors per step, as the dynamic loop makes them (``step_logits`` empty unless ``keep_logits``).

    ``sample(logits, uniforms)`` draws one token per row. Called by ``generate`` inside its
    inference-mode context, after its argument checks.
    """
    batch, steps = uniforms.shape
    device = prompt_ids.device
    runs = group_runs(prompt_ids, prompt_mask)
    firsts = torch.cumsum(runs, dim=0) - runs
    unique_ids, unique_mask = prompt_ids[firsts.to(device)], prompt_mask[firsts.to(device)].long()
    positions = position_ids_from_mask(unique_mask)
    extra = {"logits_to_keep": 1} if supports_logits_to_keep(model) else {}
    from transformers import DynamicCache

    output = call_model(
        model,
        input_ids=unique_ids,
        attention_mask=unique_mask,
        position_ids=positions,
        cache=DynamicCache(),
        use_cache=True,
        **extra,
    )
    width = prompt_ids.shape[1]
    cache = _expanded_static_cache(model, output_cache(output), runs, width + max(steps - 1, 1))
    logits = output.logits[:, -1].repeat_interleave(runs.to(device), dim=0)
    mask = torch.cat(
        [prompt_mask.long(), torch.ones(batch, max(steps - 1, 1), dtype=torch.long, device=device)], 1
    )
    next_position = positions[:, -1:].repeat_interleave(runs.to(device), dim=0) + 1
    step_function = _step_function(compile_step)
    if compile_step:  # the policy itself, not a per-call caller object the compiled step would guard on
        model = getattr(model, "module", model)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    pad = torch.full((batch,), pad_id, dtype=torch.long, device=device)
    active = torch.arange(batch, device=device)  # the rows the forward computes, in batch order
    tokens: list[Tensor] = []
    step_logits: list[Tensor] = []
    for step in range(steps):
        full = logits
        if active.numel() < batch:  # finished rows' logits: never used for a token, kept as 0
            full = logits.new_zeros((batch, logits.shape[-1])).index_copy(0, active, logits)
        if keep_logits:
            step_logits.append(full)
        token, finished, done = draw_step(sample, full, uniforms[:, step], finished, pad, eos_id, all_ended)
        tokens.append(token)
        if step == steps - 1 or done:
            break
        running = ~finished[active]
        if not compile_step and all_ended is None and 2 * int(running.sum()) <= active.numel():
            keep = torch.nonzero(running).squeeze(1)
            active = active[keep]
            _compact(cache, keep)
            mask = mask.index_select(0, keep)
            next_position = next_position.index_select(0, keep)
        logits = step_function(model, token[active], mask, next_position, cache)
        next_position = next_position + 1
    return tokens, step_logits
