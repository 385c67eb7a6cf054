"""How the rows of several processes become one batch (a :class:`~ppo_ref.trainer.data.Rollout`)."""

from __future__ import annotations

from dataclasses import replace

from ppo_ref.trainer.data import Rollout, ScoredBatch, SequenceBatch, position_ids_from_mask
from ppo_ref.trainer.distributed import DataParallel

__all__ = ["gather_rollout", "gather_sequences"]


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
        ref_logprobs=None if local.ref_logprobs is None else rows(local.ref_logprobs),
        values=rows(local.values),
        bootstrap_values=rows(local.bootstrap_values),
        entropy=rows(local.entropy),
        kl=None if local.kl is None else rows(local.kl),
        rewards=rows(local.rewards),
        raw_advantages=rows(local.raw_advantages),
        returns=rows(local.returns),
        advantages=rows(local.advantages),
        rollout_logprobs=None if local.rollout_logprobs is None else rows(local.rollout_logprobs),
        correction_weights=None if local.correction_weights is None else rows(local.correction_weights),
    )
