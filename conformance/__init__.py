"""The conformance suite: ppo-ref's specification (``spec/``) run against any PPO implementation.

``from ppo_ref_conformance import check_op`` checks one function without an adapter (:mod:`.check`).
The names are imported on first use: pytest loads this package in every run of an environment with
ppo-ref installed (its plugin entry point), which must not import torch or Hypothesis.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OneOpAdapter", "OpCheck", "OpConformanceError", "check_op", "one_op_adapter"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import check

        return getattr(check, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
