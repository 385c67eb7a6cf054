"""The adapter as the suite compares it (:class:`ComparedAdapter`): the declared conventions that
change how results are compared rather than what they must be.

- ``compute_dtype`` (precision): an op declared computed in float32 marks the current test for the
  float32 tolerance (:mod:`.precision`), and where it raises on float64 inputs it is called again on
  them cast to float32, the inputs its pipeline gives it.
- ``off_mask_outputs`` unspecified: the op's per-token outputs are set to 0 off the mask, so they are
  compared on the action tokens only (gradients too).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

import ppo_ref
from ppo_ref.adapters import OP_NAMES, Adapter, ConventionSet
from ppo_ref.adapters.conventions import MASKED_OUTPUT_OPS, with_value_slot

from .precision import mark_called, mark_refused_float64

__all__ = ["ComparedAdapter", "compared_adapter"]


_REFERENCE_SIGNATURES: dict[str, inspect.Signature] = {}


def _bound(op: str, args: tuple[object, ...], kwargs: Mapping[str, object]) -> dict[str, object]:
    """The arguments of a call of ``op`` by the reference's parameter names (defaults filled)."""
    if op not in _REFERENCE_SIGNATURES:
        _REFERENCE_SIGNATURES[op] = inspect.signature(getattr(ppo_ref, op))
    bound = _REFERENCE_SIGNATURES[op].bind_partial(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _has_float64(value: object) -> bool:
    if isinstance(value, Tensor):
        return value.dtype == torch.float64
    if isinstance(value, (tuple, list)):
        return any(_has_float64(item) for item in value)
    return False


def _as_float32(value: object) -> object:
    """``value`` with its float64 tensors cast to float32 (differentiably: gradients reach the
    float64 leaves), through tuples and lists."""
    if isinstance(value, Tensor):
        return value.to(torch.float32) if value.dtype == torch.float64 else value
    if isinstance(value, (tuple, list)):
        return type(value)(_as_float32(item) for item in value)
    return value


def _float32_when_float64_refused(op: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (an op declared computed in float32) called again with its float64 tensors cast
    to float32 when it raises on them: a library whose pipeline gives the op float32 may refuse
    float64 (ms-swift's ``compute_advantages_dynamic`` allocates its group means in float32 and
    index-puts the scores into them). A call without float64 tensors, or one that raises again, raises
    the first exception."""

    def called(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as refused:
            if not _has_float64(args) and not _has_float64(list(kwargs.values())):
                raise
            cast_args, cast_kwargs = _as_float32(args), {k: _as_float32(v) for k, v in kwargs.items()}
            try:
                result = function(*cast_args, **cast_kwargs)  # type: ignore[misc]
            except Exception:
                raise refused from None
            mark_refused_float64(op)
            return result

    called.__name__ = op
    called.__doc__ = f"{op}, given float32 inputs where it refuses float64 ones"
    return called


def _on_mask(value: object, keep: Tensor) -> object:
    if isinstance(value, Tensor) and value.shape == keep.shape:
        return torch.where(keep, value, torch.zeros((), dtype=value.dtype))
    if isinstance(value, tuple):
        return tuple(_on_mask(item, keep) for item in value)
    return value


class ComparedAdapter:
    """The adapter as the suite compares it: every attribute is the adapter's, except that an op the
    adapter declares computed in float32 (``compute_dtype``) marks the current test for the float32
    tolerance when it is looked up and is given float32 inputs where it raises on float64 ones
    (:func:`refused_float64`), and an op whose off-mask outputs are declared unspecified
    (``off_mask_outputs``) returns its per-token outputs set to 0 off the mask (0 is what the
    reference returns there), so they are compared on the action tokens only. Where ``token_rewards``
    puts the score after the last action token (``score_placement``), and where GAE trains the
    value after it (``value_after_last_action_token``), that slot counts as on the mask."""

    def __init__(self, adapter: Adapter, conventions: ConventionSet) -> None:
        self._adapter = adapter
        self._conventions = conventions
        for attribute in ("name", "version", "provenance", "ops", "conventions"):  # for isinstance
            if hasattr(adapter, attribute):
                setattr(self, attribute, getattr(adapter, attribute))

    def __repr__(self) -> str:
        return f"ComparedAdapter({self._adapter!r})"

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._adapter, name)
        if name not in OP_NAMES or not callable(value):
            return value
        if name in self._conventions.float32_ops:
            mark_called(name)
            value = _float32_when_float64_refused(name, value)
        if name not in self._conventions.off_mask_outputs:
            return value
        return self._compared(name, value)

    def _compared(self, op: str, function: Callable[..., Any]) -> Callable[..., Any]:
        conventions = self._conventions

        def compared(*args: Any, **kwargs: Any) -> Any:
            result = function(*args, **kwargs)
            mask = _bound(op, args, kwargs).get("mask")
            if not isinstance(mask, Tensor):
                return result  # kl_penalty without a mask: every position is an output
            keep = mask if mask.dtype == torch.bool else mask != 0
            slot = (op == "token_rewards" and conventions.score_placement == "after-last-action-token") or (
                op == "gae" and getattr(conventions, "value_after_last_action_token", "") == "trained"
            )
            return _on_mask(result, with_value_slot(keep) if slot else keep)

        compared.__name__ = op
        compared.__doc__ = f"{op} of {self._adapter!r}, compared on the action tokens only"
        return compared


def compared_adapter(adapter: Adapter, conventions: ConventionSet) -> Adapter:
    """The adapter itself when no declared convention changes how it is compared, else
    :class:`ComparedAdapter` around it."""
    if not conventions.float32_ops and not (conventions.off_mask_outputs & set(MASKED_OUTPUT_OPS)):
        return adapter
    wrapped: Adapter = ComparedAdapter(adapter, conventions)
    return wrapped
