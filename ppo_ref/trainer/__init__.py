"""ppo-ref's PPO-RLHF trainer: every stage of the algorithm, its math delegated to ppo_ref's functions.

Start with :mod:`ppo_ref.trainer.loop` (the numbered stages); :class:`TrainerConfig` documents every
setting; ``ppo-ref train --help`` shows them on the command line.
"""

from ppo_ref.trainer.config import TrainerConfig
from ppo_ref.trainer.loop import EvalResult, PPOTrainer, ReferenceModelChangedError, Rollout, TrainingSetup
from ppo_ref.trainer.update import LogprobMismatchError, TooManyNonFiniteStepsError

__all__ = [
    "EvalResult",
    "LogprobMismatchError",
    "PPOTrainer",
    "ReferenceModelChangedError",
    "Rollout",
    "TooManyNonFiniteStepsError",
    "TrainerConfig",
    "TrainingSetup",
]
