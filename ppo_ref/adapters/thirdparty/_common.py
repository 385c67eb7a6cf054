"""Helpers shared by the third-party adapters (no library is imported here)."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from ppo_ref.adapters.registry import AdapterLoadError

__all__ = ["float_mask", "import_library", "library_location", "missing_library"]


def missing_library(adapter: str, library: str, error: ImportError) -> AdapterLoadError:
    """The error for adapter ``adapter`` when ``library`` (e.g. ``"TRL 1.12.0"``) cannot be imported.

    It names the command that builds the library's isolated environment and the command that runs
    the suite there (``docs/thirdparty-envs.md``).
    """
    return AdapterLoadError(
        f"adapter {adapter!r} needs {library}, which cannot be imported in this environment ({error}). "
        f"Build its isolated environment with `python tools/thirdparty_envs.py {adapter}`, then run "
        f"`.envs/{adapter}/bin/python -m pytest conformance/ --impl={adapter}` (docs/thirdparty-envs.md)"
    )


def import_library(adapter: str, library: str, module: str) -> ModuleType:
    """Import ``module`` of the adapted library; :func:`missing_library`'s error if that fails."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise missing_library(adapter, library, error) from error


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
