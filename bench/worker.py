"""The benchmarks' worker protocol: one JSON request per stdin line, one JSON reply per line.

A benchmark that times several implementations side by side keeps one long-lived process per
implementation (each in its own environment) and drives them in alternating rounds. Both ends of
that conversation live here, once:

- the worker's end: :func:`claim_stdout_for_protocol` keeps the real stdout for the replies (library
  prints, progress bars and C-level writes to fd 1 go to stderr from then on), :func:`reply` writes
  one, :func:`serve` answers requests ``{"cmd": NAME, ...}`` from a table of handlers until
  ``{"cmd": "quit"}`` or the end of stdin;
- the coordinator's end: :class:`Worker` starts the process (its stderr to a log file), sends
  requests and reads replies; a reply with an ``"error"`` key, or none at all, raises
  :class:`WorkerError`.

Users: ``tools/run_bench.py`` (``bench/ppo_ref_side.py``, ``bench/trl_iteration.py``,
``bench/grpo_side.py``, ``bench/trl_grpo_iteration.py``) and ``bench/family_side.py`` (one worker per
library side). Only the standard library: a worker runs in any library's environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, TextIO

ROOT = Path(__file__).resolve().parent.parent

Handler = Callable[[dict[str, Any]], dict[str, Any]]
"""Answers one request (the decoded line) with the reply to send."""

_PROTOCOL: list[TextIO] = []


def claim_stdout_for_protocol() -> None:
    """Keep the real stdout for a worker's JSON replies; everything else printed (libraries' logs,
    progress bars, C-level writes to fd 1) goes to stderr from now on."""
    if not _PROTOCOL:
        sys.stdout.flush()
        _PROTOCOL.append(os.fdopen(os.dup(1), "w"))
        os.dup2(2, 1)
        sys.stdout = sys.stderr


def protocol_stream() -> TextIO:
    """Where a worker writes its replies (stdout unless :func:`claim_stdout_for_protocol` ran)."""
    return _PROTOCOL[0] if _PROTOCOL else sys.stdout


def reply(message: Mapping[str, Any]) -> None:
    """Send one reply line."""
    stream = protocol_stream()
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def serve(handlers: Mapping[str, Handler]) -> None:
    """Answer request lines with ``handlers[request["cmd"]]`` until ``quit`` or the end of stdin;
    an unknown command gets ``{"error": ...}``."""
    for line in sys.stdin:
        request: dict[str, Any] = json.loads(line)
        command = request.get("cmd")
        if command == "quit":
            break
        handler = handlers.get(str(command))
        reply(handler(request) if handler is not None else {"error": f"unknown command: {request}"})


class WorkerError(RuntimeError):
    """A worker answered with an error, or exited; ``reason`` is its short form."""

    def __init__(self, label: str, reason: str, log_tail: str = "") -> None:
        self.reason = reason
        tail = f"; its log ends:\n{log_tail}" if log_tail else ""
        super().__init__(f"worker {label}: {reason}{tail}")


class Worker:
    """A long-lived benchmark process speaking one JSON line per request and per reply.

    ``command`` runs in the repository root with ``env``; its stderr goes to ``log_path``, a fresh
    file unless ``append`` (several workers sharing one log)."""

    def __init__(
        self,
        label: str,
        command: list[str],
        env: Mapping[str, str],
        log_path: Path,
        *,
        append: bool = False,
    ) -> None:
        self.label = label
        self.log_path = log_path
        self._log: IO[str] = log_path.open("a" if append else "w")
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
        )

    def read(self) -> dict[str, Any]:
        """The next reply; :class:`WorkerError` if it carries an ``error`` or the worker exited."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self._log.flush()
            tail = self.log_path.read_text()[-3000:] if self.log_path.exists() else ""
            raise WorkerError(self.label, f"worker exited ({self.process.poll()})", tail)
        message: dict[str, Any] = json.loads(line)
        if "error" in message:
            raise WorkerError(self.label, str(message["error"]))
        return message

    def ask(self, **request: Any) -> dict[str, Any]:
        """Send one request; its reply."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        """Ask the worker to quit, wait for it (killed after two minutes), close its log."""
        if self.process.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                assert self.process.stdin is not None
                self.process.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.process.stdin.flush()
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
