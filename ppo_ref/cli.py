"""The ``ppo-ref`` command, kept importable here: it lives with the trainer, in :mod:`ppo_ref.trainer.cli`.

``ppo_ref.cli:main`` (the installed script's entry point) and ``python -m ppo_ref.cli`` (torchrun,
``accelerate launch``) both run it.
"""

from __future__ import annotations

from ppo_ref.trainer.cli import build_parser, check_output_dir, main, resolve_config, run_files

__all__ = ["build_parser", "check_output_dir", "main", "resolve_config", "run_files"]

if __name__ == "__main__":
    raise SystemExit(main())
