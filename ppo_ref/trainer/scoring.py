"""Stage 3: scoring responses with a reward model or a Python callable, and the missing-EOS rule.

A scorer maps a batch of (prompt, response) pairs to one score per pair. A reward model is
read at the last real token of prompt + response (its EOS when it has one), found from the
attention mask, never from ``input_ids != pad_id`` (pad may equal EOS) and whatever the padding side.
Every score is checked (:func:`check_scores`): one that is not a finite number stops the run with
an error naming the sample, or, with ``on_bad_score = "skip"``, drops the sample from training.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ppo_ref.trainer.data import ScoredBatch, SequenceBatch, position_ids_from_mask
from ppo_ref.trainer.generation import left_pad
from ppo_ref.trainer.models import at_least_float32, call_model, disable_dropout, split_sequence_classifier

__all__ = [
    "BadScoreError",
    "FunctionScorer",
    "RewardModelScorer",
    "ScoreFailure",
    "ScoredBatch",
    "Scorer",
    "apply_missing_eos_rule",
    "check_scores",
]


class Scorer(Protocol):
    """``scorer(prompts, responses, sequences, ended) -> scores``, one per response.

    ``responses`` are the response texts without EOS; ``sequences`` the token batch they come from;
    ``ended`` (B,) bool marks the responses that stopped at EOS. The scores are a float tensor (B,)
    on the CPU or a list of B values; they are checked by :func:`check_scores`, so a scorer may
    return anything there (NaN, None, a :class:`ScoreFailure`) and the run's ``on_bad_score`` decides.
    """

    def __call__(
        self, prompts: Sequence[str], responses: Sequence[str], sequences: SequenceBatch, ended: Tensor
    ) -> Tensor | list[object]: ...


class BadScoreError(ValueError):
    """A score is not a finite number (or the reward function raised) and ``on_bad_score`` is 'error'."""


@dataclass(frozen=True)
class ScoreFailure:
    """Stands for the score of a sample on which the reward function raised ``error``."""

    error: Exception


class FunctionScorer:
    """Wraps a rule or verifier ``(prompts, responses) -> scores``.

    If the function raises on a batch, it is called again on each sample alone to find the samples
    it fails on: their scores become :class:`ScoreFailure` (reported or skipped by
    :func:`check_scores`). A batch that fails although every sample alone succeeds is an error.
    A result of the wrong length is always an error (no score can be tied to its sample).
    """

    def __init__(self, function: Callable[[Sequence[str], Sequence[str]], Sequence[float]]) -> None:
        self.function = function

    def __call__(
        self, prompts: Sequence[str], responses: Sequence[str], sequences: SequenceBatch, ended: Tensor
    ) -> list[object]:
        try:
            scores: list[object] = list(self.function(list(prompts), list(responses)))
        except Exception as error:
            scores = [
                self._alone(prompt, response) for prompt, response in zip(prompts, responses, strict=True)
            ]
            if not any(isinstance(score, ScoreFailure) for score in scores):
                raise BadScoreError(
                    f"reward function: raised {error!r} on a batch of {len(responses)} samples, "
                    "but on none of them alone"
                ) from error
        if len(scores) != len(responses):
            raise BadScoreError(
                f"reward function: returned {len(scores)} scores for {len(responses)} responses "
                "(expected one per response, in order)"
            )
        return scores

    def _alone(self, prompt: str, response: str) -> object:
        try:
            scores = list(self.function([prompt], [response]))
        except Exception as error:
            return ScoreFailure(error)
        return scores[0] if len(scores) == 1 else ScoreFailure(ValueError(f"returned {len(scores)} scores"))


def _as_number(value: object) -> float | None:
    """The value as a float if it is a real number (not a bool) or a one-element tensor, else None."""
    if isinstance(value, Tensor) and value.numel() == 1 and value.dtype != torch.bool:
        return float(value)
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    return None


def check_scores(
    values: Tensor | Sequence[object],
    prompts: Sequence[str],
    responses: Sequence[str],
    sample_index: Sequence[int],
    on_bad_score: str,
) -> tuple[Tensor, Tensor]:
    """``(scores, valid)``: the scores as float32 (B,) with NaN where bad, and (B,) bool of the good ones.

    A score is bad if it is not a finite real number or the reward function raised on its sample.
    With ``on_bad_score="error"`` the first bad score raises :class:`BadScoreError` naming the
    sample (its global index, prompt and response) and the reason; with ``"skip"`` bad samples
    are marked invalid (the caller drops them from training and counts them).
    """
    items = values.tolist() if isinstance(values, Tensor) else list(values)
    if len(items) != len(prompts):
        raise BadScoreError(f"scorer: returned {len(items)} scores for {len(prompts)} responses")
    scores, valid, problems = [], [], []
    for row, value in enumerate(items):
        number = None if isinstance(value, ScoreFailure) else _as_number(value)
        if number is not None and math.isfinite(number):
            scores.append(number)
            valid.append(True)
            continue
        scores.append(math.nan)
        valid.append(False)
        reason = f"raised {value.error!r}" if isinstance(value, ScoreFailure) else f"is {value!r}"
        problems.append((row, reason))
    if problems and on_bad_score == "error":
        row, reason = problems[0]
        more = f" ({len(problems) - 1} more bad scores in this batch)" if len(problems) > 1 else ""
        raise BadScoreError(
            f"reward: the score of sample {sample_index[row]} (prompt {prompts[row]!r}, response "
            f"{responses[row]!r}) {reason}, expected a finite number{more}. Fix the reward, or set "
            "on_bad_score = 'skip' to drop such samples from training (they are counted in metrics)"
        )
    return torch.tensor(scores, dtype=torch.float32), torch.tensor(valid, dtype=torch.bool)


class RewardModelScorer:
    """A one-label ``AutoModelForSequenceClassification`` read at the last real token.

    With ``tokenizer`` None the reward model shares the policy's vocabulary and reads the token
    batch directly; otherwise prompt + response text is re-encoded with the reward model's own
    tokenizer (its EOS appended to responses that ended) and left-padded.
    """

    def __init__(
        self,
        reward_model: PreTrainedModel,
        autocast: Callable[[], AbstractContextManager[object]],
        batch_size: int | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> None:
        self.model = disable_dropout(reward_model)
        self.model.requires_grad_(False)
        self.backbone, self.head = split_sequence_classifier(reward_model)
        self.autocast = autocast
        self.batch_size = batch_size
        self.tokenizer = tokenizer

    @torch.no_grad()
    def score_tokens(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Scores (B,) of token batches with any padding: the head at each row's last real token."""
        device = next(self.model.parameters()).device
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        step = self.batch_size or input_ids.shape[0]
        columns = torch.arange(attention_mask.shape[1], device=device)
        pieces = []
        for start in range(0, input_ids.shape[0], step):
            ids, mask = input_ids[start : start + step], attention_mask[start : start + step]
            with self.autocast():
                hidden = call_model(
                    self.backbone,
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=position_ids_from_mask(mask),
                ).last_hidden_state
                last = torch.where(mask.bool(), columns, -1).amax(dim=1)
                read = hidden[torch.arange(ids.shape[0], device=device), last]
                pieces.append(at_least_float32(self.head(read).squeeze(-1)))
        return torch.cat(pieces).cpu()

    def __call__(
        self, prompts: Sequence[str], responses: Sequence[str], sequences: SequenceBatch, ended: Tensor
    ) -> Tensor:
        if self.tokenizer is None:
            return self.score_tokens(sequences.input_ids, sequences.attention_mask)
        eos = self.tokenizer.eos_token_id
        rows = []
        for prompt, response, has_eos in zip(prompts, responses, ended.tolist(), strict=True):
            encoded = list(self.tokenizer(prompt + response)["input_ids"])
            rows.append([*encoded, eos] if has_eos and isinstance(eos, int) else encoded)
        pad = self.tokenizer.pad_token_id
        input_ids, attention_mask = left_pad(rows, pad if isinstance(pad, int) else 0)
        return self.score_tokens(input_ids, attention_mask)


def apply_missing_eos_rule(
    raw: Tensor, ended: Tensor, rule: str, penalty: float, replacement: float
) -> ScoredBatch:
    """Apply the missing-EOS rule to responses that did not end with EOS (``ended`` False).

    ``none`` keeps the score; ``penalty`` subtracts ``penalty``; ``replace`` sets the score to
    ``replacement`` (the N+ / lm-human-preferences convention with replacement -1).
    """
    ended = ended.to(raw.device)
    if rule == "none":
        adjusted = raw
    elif rule == "penalty":
        adjusted = torch.where(ended, raw, raw - penalty)
    elif rule == "replace":
        adjusted = torch.where(ended, raw, torch.full_like(raw, replacement))
    else:
        raise ValueError(f"rule: expected 'none', 'penalty' or 'replace', got {rule!r}")
    return ScoredBatch(raw=raw, adjustment=adjusted - raw, scores=adjusted)
