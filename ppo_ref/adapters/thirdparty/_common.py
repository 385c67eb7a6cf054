"""Helpers shared by the verl, OpenRLHF and skyrl-train adapters (no library imported here)."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["float_mask", "library_location"]


def library_location(function: Any) -> str:
    """``module.qualname (path/in/site-packages.py:line)`` of a library function."""
    target = inspect.unwrap(function)
    name = f"{target.__module__}.{target.__qualname__}"
    try:
        source = Path(inspect.getsourcefile(target) or "")
        line = inspect.getsourcelines(target)[1]
        top = sys.modules[target.__module__.partition(".")[0]]
        root = Path(top.__file__ or "").parent.parent
        return f"{name} ({source.relative_to(root)}:{line})"
    except (TypeError, OSError, ValueError, KeyError):
        return name


def float_mask(mask: Tensor, like: Tensor) -> Tensor:
    """The mask as 0/1 values of ``like``'s floating dtype (float32 if ``like`` is not floating)."""
    dtype = like.dtype if like.is_floating_point() else torch.float32
    return mask.to(dtype)
