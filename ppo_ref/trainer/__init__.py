"""ppo-ref's PPO-RLHF trainer: every stage of the algorithm, its math delegated to ppo_ref's functions.

Start with :mod:`ppo_ref.trainer.loop` (the numbered stages); :class:`TrainerConfig` documents every
setting; ``ppo-ref train --help`` shows them on the command line. Data parallelism:
:mod:`ppo_ref.trainer.distributed`; checkpoints and resuming: :mod:`ppo_ref.trainer.resume`.

The names below are imported on first use, so that ``ppo_ref.trainer.config`` (all the command
line needs for ``--help`` and for checking flags) loads without transformers and accelerate.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ppo_ref.trainer.build import TrainingSetup
    from ppo_ref.trainer.checkpoint import Checkpoint, find_checkpoint, load_checkpoint
    from ppo_ref.trainer.config import TrainerConfig
    from ppo_ref.trainer.data import EvalResult, Rollout
    from ppo_ref.trainer.loop import PPOTrainer
    from ppo_ref.trainer.scoring import BadScoreError
    from ppo_ref.trainer.stages import ReferenceModelChangedError
    from ppo_ref.trainer.update import LogprobMismatchError, TooManyNonFiniteStepsError

_HOMES = {
    "BadScoreError": "ppo_ref.trainer.scoring",
    "Checkpoint": "ppo_ref.trainer.checkpoint",
    "EvalResult": "ppo_ref.trainer.data",
    "LogprobMismatchError": "ppo_ref.trainer.update",
    "PPOTrainer": "ppo_ref.trainer.loop",
    "ReferenceModelChangedError": "ppo_ref.trainer.stages",
    "Rollout": "ppo_ref.trainer.data",
    "TooManyNonFiniteStepsError": "ppo_ref.trainer.update",
    "TrainerConfig": "ppo_ref.trainer.config",
    "TrainingSetup": "ppo_ref.trainer.build",
    "find_checkpoint": "ppo_ref.trainer.checkpoint",
    "load_checkpoint": "ppo_ref.trainer.checkpoint",
}

__all__ = [
    "BadScoreError",
    "Checkpoint",
    "EvalResult",
    "LogprobMismatchError",
    "PPOTrainer",
    "ReferenceModelChangedError",
    "Rollout",
    "TooManyNonFiniteStepsError",
    "TrainerConfig",
    "TrainingSetup",
    "find_checkpoint",
    "load_checkpoint",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'ppo_ref.trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
