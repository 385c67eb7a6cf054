"""The ``ppo-ref`` command, kept importable here: it lives with the trainer, in :mod:`ppo_ref.trainer.cli`.

The installed script's entry point, ``ppo_ref_entry:main``, sets the CPU thread policy before torch
loads and then calls :func:`main`; ``python -m ppo_ref.cli`` (torchrun, ``accelerate launch``, which
set ``OMP_NUM_THREADS`` themselves) runs it directly.
"""

from __future__ import annotations

from collections.abc import Sequence

from ppo_ref.trainer.cli import build_parser, check_output_dir, resolve_config, run_files
from ppo_ref.trainer.cli import main as _train_main

__all__ = ["build_parser", "check_output_dir", "main", "resolve_config", "run_files"]


def main(argv: Sequence[str] | None = None) -> int:
    """``ppo-ref step-check ...`` (:mod:`ppo_ref.adapters.step_check`), else the trainer's commands."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["step-check"]:
        from ppo_ref.adapters.step_check import main as step_check_main

        return step_check_main(args[1:])
    if args in (["-h"], ["--help"]):
        build_parser().print_help()
        print("\nalso: step-check  the trainer-step tier at your TRL or verl settings (step-check --help)")
        return 0
    return _train_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
