"""Fixtures shared by the test directories that train or run tiny models (``tests/trainer``,
``tests/reliability``); each imports them by name, so they live here once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

__all__ = ["one_thread", "out_dir"]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Run each test on one intra-op thread, then restore the setting.

    The models are tiny: a second thread buys nothing, and on a shared 2-core machine thread
    contention made the fast trainer tests 4x slower (33 s against 7.6 s, measured).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    """A not-yet-existing output directory for a run."""
    return tmp_path / "run"
