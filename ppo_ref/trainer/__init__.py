"""ppo-ref's PPO-RLHF trainer: every stage of the algorithm, its math delegated to ppo_ref's functions.

Start with :mod:`ppo_ref.trainer.loop` (the numbered stages); :class:`TrainerConfig` documents every
setting; ``ppo-ref train --help`` shows them on the command line. Data parallelism:
:mod:`ppo_ref.trainer.distributed`; checkpoints and resuming: :mod:`ppo_ref.trainer.resume`.
"""

from ppo_ref.trainer.checkpoint import Checkpoint, find_checkpoint, load_checkpoint
from ppo_ref.trainer.config import TrainerConfig
from ppo_ref.trainer.loop import EvalResult, PPOTrainer, ReferenceModelChangedError, Rollout, TrainingSetup
from ppo_ref.trainer.scoring import BadScoreError
from ppo_ref.trainer.update import LogprobMismatchError, TooManyNonFiniteStepsError

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
