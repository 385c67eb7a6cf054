"""Reprs that are code: :func:`tensor_code` and the base of every bundle, whose ``repr`` rebuilds it.

One job: make a Hypothesis failure pasteable. A bundle's ``repr`` is Python code (tensor values as
``torch.tensor(..., dtype=...)``, NaN and inf as ``float(...)``) that evaluates, after ``import
torch`` and ``from conformance.strategies import *``, to an equal bundle.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from torch import Tensor

# --------------------------------------------------------------------------------------------------
# Copy-pasteable reprs


def _number_code(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "-float('inf')"
    return repr(value)


def _nested_code(values: object) -> str:
    if isinstance(values, list):
        return "[" + ", ".join(_nested_code(v) for v in values) + "]"
    return _number_code(values)


def tensor_code(tensor: Tensor) -> str:
    """Python code that rebuilds ``tensor`` exactly: ``torch.tensor([...], dtype=torch.float32)``."""
    values = tensor.detach().cpu().tolist()
    return f"torch.tensor({_nested_code(values)}, dtype={tensor.dtype})"


def _value_code(value: object) -> str:
    if isinstance(value, Tensor):
        return tensor_code(value)
    if isinstance(value, tuple):
        inner = ", ".join(_value_code(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return _number_code(value)


class _Bundle:
    """Base of the dataclass bundles: a ``repr`` that is code rebuilding the bundle."""

    def __repr__(self) -> str:
        parts = [f"{f.name}={_value_code(getattr(self, f.name))}" for f in fields(self)]  # type: ignore[arg-type]
        return f"{type(self).__name__}({', '.join(parts)})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Make Hypothesis' pretty printer (falsifying examples) use the code repr too."""
        printer.text(repr(self))
