"""Helpers shared by the third-party adapters: now public in :mod:`ppo_ref.adapters.helpers`
(re-exported here for the built-in adapters; no library is imported here)."""

from __future__ import annotations

from ppo_ref.adapters.helpers import float_mask, import_library, library_location, missing_library

__all__ = ["float_mask", "import_library", "library_location", "missing_library"]
