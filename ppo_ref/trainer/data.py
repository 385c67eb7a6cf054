"""The trainer's plain data types: what each stage hands to the next. This module imports only torch.

    SequenceBatch   prompts (left-padded) + responses (stage 2), the input of every forward
    ScoredBatch     stage 3's scores: raw, missing-EOS adjustment, final
    Rollout         stages 1-6 of one iteration
    TrainingBatch   what stage 7 trains on (a view of a rollout)
    EvalResult      the held-out evaluation's figures

Everything else in :mod:`ppo_ref.trainer` imports these from here; nothing here imports the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "EvalResult",
    "Rollout",
    "ScoredBatch",
    "SequenceBatch",
    "TrainingBatch",
    "position_ids_from_mask",
]


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """``cumsum(mask) - 1`` clamped at 0: the first real token is at position 0 whatever the padding."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass(frozen=True)
class SequenceBatch:
    """Prompts (left-padded) followed by responses (right-padded after their EOS).

    Attributes:
        input_ids: (B, P + N) token ids; columns ``prompt_width:`` are the response.
        attention_mask: (B, P + N) int64, 1 on prompt tokens and response tokens up to the first EOS.
        position_ids: (B, P + N) ``cumsum(attention_mask) - 1`` clamped at 0.
        prompt_width: P, the padded prompt width (every row's last prompt token is at column P - 1).
    """

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    prompt_width: int

    @staticmethod
    def build(
        prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor
    ) -> SequenceBatch:
        """Concatenate prompt and response tensors and derive the position ids."""
        attention_mask = torch.cat([prompt_mask.long(), response_mask.long()], dim=1)
        return SequenceBatch(
            input_ids=torch.cat([prompt_ids, response_ids], dim=1),
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            prompt_width=prompt_ids.shape[1],
        )

    @property
    def response_ids(self) -> Tensor:
        """(B, N) the response columns."""
        return self.input_ids[:, self.prompt_width :]

    @property
    def response_mask(self) -> Tensor:
        """(B, N) bool, True on action tokens (response tokens up to and including the first EOS)."""
        return self.attention_mask[:, self.prompt_width :].bool()

    @property
    def response_width(self) -> int:
        """N, the number of response columns."""
        return self.input_ids.shape[1] - self.prompt_width

    def rows(self, index: Tensor | slice) -> SequenceBatch:
        """The sub-batch of the given rows (same column layout)."""
        return SequenceBatch(
            self.input_ids[index], self.attention_mask[index], self.position_ids[index], self.prompt_width
        )


@dataclass(frozen=True)
class ScoredBatch:
    """Stage 3's result: ``raw`` scores from the scorer, the ``adjustment`` of the missing-EOS rule,
    and ``scores = raw + adjustment``, each (B,) float32."""

    raw: Tensor
    adjustment: Tensor
    scores: Tensor


@dataclass(frozen=True)
class TrainingBatch:
    """What stage 7 needs from a rollout; every tensor is (B, N) except ``sequences``.

    ``ref_logprobs`` (the reference's log-probs, for ``kl_in = "loss"``) and ``correction_weights``
    (the rollout-correction weights, for ``rollout_correction``) are None when not given.
    """

    sequences: SequenceBatch
    mask: Tensor
    old_logprobs: Tensor
    old_values: Tensor
    advantages: Tensor
    returns: Tensor
    ref_logprobs: Tensor | None = None
    correction_weights: Tensor | None = None

    def rows(self, index: Tensor | slice) -> TrainingBatch:
        """The sub-batch of the given rows."""
        return TrainingBatch(
            self.sequences.rows(index),
            self.mask[index],
            self.old_logprobs[index],
            self.old_values[index],
            self.advantages[index],
            self.returns[index],
            None if self.ref_logprobs is None else self.ref_logprobs[index],
            None if self.correction_weights is None else self.correction_weights[index],
        )

    @property
    def size(self) -> int:
        """Number of rows."""
        return self.mask.shape[0]


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
        old_logprobs, ref_logprobs, values: stage 4 (rollout policy, reference, critic);
            ``ref_logprobs`` is None when the run has no KL term (``kl_coef = 0``, fixed: no
            reference forward, :attr:`TrainerConfig.uses_reference_forward`).
        bootstrap_values: (B,) the critic's value after the last response column.
        entropy: per-token entropy of the sampling distribution.
        kl_coef: the KL coefficient used for ``rewards``.
        kl: per-token KL estimate to the reference on every response token (0 off the response),
            or None without reference log-probs.
        rewards: stage 5 token rewards.
        raw_advantages, returns: stage 6 advantage estimator's output (not whitened).
        advantages: ``raw_advantages`` whitened over all action tokens of the batch.
        rollout_logprobs: the sampler's log-prob of each sampled token (the generator's
            distribution, at ``sampling_temperature``), recorded only for ``rollout_correction``.
        correction_weights: ``rollout_correction``'s weights of the old log-probs against
            ``rollout_logprobs`` (0 off the mask), or None without a correction.
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
    ref_logprobs: Tensor | None
    values: Tensor
    bootstrap_values: Tensor
    entropy: Tensor
    kl_coef: float
    kl: Tensor | None
    rewards: Tensor
    raw_advantages: Tensor
    returns: Tensor
    advantages: Tensor
    rollout_logprobs: Tensor | None = None
    correction_weights: Tensor | None = None

    @property
    def mask(self) -> Tensor:
        """(B, N) bool action mask: the response tokens up to the first EOS of the valid samples."""
        return self.sequences.response_mask & self.valid.unsqueeze(1)

    def training_batch(self) -> TrainingBatch:
        """The tensors stage 7 trains on."""
        return TrainingBatch(
            self.sequences,
            self.mask,
            self.old_logprobs,
            self.values,
            self.advantages,
            self.returns,
            self.ref_logprobs,
            self.correction_weights,
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
