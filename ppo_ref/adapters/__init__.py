"""Adapters: how the conformance suite reaches an implementation under test.

``get_adapter(name)`` resolves ``mine`` (the reference functions), a built-in third-party name,
an entry point of group ``ppo_ref.adapters`` or any importable ``module:attribute``. An adapter is
any object satisfying :class:`Adapter` (see :mod:`ppo_ref.adapters.base` for the contract,
:mod:`ppo_ref.adapters.conventions` for the conventions it may declare, and
:mod:`ppo_ref.adapters.helpers` for the helpers that locate a library and run its inline code).

The math package never imports this one; adapters import the math.
"""

from ppo_ref.adapters.base import OP_NAMES, Adapter, CompleteAdapter, PolicyLossOutput, contract_problems
from ppo_ref.adapters.conventions import (
    CONVENTIONS,
    ConventionError,
    ConventionSet,
    convention_problems,
    parse_conventions,
)
from ppo_ref.adapters.helpers import (
    InlineBlock,
    InlineSourceError,
    LibraryPolicyLoss,
    LocatedBlock,
    block_digest,
    float_mask,
    import_library,
    library_location,
    locate,
    missing_library,
)
from ppo_ref.adapters.reference import ReferenceAdapter
from ppo_ref.adapters.registry import (
    BUILTIN_ADAPTERS,
    ENTRY_POINT_GROUP,
    AdapterLoadError,
    UnknownAdapterError,
    available_adapters,
    get_adapter,
)

__all__ = [
    "BUILTIN_ADAPTERS",
    "CONVENTIONS",
    "ENTRY_POINT_GROUP",
    "OP_NAMES",
    "Adapter",
    "AdapterLoadError",
    "CompleteAdapter",
    "ConventionError",
    "ConventionSet",
    "InlineBlock",
    "InlineSourceError",
    "LibraryPolicyLoss",
    "LocatedBlock",
    "PolicyLossOutput",
    "ReferenceAdapter",
    "UnknownAdapterError",
    "available_adapters",
    "block_digest",
    "contract_problems",
    "convention_problems",
    "float_mask",
    "get_adapter",
    "import_library",
    "library_location",
    "locate",
    "missing_library",
    "parse_conventions",
]
