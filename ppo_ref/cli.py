"""The ``ppo-ref`` command, kept importable here: it lives with the trainer, in :mod:`ppo_ref.trainer.cli`.

The installed script's entry point, ``ppo_ref_entry:main``, sets the CPU thread policy before torch
loads and then calls :func:`main`; ``python -m ppo_ref.cli`` (torchrun, ``accelerate launch``, which
set ``OMP_NUM_THREADS`` themselves) runs it directly.
"""

from __future__ import annotations

from ppo_ref.trainer.cli import build_parser, check_output_dir, main, resolve_config, run_files

__all__ = ["build_parser", "check_output_dir", "main", "resolve_config", "run_files"]

if __name__ == "__main__":
    raise SystemExit(main())
