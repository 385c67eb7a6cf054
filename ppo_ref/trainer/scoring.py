"""Stage 3: scoring responses with a reward model or a Python callable, and the missing-EOS rule.

A scorer maps a batch of (prompt, response) pairs to one float32 score per pair. A reward model is
read at the last real token of prompt + response (its EOS when it has one), found from the
attention mask, never from ``input_ids != pad_id`` (pad may equal EOS) and whatever the padding side.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ppo_ref.trainer.generation import SequenceBatch, left_pad, position_ids_from_mask
from ppo_ref.trainer.models import call_model, disable_dropout, split_sequence_classifier

__all__ = [
    "FunctionScorer",
    "RewardModelScorer",
    "ScoredBatch",
    "Scorer",
    "apply_missing_eos_rule",
]


class Scorer(Protocol):
    """``scorer(prompts, responses, sequences, ended) -> scores`` (B,) float32 on the CPU.

    ``responses`` are the response texts without EOS; ``sequences`` the token batch they come from;
    ``ended`` (B,) bool marks the responses that stopped at EOS.
    """

    def __call__(
        self, prompts: Sequence[str], responses: Sequence[str], sequences: SequenceBatch, ended: Tensor
    ) -> Tensor: ...


class FunctionScorer:
    """Wraps a rule or verifier ``(prompts, responses) -> scores`` and checks what it returns."""

    def __init__(self, function: Callable[[Sequence[str], Sequence[str]], Sequence[float]]) -> None:
        self.function = function

    def __call__(
        self, prompts: Sequence[str], responses: Sequence[str], sequences: SequenceBatch, ended: Tensor
    ) -> Tensor:
        scores = list(self.function(list(prompts), list(responses)))
        if len(scores) != len(responses):
            raise ValueError(f"reward function: returned {len(scores)} scores for {len(responses)} responses")
        for index, score in enumerate(scores):
            if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
                raise ValueError(
                    f"reward function: score of sample {index} (prompt {prompts[index]!r}, response "
                    f"{responses[index]!r}) is {score!r}, expected a finite number"
                )
        return torch.tensor([float(s) for s in scores], dtype=torch.float32)


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
                pieces.append(self.head(read).squeeze(-1).float())
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


@dataclass(frozen=True)
class ScoredBatch:
    """Stage 3's result: ``raw`` scores from the scorer, the ``adjustment`` of the missing-EOS rule,
    and ``scores = raw + adjustment``, each (B,) float32."""

    raw: Tensor
    adjustment: Tensor
    scores: Tensor


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
