"""What stages 1-6 produce (:class:`Rollout`), and how the rows of several processes become one batch."""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import Tensor

from ppo_ref.trainer.distributed import DataParallel
from ppo_ref.trainer.generation import SequenceBatch, position_ids_from_mask
from ppo_ref.trainer.scoring import ScoredBatch
from ppo_ref.trainer.update import TrainingBatch

__all__ = ["EvalResult", "Rollout", "gather_rollout", "gather_sequences"]


@dataclass(frozen=True)
class Rollout:
    """Stages 1-6 of one iteration. Tensors are (B, N) unless noted; masked-out entries are unused.

    Attributes:
        iteration: the iteration number.
        sample_index: (B,) global index of each sample in the rollout batch (keys its noise).
        prompts, responses: texts (responses without EOS).
        sequences: prompt + response token batch.
        ended: (B,) True where the response stopped at EOS, False where it was cut at max length.
        valid: (B,) False for a sample whose score was bad and skipped (``on_bad_score="skip"``):
            it keeps its tokens but has no action token in :attr:`mask`, so it trains nothing.
        scored: raw scores (NaN where bad), missing-EOS adjustment and final scores (0 where
            skipped), (B,) each.
        old_logprobs, ref_logprobs, values: stage 4 (rollout policy, reference, critic).
        bootstrap_values: (B,) the critic's value after the last response column.
        entropy: per-token entropy of the sampling distribution.
        kl_coef: the KL coefficient used for ``rewards``.
        kl: per-token KL estimate to the reference on every response token (0 off the response).
        rewards: stage 5 token rewards.
        raw_advantages, returns: stage 6 GAE output (not whitened).
        advantages: ``raw_advantages`` whitened over all action tokens of the batch.
    """

    iteration: int
    sample_index: Tensor
    prompts: list[str]
    responses: list[str]
    sequences: SequenceBatch
    ended: Tensor
    valid: Tensor
    scored: ScoredBatch
    old_logprobs: Tensor
    ref_logprobs: Tensor
    values: Tensor
    bootstrap_values: Tensor
    entropy: Tensor
    kl_coef: float
    kl: Tensor
    rewards: Tensor
    raw_advantages: Tensor
    returns: Tensor
    advantages: Tensor

    @property
    def mask(self) -> Tensor:
        """(B, N) bool action mask: the response tokens up to the first EOS of the valid samples."""
        return self.sequences.response_mask & self.valid.unsqueeze(1)

    def training_batch(self) -> TrainingBatch:
        """The tensors stage 7 trains on."""
        return TrainingBatch(
            self.sequences, self.mask, self.old_logprobs, self.values, self.advantages, self.returns
        )


@dataclass(frozen=True)
class EvalResult:
    """Mean score, mean per-sequence KL to the reference, well-formed and EOS rates of an evaluation."""

    score: float
    kl_ref: float
    well_formed_rate: float | None
    eos_rate: float
    samples: int
    skipped_samples: int = 0


def gather_sequences(parallel: DataParallel, sequences: SequenceBatch, pad_id: int) -> SequenceBatch:
    """Every process's rows of a prompt + response batch, in rank order.

    Every process left-pads its prompts to the same width (the whole batch's), so only the
    response columns differ in number; they are right-padded (``pad_id``, attention 0).
    """
    input_ids = parallel.gather_rows(sequences.input_ids, pad_id)
    attention_mask = parallel.gather_rows(sequences.attention_mask, 0)
    return SequenceBatch(
        input_ids, attention_mask, position_ids_from_mask(attention_mask), sequences.prompt_width
    )


def gather_rollout(parallel: DataParallel, local: Rollout, pad_id: int) -> Rollout:
    """The whole batch from every process's rows of it (``local`` itself with one process).

    Row-wise results (generation, scores, forwards, token rewards, GAE) do not depend on the other
    rows, so the gathered tensors are those one process would have computed for the whole batch.
    The caller then computes the batch-wide statistics (KL controller input, whitening).
    """
    if parallel.world_size == 1:
        return local
    rows = parallel.gather_rows
    scored = ScoredBatch(rows(local.scored.raw), rows(local.scored.adjustment), rows(local.scored.scores))
    return replace(
        local,
        sample_index=rows(local.sample_index),
        prompts=parallel.gather_list(local.prompts),
        responses=parallel.gather_list(local.responses),
        sequences=gather_sequences(parallel, local.sequences, pad_id),
        ended=rows(local.ended),
        valid=rows(local.valid),
        scored=scored,
        old_logprobs=rows(local.old_logprobs),
        ref_logprobs=rows(local.ref_logprobs),
        values=rows(local.values),
        bootstrap_values=rows(local.bootstrap_values),
        entropy=rows(local.entropy),
        kl=rows(local.kl),
        rewards=rows(local.rewards),
        raw_advantages=rows(local.raw_advantages),
        returns=rows(local.returns),
        advantages=rows(local.advantages),
    )
