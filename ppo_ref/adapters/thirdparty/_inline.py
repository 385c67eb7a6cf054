"""Run exact lines of an installed library's own source, found by content at run time: now public
in :mod:`ppo_ref.adapters.helpers` (which documents it; re-exported here for the built-in adapters).

To pin a new block, print it with its digest::

    python -m ppo_ref.adapters.helpers MODULE:QUALNAME 'FIRST LINE' 'LAST LINE'
"""

from __future__ import annotations

import sys

from ppo_ref.adapters.helpers import (
    DIGEST_LENGTH,
    InlineBlock,
    InlineSourceError,
    LibraryPolicyLoss,
    LocatedBlock,
    _print_block,
    block_digest,
    locate,
)

__all__ = [
    "DIGEST_LENGTH",
    "InlineBlock",
    "InlineSourceError",
    "LibraryPolicyLoss",
    "LocatedBlock",
    "block_digest",
    "locate",
]

if __name__ == "__main__":
    sys.exit(_print_block(sys.argv[1:]))
