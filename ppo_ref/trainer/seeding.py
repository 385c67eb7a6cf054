"""Counter-based randomness: every random draw of a run is keyed by (seed, stream, keys...).

Nothing in the trainer reads a global random state. A draw is a function of the run's seed, the
stream it belongs to (prompt sampling, sampling noise, minibatch shuffling, evaluation) and its
position (iteration, epoch, global sample index). So the samples of a rollout are the same whatever
the number of processes that generate them, and evaluation never consumes training randomness.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
import torch
from torch import Tensor

__all__ = ["Stream", "sampling_uniforms", "stream_rng"]


class Stream(IntEnum):
    """The independent random streams of a run (the value is part of every key)."""

    PROMPTS = 1
    SAMPLING = 2
    SHUFFLE = 3
    EVAL_SAMPLING = 4
    HOLDOUT_SPLIT = 5


def stream_rng(seed: int, stream: Stream, *keys: int) -> np.random.Generator:
    """A numpy generator determined by ``(seed, stream, *keys)`` (SeedSequence hashing)."""
    return np.random.default_rng([seed, int(stream), *keys])


def sampling_uniforms(
    seed: int, stream: Stream, iteration: int, sample_indices: Tensor, steps: int
) -> Tensor:
    """Uniform [0, 1) noise (B, steps); row b is keyed by (seed, stream, iteration, sample_indices[b]).

    One row per sample, one column per generation step: the token sampled at step t of sample i
    depends only on the model's distribution there and on this number, not on which other samples
    share the batch. Returned as float64 on the CPU.
    """
    rows = [
        stream_rng(seed, stream, iteration, int(index)).random(steps) for index in sample_indices.tolist()
    ]
    return torch.from_numpy(np.stack(rows)) if rows else torch.zeros(0, steps, dtype=torch.float64)
