"""The built-in adapter ``mine``: ppo-ref's own reference functions, unchanged.

Running the conformance suite against it checks the suite and the reference against each other;
``pytest conformance/ --impl=mine`` (the default) must pass with every clause ``pass``. Its ops are
the rows of the op registry :data:`ppo_ref.ops.OPS`, each the reference function of that row.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import ppo_ref
from ppo_ref.ops import OPS

__all__ = ["ReferenceAdapter", "make_adapter"]


class ReferenceAdapter:
    """Every op is the :mod:`ppo_ref` function of the same name. It declares only input conventions,
    the widest: junk in every masked-out slot (``masked_fill = any``) and every edge input (holes,
    rows and batches without action tokens, ``-inf`` logits), so its value clauses are checked on
    all of them; no convention changes an expected value.

    >>> ReferenceAdapter().gae is ppo_ref.gae, "gspo_loss" in ReferenceAdapter.ops
    (True, True)
    """

    name = "mine"
    version = ppo_ref.__version__
    provenance = "each op is the ppo_ref function of the same name (ppo_ref.<op>), called unchanged"
    ops: frozenset[str] = frozenset(OPS)
    conventions: Mapping[str, object] = MappingProxyType({"masked_fill": "any", "edge_inputs": "all"})

    def __getattr__(self, name: str) -> Any:
        """The reference function of the op ``name`` (only attributes not found otherwise get here)."""
        op = OPS.get(name)
        if op is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return op.function

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *OPS})

    def __repr__(self) -> str:
        return f"ReferenceAdapter(name={self.name!r}, version={self.version!r})"


def make_adapter() -> ReferenceAdapter:
    """The ``mine`` adapter (a zero-argument factory, like every registry entry)."""
    return ReferenceAdapter()
