"""The conventions every draw obeys: the shared constants, the declared input conventions
(:func:`declared_inputs`) and the Hypothesis profiles (:func:`register_profiles`).

One job: say *what* may be drawn. The other modules of :mod:`conformance.strategies` read
``_INPUTS`` (mutated in place, never rebound) whenever they draw a mask, a masked-out slot or logits.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any

import torch
from hypothesis import HealthCheck, settings

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64)
"""Dtypes the reference functions are checked in."""
HALF_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
"""Half-precision logits dtypes (LOGP-3: computed in float32)."""
MASK_DTYPES: tuple[torch.dtype, ...] = (torch.bool, torch.int64, torch.float32)
"""A mask may be bool or 0/1 of any numeric dtype."""
JUNK_VALUES: tuple[float, ...] = (math.nan, math.inf, -math.inf, 1e6, -1e6)
"""Values written into masked-out slots: they must never reach a result or a gradient."""

MAX_ROWS = 6
MAX_STEPS = 12
LOGP_MIN = -12.0
"""Realistic log-probabilities of sampled tokens lie in [LOGP_MIN, 0]."""
LOG_RATIO_MAX = 3.0
"""Log-ratios between two policies are drawn in [-LOG_RATIO_MAX, LOG_RATIO_MAX]."""


# --------------------------------------------------------------------------------------------------
# Input conventions: what the masked-out slots hold, whether masks have holes (issue 11)

_INPUTS: dict[str, Any] = {"masked_fill": "any", "holes": True, "empty_rows": True, "inf_logits": True}


@contextlib.contextmanager
def declared_inputs(
    masked_fill: str | float = "any", holes: bool = True, empty_rows: bool = True, inf_logits: bool = True
) -> Iterator[None]:
    """Within the block, draws obey an implementation's declared input conventions.

    ``masked_fill``: ``"any"`` (default: junk, NaN and +-inf included, in the masked-out slots of
    half the bundles), ``"finite"`` (the drawn finite values stay there), ``"zero"`` or a finite
    number (the slots hold it). ``holes`` False draws masks without holes (a prefix of action tokens
    per row). ``empty_rows`` False draws at least one action token in every row of every mask, even
    where a strategy is asked for empty rows. ``inf_logits`` False draws finite logits only (no
    banned tokens). ``junk=True`` in a bundle strategy still writes junk (robustness checks).

    >>> from conformance.strategies import policy_batches
    >>> with declared_inputs("zero"):
    ...     batch = policy_batches(junk=False).example()
    >>> bool((batch.logp[batch.mask == 0] == 0).all())
    True
    """
    if isinstance(masked_fill, str):
        if masked_fill not in ("any", "finite", "zero"):
            raise ValueError(
                f"masked_fill: expected 'any', 'finite', 'zero' or a number, got {masked_fill!r}"
            )
    elif (
        isinstance(masked_fill, bool)
        or not isinstance(masked_fill, (int, float))
        or not math.isfinite(masked_fill)
    ):
        raise ValueError(
            f"masked_fill: expected 'any', 'finite', 'zero' or a finite number, got {masked_fill!r}"
        )
    for name, flag in (("holes", holes), ("empty_rows", empty_rows), ("inf_logits", inf_logits)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name}: expected a bool, got {type(flag).__name__}")
    saved = dict(_INPUTS)
    _INPUTS.update(masked_fill=masked_fill, holes=holes, empty_rows=empty_rows, inf_logits=inf_logits)
    try:
        yield
    finally:
        _INPUTS.clear()
        _INPUTS.update(saved)


# --------------------------------------------------------------------------------------------------
# Hypothesis profiles


def register_profiles() -> str:
    """Register the ``default`` and ``thorough`` Hypothesis profiles and load one; return its name.

    ``default``: derandomized (the same examples on every run and machine), no example database,
    no deadline, 60 examples. ``thorough``: 1000 random examples per test. The profile is chosen by
    the environment variable ``HYPOTHESIS_PROFILE`` (default ``default``).
    """
    settings.register_profile(
        "default",
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=True,
        max_examples=60,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile(
        "thorough",
        derandomize=False,
        deadline=None,
        print_blob=True,
        max_examples=1000,
        suppress_health_check=[HealthCheck.too_slow],
    )
    name = os.environ.get("HYPOTHESIS_PROFILE", "default")
    settings.load_profile(name)
    return name
