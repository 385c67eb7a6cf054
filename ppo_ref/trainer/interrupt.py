"""A clean stop on SIGINT (Ctrl-C) or SIGTERM: finish the iteration, write a checkpoint, stop.

The first signal only raises a flag; the loop looks at it after each iteration (all-reduced, so
every process stops after the same iteration), writes a checkpoint and returns. The handler then
gives the signal back to its previous handler, so a second Ctrl-C interrupts at once.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType, TracebackType
from typing import Any

__all__ = ["StopRequest"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """Context manager: while active, SIGINT and SIGTERM set :attr:`requested` instead of stopping.

    Only the main thread can install signal handlers; elsewhere this is inactive (never requested).
    """

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, number: int, frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        self.requested = name
        print(
            f"\nppo-ref: {name} received; stopping after this iteration with a checkpoint "
            "(send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )
        self._restore()

    def _restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for number in _SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._restore()
