"""The ``ppo-ref`` command's entry point: the CPU thread policy first, then the command.

OpenMP reads ``OMP_NUM_THREADS`` and ``OMP_WAIT_POLICY`` once, when torch loads, so this module
(outside the ``ppo_ref`` package, whose ``__init__`` imports torch) sets them and only then imports
:mod:`ppo_ref.cli`. The policy suits a shared machine, where every laptop and CI runner is:

- threads: ``--threads N`` on the command line, else ``threads = N`` in the ``--config`` TOML file,
  else the environment's ``OMP_NUM_THREADS``, else :data:`DEFAULT_THREADS` (1). ``0`` leaves torch's
  own default (one thread per core).
- wait policy: ``PASSIVE`` at one thread (no OpenMP worker spins for work, so a busy core costs a
  descheduled worker nothing), OpenMP's default (spinning, the faster choice on idle cores) for more;
  an ``OMP_WAIT_POLICY`` already in the environment is kept.

The trainer's models are small: a second thread bought nothing idle and cost 3-20x on a busy
machine (``bench/thread_policy.py`` measures the choices; ``bench/RESULTS.md`` has the figures).
Only the standard library is imported before the policy is applied.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping, Sequence
from typing import Any

DEFAULT_THREADS = 1
"""The command's thread count when neither the command line, the config file nor the environment sets one."""


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The last value given to ``flag`` (``--flag V`` or ``--flag=V``) before a ``--``, or None."""
    value = None
    for i, word in enumerate(argv):
        if word == "--":
            break
        if word == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(flag + "="):
            value = word.partition("=")[2]
    return value


def requested_threads(argv: Sequence[str], environ: MutableMapping[str, str]) -> int | None:
    """The thread count asked for by ``argv`` (flag, then config file) or the environment, or None.

    Unreadable values are left to the command's own parser, which reports them (exit 2): here they
    count as not given.
    """
    for text in (_flag_value(argv, "--threads"), _config_threads(_flag_value(argv, "--config"))):
        if text is not None:
            try:
                return int(text)
            except ValueError:
                return None
    env = environ.get("OMP_NUM_THREADS", "").strip()
    return int(env) if env.isdigit() else None


def _config_threads(path: str | None) -> str | None:
    if path is None:
        return None
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: the trainer reads its config with tomli
        try:
            import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            return None
    try:
        with open(path, "rb") as handle:
            value: Any = tomllib.load(handle).get("threads")
    except (OSError, ValueError):  # TOMLDecodeError is a ValueError
        return None
    return None if value is None or isinstance(value, bool) else str(value)


def apply_thread_policy(argv: Sequence[str], environ: MutableMapping[str, str]) -> int | None:
    """Set ``OMP_NUM_THREADS`` and ``OMP_WAIT_POLICY`` in ``environ`` for ``argv``; return the threads
    chosen (None: torch's default, for ``threads = 0``). Must run before torch is imported."""
    threads = requested_threads(argv, environ)
    if threads is None:
        threads = DEFAULT_THREADS
    if threads <= 0:
        return None
    environ["OMP_NUM_THREADS"] = str(threads)
    if threads == 1:
        environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return threads


def main(argv: Sequence[str] | None = None) -> int:
    """``ppo-ref ARGS``: apply the thread policy, then run :func:`ppo_ref.cli.main`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "torch" not in sys.modules:
        apply_thread_policy(args, os.environ)
    from ppo_ref.cli import main as cli_main

    return cli_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
