"""The trainer-step tier's data: the batch a runner gets (:class:`StepBatch`), what it returns
(:class:`StepResult`), the runner protocol (:class:`StepRunner`), the tier's constants and tolerances,
and the length penalty a runner may declare (:class:`LengthPenalty`). The functions that read and
judge them are in :mod:`ppo_ref.adapters.step`, which re-exports every name here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from torch import Tensor

__all__ = [
    "ACCUMULATION_STEPS",
    "OUTPUTS",
    "RATIO_TOLERANCE",
    "RELATIVE_TOLERANCE",
    "STEP_STATISTICS",
    "SUITE_BUDGET",
    "SUITE_PROMPT_LENGTH",
    "LengthPenalty",
    "StepBatch",
    "StepResult",
    "StepRunner",
]

RELATIVE_TOLERANCE = 1e-5
"""STEP-2..4: of the gradient's largest entry (float32 trainers agree to about 1e-7 relative, float64
to 1e-16); the loss within the same fraction of ``max(|loss|, 1)``."""
RATIO_TOLERANCE = 1e-6
"""STEP-1: ``max |logp - old_logp|`` over the action tokens before any update."""
SUITE_BUDGET = 6
SUITE_PROMPT_LENGTH = 9
"""The suite's batch is ``example_batch(SUITE_BUDGET, prompt_length=SUITE_PROMPT_LENGTH)``: ``pad_to``
9 then pads the completions only, 10 also left-pads the prompts by one column."""

ACCUMULATION_STEPS: tuple[int, ...] = (2, 4)
"""STEP-6: the accumulation counts k at which one optimizer step over k accumulation steps is compared
with one step over the whole batch."""

STEP_STATISTICS: tuple[str, ...] = ("max_abs_log_ratio", "clipfrac", "approx_kl")
"""Statistics a runner reports when its library computes them (None where it does not):
``max_abs_log_ratio`` = max over action tokens of ``|logp - old_logp|`` before any update (the
step-0 ratio is exp of it), ``clipfrac`` the fraction of action tokens whose ratio was clipped,
``approx_kl`` the library's approximate KL between the policy and the rollout policy."""

OUTPUTS: Mapping[str, str] = {
    "loss_mask": "(B, T) the library's loss mask over each row's completion tokens: a row it masks "
    "entirely is treated as truncated (masked)",
    "rewards": "(B,) each row's total reward as the library computed it from the batch's score: a row "
    "whose reward differs from its score is treated as truncated (penalised, e.g. for a missing EOS "
    "or for its length)",
    "advantages": "(B, T) the library's advantages of each row's completion tokens",
    "advantages_bootstrapped": "(B, T) the same advantages with the value after each row's last token "
    "set to 1 instead of 0: a row whose advantages move is treated as truncated (bootstrapped)",
    "correction_weights": "(B, T) the library's rollout-correction weights of each row's completion "
    "tokens, before they multiply the loss (STEP-8's sampling_run)",
}
"""The library's own per-row outputs a :class:`StepResult` may carry (rows in batch order), from
which STEP-5 derives the rows the library treated as truncated (:func:`treated_as_truncated`) and
STEP-8 reads the correction weights."""


@dataclass(frozen=True)
class LengthPenalty:
    """A declared STEP-5 convention: the library adds to each row's reward a penalty that depends on
    the row's length only, the soft overlong punishment of DAPO (Yu et al. 2025, "DAPO: an open-source
    LLM reinforcement learning system at scale", Sec. 3.4 "Overlong Reward Shaping", the soft
    overlong punishment R_length(y))::

        R_length(|y|) = 0                                   if |y| <= L_max - L_cache
                        ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                        -1                                  if |y| > L_max

    times ``factor``, with ``L_cache`` = ``buffer`` and ``L_max`` = the batch's token budget (the
    runner sets the library's maximum response length to it). The formula reads ``|y|`` alone, as
    the paper writes it: a response ending with EOS on its ``L_max``-th token gets the same -1 as one
    cut there. A runner declaring it (attribute ``truncation_convention``) has STEP-5 expect every
    row's reward to be its score plus this penalty (:meth:`rewards`); a row rewarded otherwise is
    treated as truncated, which only a row cut at the budget may be.

    Attributes:
        buffer: ``L_cache`` (>= 1 token).
        factor: the penalty's scale (> 0; the paper's is 1).
        source: where the library implements it and the paper's equation (shown in the verdict).

    Example: budget 6, buffer 1: ``penalty(6, 6) == -1.0``, ``penalty(5, 6) == 0.0``.
    """

    buffer: int
    factor: float = 1.0
    source: str = "DAPO (Yu et al. 2025) Sec. 3.4, soft overlong punishment"

    def __post_init__(self) -> None:
        if not isinstance(self.buffer, int) or isinstance(self.buffer, bool) or self.buffer < 1:
            raise ValueError(f"buffer: expected an int >= 1 (L_cache), got {self.buffer!r}")
        if not isinstance(self.factor, (int, float)) or not math.isfinite(self.factor) or self.factor <= 0:
            raise ValueError(f"factor: expected a finite number > 0, got {self.factor!r}")
        if not isinstance(self.source, str) or not self.source:
            raise ValueError(f"source: expected a non-empty str, got {self.source!r}")

    def penalty(self, length: int, budget: int) -> float:
        """``factor * R_length(length)`` with ``L_max`` = ``budget``."""
        if not isinstance(budget, int) or budget < self.buffer:
            raise ValueError(f"budget: expected an int >= the buffer {self.buffer}, got {budget!r}")
        if not isinstance(length, int) or length < 0:
            raise ValueError(f"length: expected an int >= 0, got {length!r}")
        start = budget - self.buffer
        if length <= start:
            return 0.0
        if length <= budget:
            return self.factor * (start - length) / self.buffer
        return -self.factor

    def rewards(self, batch: StepBatch) -> tuple[float, ...]:
        """(B,) each row's expected reward under the convention: its score plus the penalty of its
        length (EOS included), ``L_max`` = ``batch.budget``."""
        return tuple(
            score + self.penalty(len(row), batch.budget)
            for score, row in zip(batch.scores, batch.completions, strict=True)
        )


def _check_ids(name: str, rows: tuple[tuple[int, ...], ...], vocab_size: int) -> None:
    for index, row in enumerate(rows):
        if not isinstance(row, tuple) or not all(isinstance(t, int) and 0 <= t < vocab_size for t in row):
            raise ValueError(
                f"{name}: row {index} must be a tuple of token ids in [0, {vocab_size}), got {row!r}"
            )


@dataclass(frozen=True)
class StepBatch:
    """One fixed rollout batch, library-neutral.

    Attributes:
        prompt_ids: G prompts (token ids, all the same length P >= 1, no padding).
        completions: B = G * group_size completions; row ``i`` answers prompt ``i // group_size``.
            A row that ends with ``eos_id`` is terminal (it may be as long as ``budget``); a row of
            exactly ``budget`` tokens without EOS was cut at the budget (truncated). EOS appears
            only as a row's last token. Lengths 1..budget.
        scores: (B,) the reward of each completion (the library turns them into advantages).
        group_size: completions per prompt (>= 2).
        budget: the token budget (max completion length).
        eos_id, pad_id, vocab_size: the tokenizer's ids (``eos_id != pad_id``).

    Sign convention: scores are rewards (higher is better); the runner minimises its loss.
    """

    prompt_ids: tuple[tuple[int, ...], ...]
    completions: tuple[tuple[int, ...], ...]
    scores: tuple[float, ...]
    group_size: int
    budget: int
    eos_id: int = 1
    pad_id: int = 0
    vocab_size: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.vocab_size, int) or self.vocab_size < 3:
            raise ValueError(f"vocab_size: expected an int >= 3, got {self.vocab_size!r}")
        for name in ("eos_id", "pad_id"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value < self.vocab_size:
                raise ValueError(f"{name}: expected a token id in [0, {self.vocab_size}), got {value!r}")
        if self.eos_id == self.pad_id:
            raise ValueError("eos_id: must differ from pad_id (a padded column must not read as an EOS)")
        if not isinstance(self.group_size, int) or self.group_size < 2:
            raise ValueError(f"group_size: expected an int >= 2, got {self.group_size!r}")
        if not isinstance(self.budget, int) or self.budget < 1:
            raise ValueError(f"budget: expected an int >= 1, got {self.budget!r}")
        if not self.prompt_ids or len({len(p) for p in self.prompt_ids}) != 1 or not self.prompt_ids[0]:
            raise ValueError("prompt_ids: expected >= 1 prompts, all of the same length >= 1")
        _check_ids("prompt_ids", self.prompt_ids, self.vocab_size)
        _check_ids("completions", self.completions, self.vocab_size)
        rows = len(self.prompt_ids) * self.group_size
        if len(self.completions) != rows:
            raise ValueError(
                f"completions: expected {rows} rows (prompts x group_size), got {len(self.completions)}"
            )
        for index, row in enumerate(self.completions):
            if not 1 <= len(row) <= self.budget:
                raise ValueError(f"completions: row {index} has {len(row)} tokens, expected 1..{self.budget}")
            if self.eos_id in row[:-1]:
                raise ValueError(f"completions: row {index} has an EOS before its last token")
            if self.eos_id not in row and len(row) != self.budget:
                raise ValueError(f"completions: row {index} neither ends with EOS nor fills the budget")
        if len(self.scores) != rows or not all(
            isinstance(s, (int, float)) and math.isfinite(s) for s in self.scores
        ):
            raise ValueError(f"scores: expected {rows} finite floats, got {self.scores!r}")

    @property
    def size(self) -> int:
        """B, the number of completions."""
        return len(self.completions)

    @property
    def truncated(self) -> tuple[bool, ...]:
        """(B,) True for a row cut at the budget (no EOS): the only rows STEP-5 lets a library
        bootstrap, penalise or mask as truncated."""
        return tuple(row[-1] != self.eos_id for row in self.completions)

    def with_completion(self, row: int, tokens: tuple[int, ...]) -> StepBatch:
        """A copy with completion ``row`` replaced (the scores kept)."""
        completions = list(self.completions)
        completions[row] = tokens
        return StepBatch(
            self.prompt_ids,
            tuple(completions),
            self.scores,
            self.group_size,
            self.budget,
            self.eos_id,
            self.pad_id,
            self.vocab_size,
        )


@dataclass
class StepResult:
    """What one step of a library's training code produced.

    Attributes:
        gradient: parameter name -> float64 gradient of the step's objective, accumulated over its
            micro-batches (before any clipping; plain SGD with learning rate 1 subtracts exactly this).
        loss: the objective the gradient is of (the sum of the micro-batches' backward losses).
        stats: the logged statistics of :data:`STEP_STATISTICS` (None where the library has none),
            plus any library-specific extras.
        outputs: the library's own per-row outputs named in :data:`OUTPUTS` (the runner's
            ``provenance`` names where it read them), rows in batch order; STEP-5 reads them.
    """

    gradient: dict[str, Tensor]
    loss: float
    stats: dict[str, float | None] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)


@runtime_checkable
class StepRunner(Protocol):
    """The step capability (attribute ``step`` of an adapter).

    ``loss_modes`` lists every loss aggregation the library offers under its own names;
    ``micro_batch_local`` maps each mode that the library *documents* as normalised within a
    micro-batch to where it says so (a declared convention: STEP-2's dependence on the split is
    measured and reported for it, not failed). ``provenance`` names the library code each run goes
    through, and where the result's ``outputs`` come from.

    STEP-5 reads the ``outputs`` of ``truncation_run(batch)`` where the runner has that optional
    method (a run with the library's truncation handling switched on, e.g. TRL's
    ``mask_truncated_completions``; its gradient may be empty), else those of ``run(batch,
    loss_mode=loss_modes[0])``. A runner may still say which rows it believes truncated
    (``truncated_rows(batch)``): the claim is only cross-checked against the measurement. A runner
    whose library shapes the reward by length alone, as a paper prescribes, declares it in the
    optional attribute ``truncation_convention`` (a :class:`LengthPenalty`): STEP-5 then expects
    every row's reward to be its score plus that penalty (:func:`truncation_problems`). A runner
    whose library has no truncation handling of its own on the path it runs (no stop reason reaches
    the loss mask, the rewards or the advantages) says so in the optional attribute
    ``truncation_not_provided``: the reason, naming the library's file and line where the stop
    reason ends. STEP-5 then reports "not provided" with that reason, after checking the declaration
    against the measurement: a library declared without truncation handling must treat no row as
    truncated (else STEP-5 fails). It excludes ``truncation_run`` and ``truncation_convention``.

    STEP-6 (gradient accumulation) needs the optional attribute ``accumulation_setting``: the
    library's gradient-accumulation setting the runner drives and where the library scales each
    accumulation step's loss (file:line). The runner then either has the optional method
    ``accumulation_run(batch, *, loss_mode, accumulation_steps)`` (one optimizer step with the setting
    at ``accumulation_steps`` = k, run as the library runs it for a user; its stats may carry
    ``optimizer_steps``, the optimizer steps the library took, which must be 1), or, without it,
    STEP-6 reads ``run(batch, loss_mode=..., micro_batches=k)``: the runner says by declaring the
    setting that its micro-batches *are* the setting's accumulation steps. A runner whose library has
    no accumulation setting says so in the optional attribute ``accumulation_not_provided`` (the
    reason, naming the library's file and line): STEP-6 is then "not provided", never a pass. It
    excludes ``accumulation_setting`` and ``accumulation_run``.

    STEP-7 (STEP-3's left padding on the position scheme the runner's own model lacks) reads the
    optional attribute ``family`` (the family of the tiny model the runner builds: a name of
    ``step_kit.FAMILIES`` or a ``config.json`` mapping) and calls the optional method
    ``with_family(family)``, the same runner on a tiny model of the other scheme's family (GPT-2 for
    a rotary model, Qwen2 for GPT-2). A library that cannot run a model of that family says so in
    the optional mapping ``family_not_provided`` (family -> the reason, naming the library's file
    and line): STEP-7 is then "not provided". A runner with no ``with_family`` gets "not run", never
    a pass.

    STEP-8 (a rollout sampled with top-k / top-p) reads the optional attribute
    ``sampling_convention`` (``"full"`` or ``"truncated"``: the support of the old log-probs the
    library's rollout correction compares with the sampler's, :mod:`ppo_ref.adapters.step_sampling`)
    and calls two optional methods: ``policy_logits(batch)``, (B, L, V) logits of the runner's model
    before any update at each completion position, divided by the library's sampling temperature
    (the suite draws the rollout from them), and ``sampling_run(sampled)``, one step of the library
    on the :class:`~ppo_ref.adapters.step_sampling.SampledRollout` with the sampler's log-probs fed
    where the library takes them and its rollout correction on at the token level; its stats carry
    ``max_abs_log_ratio`` and its outputs ``correction_weights`` (B, T), the weights before they
    multiply the loss. A library whose rollout has no top-k / top-p says so in the optional attribute
    ``sampling_not_provided`` (the reason, file and line): STEP-8 is then "not provided"; a runner
    without the two methods gets "not run", never a pass.
    """

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def provenance(self) -> str: ...

    @property
    def loss_modes(self) -> tuple[str, ...]: ...

    @property
    def micro_batch_local(self) -> Mapping[str, str]: ...

    def run(
        self,
        batch: StepBatch,
        *,
        loss_mode: str,
        micro_batches: int = 1,
        pad_to: int | None = None,
        pad_fill: int | None = None,
    ) -> StepResult:
        """One step on ``batch``: ``micro_batches`` equal parts with gradient accumulation (through
        the library's own split), completions padded to ``pad_to`` columns (>= the longest; None:
        the library's own width) with ``pad_fill`` written in the padding slots (None: the pad id)."""
        ...
