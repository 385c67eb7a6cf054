"""A trainer's ``train()`` run in a thread that waits at every iteration boundary, so that a benchmark
can time one iteration at a time.

Both sides of the trainer benchmarks build on :class:`PausedTrain`: ppo-ref's
:class:`bench.ppo_ref_side.TrainStepper` pauses on entry to ``collect_rollout``, TRL's
:class:`bench.trl_iteration.TrlStepper` in a ``TrainerCallback``. Only torch and the standard library:
it runs in any library's environment.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import torch


class StopTraining(Exception):
    """Raised inside the training thread, at a pause, to end ``train()`` when the stepper closes."""


class PausedTrain:
    """``train()`` in a daemon thread that hands control back at each :meth:`pause`; :meth:`step` lets
    exactly one iteration run and returns its wall seconds, :meth:`close` ends ``train()``.

    A subclass arranges for ``train()`` to call :meth:`pause` at each iteration boundary, then calls
    :meth:`start`. ``who`` names the trainer in the errors (``"TRL"``); ``early`` is added to the one
    that says ``train()`` returned before it was closed.
    """

    def __init__(self, who: str, early: str = "") -> None:
        self.steps = 0
        self.cpu_seconds: list[float] = []  # process CPU seconds of each step (less load-sensitive than wall)
        self._who = who
        self._early = early
        self._threads = torch.get_num_threads()
        self._go = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        self._stopping = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def pause(self) -> None:
        """In the training thread: hand control to :meth:`step` and wait for the next one (or raise
        :class:`StopTraining` after :meth:`close`)."""
        torch.set_num_threads(self._threads)  # OpenMP settings are per thread: apply them to this one too
        self._done.release()
        self._go.acquire()
        if self._stopping:
            raise StopTraining

    def start(self, train: Callable[[], object], name: str) -> None:
        """Run ``train`` in a thread called ``name`` and wait for its first pause."""

        def run() -> None:
            try:
                train()
            except StopTraining:
                pass
            except BaseException as error:  # reported to the caller of step()
                self._error = error
            finally:
                self._done.release()

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()
        self._done.acquire()
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"{self._who}'s train() failed: {self._error!r}") from self._error
        if self._thread is not None and not self._thread.is_alive() and not self._stopping:
            raise RuntimeError(f"{self._who}'s train() returned early{self._early}")

    def step(self) -> float:
        """Run one iteration of ``train()``; return its wall seconds."""
        began, cpu_began = time.perf_counter(), time.process_time()
        self._go.release()
        self._done.acquire()
        seconds = time.perf_counter() - began
        self.cpu_seconds.append(time.process_time() - cpu_began)  # every thread of the process
        self._raise_if_failed()
        self.steps += 1
        return seconds

    def timed(self, warmup: int, iterations: int) -> dict[str, Any]:
        """Run ``warmup`` iterations, then time ``iterations``: the median, min and max wall seconds
        per iteration and their count (a script's own summary, outside the workers)."""
        for _ in range(warmup):
            self.step()
        seconds = [self.step() for _ in range(iterations)]
        return {
            "median_seconds_per_iteration": statistics.median(seconds),
            "min": min(seconds),
            "max": max(seconds),
            "iterations": len(seconds),
        }

    def iterations(self, request: dict[str, Any]) -> dict[str, Any]:
        """The workers' ``{"cmd": "iterations", "n": k}``: run k iterations, reply their wall and
        process CPU seconds."""
        seconds = [self.step() for _ in range(int(request["n"]))]
        return {"seconds": seconds, "cpu_seconds": self.cpu_seconds[-len(seconds) :]}

    def close(self) -> None:
        """End ``train()`` (it closes its files) and wait for the thread."""
        if self._thread is not None and self._thread.is_alive():
            self._stopping = True
            self._go.release()
            self._thread.join(timeout=60)
