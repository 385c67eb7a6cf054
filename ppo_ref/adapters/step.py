"""The trainer-step tier (spec STEP-1..8): an optional adapter capability that runs one
optimisation step of a library's own training code on a tiny model and a fixed batch.

The op contract (:mod:`ppo_ref.adapters.base`) calls a library's loss functions one at a time; the
bugs that live *between* the ops (how a trainer normalises the loss over micro-batches and
gradient accumulation, what padding does to the loss, which rows its rollout path treats as
truncated) are out of its reach. A step runner reaches them: it takes a :class:`StepBatch`
(prompts, completions and scores as token ids and floats, nothing library-specific), feeds it to
the library's own rollout-to-advantage and loss-and-backward path, and returns a
:class:`StepResult`: the gradient of the objective accumulated over the step's micro-batches
(what a plain-SGD step with learning rate 1 subtracts from the parameters), the loss, the
statistics the library logs, and the library's own per-row outputs (:data:`OUTPUTS`) from which
STEP-5 measures the rows it treated as truncated. STEP-6 runs the library's gradient-accumulation
setting (the runner's optional ``accumulation_setting``); STEP-7 runs STEP-3's left padding again on a
model of the position scheme the runner's own lacks (its optional ``family`` and ``with_family``);
STEP-8 runs the library's rollout correction on a rollout the suite sampled with top-k / top-p
(:mod:`ppo_ref.adapters.step_sampling`: the runner's optional ``sampling_convention``,
``policy_logits`` and ``sampling_run``).
:mod:`ppo_ref.adapters.step_kit` holds what every
runner needs besides the library call; :mod:`ppo_ref.adapters.step_check` runs the tier at a user's
own TRL or verl settings (``ppo-ref step-check``). The batch, result and runner types and the tier's
constants are in :mod:`ppo_ref.adapters.step_types` (re-exported here); this module holds what reads
and judges them: the contract check, the optional declarations, the built-in runners, the gradient
comparison and STEP-5's truncation measure.

An adapter offers the tier through an attribute ``step`` holding a :class:`StepRunner`; the
suite (``conformance/test_step_tier.py``) skips the tier when the attribute is missing. The
runner builds its own tiny model from a fixed seed, so results compare within one runner (the
same batch split two ways, padded two ways), never across libraries.

Example (ppo-ref's own trainer)::

    >>> from ppo_ref.adapters.step import StepBatch, example_batch
    >>> batch = example_batch()
    >>> len(batch.completions), batch.group_size, batch.budget
    (8, 4, 6)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from ppo_ref.adapters.step_sampling import (
    SAMPLING_CONVENTIONS,
    SAMPLINGS,
    SampledRollout,
    sampled_rollout,
    sampling_problems,
)
from ppo_ref.adapters.step_types import (
    ACCUMULATION_STEPS,
    OUTPUTS,
    RATIO_TOLERANCE,
    RELATIVE_TOLERANCE,
    STEP_STATISTICS,
    SUITE_BUDGET,
    SUITE_PROMPT_LENGTH,
    LengthPenalty,
    StepBatch,
    StepResult,
    StepRunner,
)

__all__ = [
    "ACCUMULATION_STEPS",
    "BUILTIN_STEP_RUNNERS",
    "OUTPUTS",
    "POSITION_SCHEMES",
    "RATIO_TOLERANCE",
    "RELATIVE_TOLERANCE",
    "SAMPLINGS",
    "SAMPLING_CONVENTIONS",
    "STEP_STATISTICS",
    "SUITE_BUDGET",
    "SUITE_PROMPT_LENGTH",
    "LengthPenalty",
    "SampledRollout",
    "StepBatch",
    "StepMove",
    "StepResult",
    "StepRunner",
    "accumulation_not_provided",
    "accumulation_setting",
    "clause_not_judged",
    "example_batch",
    "family_not_provided",
    "gradient_difference",
    "other_position_scheme",
    "runner_family",
    "sampled_rollout",
    "sampling_convention",
    "sampling_not_provided",
    "sampling_problems",
    "step_problems",
    "step_runner",
    "treated_as_truncated",
    "truncation_convention",
    "truncation_not_provided",
    "truncation_problems",
]

BUILTIN_STEP_RUNNERS: Mapping[str, str] = {
    "mine": "ppo_ref.adapters.step_mine:make_step",
    "trl": "ppo_ref.adapters.thirdparty.trl_step:make_step",  # TRL 1.12: PPOTrainer
    "trl116": "ppo_ref.adapters.thirdparty.trl_step:make_step",  # TRL 1.16: GRPOTrainer
    "verl": "ppo_ref.adapters.thirdparty.verl_step:make_step",  # verl 0.9.1: the FSDP engine's actor update
    "openrlhf": "ppo_ref.adapters.thirdparty.openrlhf_step:make_step",  # OpenRLHF 0.11.2: the PPO actor's fit
    "swift": "ppo_ref.adapters.thirdparty.swift_step:make_step",  # ms-swift 4.6.0: GRPOTrainer via SwiftRLHF
    "rlinf": "ppo_ref.adapters.thirdparty.rlinf_step:make_step",  # RLinf 0.3.0: FSDPActor.training_step
    "skyrl": "ppo_ref.adapters.thirdparty.skyrl_step:make_step",  # skyrl 0.4.0: RayPPOTrainer's policy step
}
"""Adapter name -> ``module:factory`` of its step runner (the factory returns None where the
installed version has none), for adapters that do not carry a ``step`` attribute themselves."""


POSITION_SCHEMES: Mapping[str, str] = {"gpt2": "absolute", "llama": "rotary", "qwen2": "rotary"}
"""STEP-7: the position scheme of each model family the step kit builds (``step_kit.FAMILIES``):
GPT-2 adds a learned embedding per absolute position, Llama and Qwen2 rotate queries and keys by
theirs (attention then sees only the difference, so a shift of every position cancels)."""

_SCHEME_FAMILY: Mapping[str, str] = {"absolute": "gpt2", "rotary": "qwen2"}


def runner_family(runner: object) -> str | None:
    """The ``model_type`` of the tiny model ``runner`` builds (its optional ``family`` attribute: a
    family name or a ``config.json`` mapping), or None where it does not say."""
    family = getattr(runner, "family", None)
    if family is None:
        return None
    if isinstance(family, Mapping):
        family = family.get("model_type")
    if not isinstance(family, str) or not family:
        raise ValueError(f"runner: family must be a family name or a config.json mapping, got {family!r}")
    return family


def other_position_scheme(family: str) -> tuple[str, str] | None:
    """STEP-7: ``(family, scheme)`` of the model STEP-3 runs on next, the position scheme ``family``
    lacks (``"gpt2"`` -> ``("qwen2", "rotary")``, ``"llama"`` -> ``("gpt2", "absolute")``), or None
    for a family whose scheme :data:`POSITION_SCHEMES` does not know."""
    scheme = POSITION_SCHEMES.get(family)
    if scheme is None:
        return None
    other = "rotary" if scheme == "absolute" else "absolute"
    return _SCHEME_FAMILY[other], other


def family_not_provided(runner: object, family: str) -> str | None:
    """The reason ``runner`` gives for its library not running a ``family`` model (its optional
    ``family_not_provided`` mapping, family -> reason naming the library's file and line; STEP-7
    then reports "not provided"), or None."""
    reasons = getattr(runner, "family_not_provided", None) or {}
    if not isinstance(reasons, Mapping):
        raise ValueError(
            f"runner: family_not_provided must be a Mapping of family -> reason, got {reasons!r}"
        )
    reason = reasons.get(family)
    if reason is not None and (not isinstance(reason, str) or not reason.strip()):
        raise ValueError(f"runner: family_not_provided[{family!r}] must be a non-empty str, got {reason!r}")
    return reason


def clause_not_judged(runner: object, clause: str) -> str | None:
    """Why the step tier leaves ``clause`` unjudged for ``runner``, known before anything runs: the
    skip message, ``"not provided: ..."`` where the runner declares that its library lacks what the
    clause checks (STEP-5, STEP-6, STEP-7, STEP-8) and ``"not run: ..."`` where the runner cannot
    reach it (STEP-7, STEP-8), or None. The suite's step tests and the clause's hand cases both skip
    with it, so a declaration never turns into a pass through a hand case. (STEP-5 still runs
    first, to check a declared absence of truncation handling against the library's outputs.)"""
    name = getattr(runner, "name", "the runner")
    if clause == "STEP-5":
        reason = truncation_not_provided(runner)
        return (
            None
            if reason is None
            else f"not provided: {name} has no truncation handling of its own: {reason}"
        )
    if clause == "STEP-6":
        reason = accumulation_not_provided(runner)
        if reason is not None:
            return f"not provided: {name} has no gradient-accumulation setting: {reason}"
        if accumulation_setting(runner) is None:
            return f"not provided: {name}'s runner declares no accumulation_setting (spec STEP-6)"
        return None
    if clause == "STEP-8":
        return _sampling_not_judged(runner, name)
    if clause != "STEP-7":
        return None
    own = runner_family(runner)
    if own is None:
        return "not run: the runner does not name its model's family (attribute family)"
    other = other_position_scheme(own)
    if other is None:
        return f"not run: the position scheme of the runner's {own} model is not known to the suite"
    family, scheme = other
    reason = family_not_provided(runner, family)
    if reason is not None:
        return f"not provided: {reason}"
    if getattr(runner, "with_family", None) is None:
        return (
            f"not run: the runner builds only its {own} model (no with_family), so left padding was "
            f"not checked on a model with {scheme} positions"
        )
    return None


def _sampling_not_judged(runner: object, name: str) -> str | None:
    reason = sampling_not_provided(runner)
    if reason is not None:
        return f"not provided: {name}'s rollout samples without top-k / top-p: {reason}"
    if sampling_convention(runner) is None:
        return f"not run: {name}'s runner declares no sampling_convention (spec STEP-8)"
    missing = [m for m in ("policy_logits", "sampling_run") if getattr(runner, m, None) is None]
    if missing:
        return (
            f"not run: {name}'s runner has no {' and no '.join(missing)}, so its library's rollout "
            "correction was not run on a top-k / top-p rollout"
        )
    return None


def step_problems(runner: object) -> list[str]:
    """What is wrong with ``runner`` as a :class:`StepRunner` (empty: nothing)."""
    problems: list[str] = []
    for attribute in ("name", "version", "provenance"):
        value = getattr(runner, attribute, None)
        if not isinstance(value, str) or not value:
            problems.append(f"{attribute}: expected a non-empty str, got {value!r}")
    modes = getattr(runner, "loss_modes", None)
    if not isinstance(modes, tuple) or not modes or not all(isinstance(m, str) for m in modes):
        problems.append(f"loss_modes: expected a non-empty tuple of str, got {modes!r}")
    local = getattr(runner, "micro_batch_local", None)
    if not isinstance(local, Mapping) or (isinstance(modes, tuple) and not set(local) <= set(modes)):
        problems.append(f"micro_batch_local: expected a Mapping from loss_modes to a source, got {local!r}")
    if not callable(getattr(runner, "run", None)):
        problems.append("run: expected a method")
    for method in ("truncation_run", "truncated_rows"):  # optional
        if getattr(runner, method, None) is not None and not callable(getattr(runner, method)):
            problems.append(f"{method}: expected a method or nothing")
    convention = getattr(runner, "truncation_convention", None)  # optional
    if convention is not None and not isinstance(convention, LengthPenalty):
        problems.append(f"truncation_convention: expected a LengthPenalty or None, got {convention!r}")
    problems += _reason_problems(
        runner,
        "truncation_not_provided",
        convention is not None or getattr(runner, "truncation_run", None) is not None,
        "truncation_convention or truncation_run, which say the library handles truncation",
    )
    problems += _accumulation_problems(runner)
    problems += _family_problems(runner)
    problems += _sampling_problems(runner)
    return problems


def _reason_problems(runner: object, attribute: str, contradicted: bool, by: str) -> list[str]:
    """The problems of ``runner``'s optional reason ``attribute`` (a ``*_not_provided``): not a
    non-empty str, or declared where ``contradicted`` (by the declarations ``by`` names)."""
    reason = getattr(runner, attribute, None)
    if reason is None:
        return []
    if not isinstance(reason, str) or not reason.strip():
        return [f"{attribute}: expected a non-empty str (the reason) or None, got {reason!r}"]
    return [f"{attribute}: declared together with {by}"] if contradicted else []


def _optional_method(runner: object, method: str, needed: object, needs: str) -> list[str]:
    """The problems of ``runner``'s optional method ``method``: not callable, or present without
    ``needed`` (None), the declaration ``needs`` names."""
    found = getattr(runner, method, None)
    if found is None:
        return []
    if not callable(found):
        return [f"{method}: expected a method or nothing"]
    return [f"{method}: needs {needs}"] if needed is None else []


def _family_problems(runner: object) -> list[str]:
    problems: list[str] = []
    try:
        family = runner_family(runner)  # optional
    except ValueError as error:
        problems.append(str(error).removeprefix("runner: "))
        family = None
    problems += _optional_method(runner, "with_family", family, "family, the family of the runner's model")
    reasons = getattr(runner, "family_not_provided", None)  # optional
    if reasons is not None:
        if not isinstance(reasons, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in reasons.items()
        ):
            problems.append(
                f"family_not_provided: expected a Mapping of family -> reason (str), got {reasons!r}"
            )
        elif family in reasons:
            problems.append(f"family_not_provided: names the runner's own family {family!r}")
    return problems


def _accumulation_problems(runner: object) -> list[str]:
    problems: list[str] = []
    setting = getattr(runner, "accumulation_setting", None)  # optional
    if setting is not None and (not isinstance(setting, str) or not setting.strip()):
        problems.append(f"accumulation_setting: expected a non-empty str or None, got {setting!r}")
    run = getattr(runner, "accumulation_run", None)  # optional
    problems += _optional_method(
        runner, "accumulation_run", setting, "accumulation_setting, the library setting it drives"
    )
    problems += _reason_problems(
        runner,
        "accumulation_not_provided",
        setting is not None or run is not None,
        "accumulation_setting or accumulation_run, which say the library has an accumulation setting",
    )
    return problems


def _sampling_problems(runner: object) -> list[str]:
    problems: list[str] = []
    convention = getattr(runner, "sampling_convention", None)  # optional
    if convention is not None and convention not in SAMPLING_CONVENTIONS:
        problems.append(
            f"sampling_convention: expected one of {', '.join(SAMPLING_CONVENTIONS)} or None, "
            f"got {convention!r}"
        )
    for method in ("sampling_run", "policy_logits"):
        problems += _optional_method(
            runner, method, convention, "sampling_convention, the support the library's correction uses"
        )
    problems += _reason_problems(
        runner,
        "sampling_not_provided",
        convention is not None,
        "sampling_convention, which says the library samples with top-k / top-p",
    )
    return problems


def _declared_text(runner: object, attribute: str) -> str | None:
    """``runner``'s optional text declaration ``attribute`` (a setting or a reason), or None;
    ValueError naming it where it is not a non-empty str."""
    text = getattr(runner, attribute, None)
    if text is not None and (not isinstance(text, str) or not text.strip()):
        raise ValueError(f"runner: {attribute} must be a non-empty str or None, got {text!r}")
    return text


def accumulation_setting(runner: object) -> str | None:
    """The gradient-accumulation setting ``runner`` drives for STEP-6 (its ``accumulation_setting``
    attribute), or None (STEP-6 not provided)."""
    return _declared_text(runner, "accumulation_setting")


def accumulation_not_provided(runner: object) -> str | None:
    """The reason ``runner`` gives for its library having no gradient-accumulation setting (its
    ``accumulation_not_provided`` attribute; STEP-6 then reports "not provided"), or None."""
    return _declared_text(runner, "accumulation_not_provided")


def truncation_convention(runner: object) -> LengthPenalty | None:
    """The STEP-5 convention ``runner`` declares (its ``truncation_convention`` attribute), or None."""
    convention = getattr(runner, "truncation_convention", None)
    if convention is not None and not isinstance(convention, LengthPenalty):
        raise ValueError(f"runner: truncation_convention must be a LengthPenalty or None, got {convention!r}")
    return convention


def truncation_not_provided(runner: object) -> str | None:
    """The reason ``runner`` gives for its library having no truncation handling of its own (its
    ``truncation_not_provided`` attribute; STEP-5 then reports "not provided"), or None."""
    return _declared_text(runner, "truncation_not_provided")


def sampling_convention(runner: object) -> str | None:
    """The STEP-8 convention ``runner`` declares (its ``sampling_convention`` attribute, one of
    :data:`SAMPLING_CONVENTIONS`), or None."""
    convention = getattr(runner, "sampling_convention", None)
    if convention is not None and convention not in SAMPLING_CONVENTIONS:
        raise ValueError(
            f"runner: sampling_convention must be one of {', '.join(SAMPLING_CONVENTIONS)} or None, "
            f"got {convention!r}"
        )
    return convention


def sampling_not_provided(runner: object) -> str | None:
    """The reason ``runner`` gives for its library's rollout having no top-k / top-p (its
    ``sampling_not_provided`` attribute; STEP-8 then reports "not provided"), or None."""
    return _declared_text(runner, "sampling_not_provided")


def step_runner(adapter: object) -> StepRunner | None:
    """The step runner of ``adapter``: its ``step`` attribute, else the built-in runner of its
    ``name`` (:data:`BUILTIN_STEP_RUNNERS`), else None (the adapter offers no step tier)."""
    import importlib

    runner = getattr(adapter, "step", None)
    if runner is not None:
        if not isinstance(runner, StepRunner):
            raise ValueError(f"adapter: its step attribute is not a StepRunner: {step_problems(runner)}")
        return runner
    target = BUILTIN_STEP_RUNNERS.get(str(getattr(adapter, "name", "")))
    if target is None:
        return None
    module, _, factory = target.partition(":")
    made: object = getattr(importlib.import_module(module), factory)()
    if made is not None and not isinstance(made, StepRunner):
        raise ValueError(f"adapter: the built-in step runner {target} is not a StepRunner")
    return made


def gradient_difference(first: StepResult, second: StepResult) -> tuple[float, float]:
    """``(max abs difference, max abs entry)`` of two results' gradients over every parameter.

    Example: gradients ``{"w": [1.0, -2.0]}`` and ``{"w": [1.0, -2.5]}`` give ``(0.5, 2.0)``.
    """
    if set(first.gradient) != set(second.gradient):
        raise ValueError("second: the results' gradients name different parameters")
    if not first.gradient:
        raise ValueError("first: the result has no gradient")
    diff = max(float((first.gradient[k] - second.gradient[k]).abs().max()) for k in first.gradient)
    scale = max(float(g.abs().max()) for g in first.gradient.values())
    return diff, scale


@dataclass(frozen=True)
class StepMove:
    """How far a variant's step moved from the base step (STEP-2/3/4/6, the suite's and ``ppo-ref
    step-check``'s one measure): the gradient's largest difference, the base's largest entry, their
    ratio, and the loss difference.

    Example: gradients ``{"w": [1.0, -2.0]}`` and ``{"w": [1.0, -2.5]}``, losses 0.5 and 0.5: diff
    0.5, scale 2.0, relative 0.25, beyond the tolerance.
    """

    diff: float
    scale: float
    relative: float
    loss_diff: float
    base_loss: float

    @staticmethod
    def between(base: StepResult, other: StepResult) -> StepMove:
        """The move from ``base`` to ``other`` (ValueError as :func:`gradient_difference`)."""
        diff, scale = gradient_difference(base, other)
        return StepMove(diff, scale, diff / max(scale, 1e-30), abs(base.loss - other.loss), base.loss)

    @property
    def beyond_tolerance(self) -> bool:
        """The gradient beyond :data:`RELATIVE_TOLERANCE` of its largest entry, or the loss beyond
        the same fraction of ``max(|loss|, 1)``."""
        return self.relative > RELATIVE_TOLERANCE or self.loss_diff > RELATIVE_TOLERANCE * max(
            abs(self.base_loss), 1.0
        )

    @property
    def measure(self) -> str:
        """The move in one line, as the suite records it."""
        return (
            f"|dgrad| {self.diff:.3g} of {self.scale:.3g} ({self.relative:.2e}), |dloss| {self.loss_diff:.3g}"
        )


def treated_as_truncated(
    batch: StepBatch, outputs: Mapping[str, Tensor], convention: LengthPenalty | None = None
) -> tuple[bool, ...] | None:
    """(B,) the rows the library treated as truncated, derived from its own ``outputs``
    (:data:`OUTPUTS`: masked entirely, rewarded other than their score, or bootstrapped); None
    when ``outputs`` hold none of them. With a declared ``convention`` a row's expected reward is
    its score plus the convention's length penalty (:meth:`LengthPenalty.rewards`), not its score.

    Example: scores (1, 0) and the library's rewards (1, -1): row 1 was penalised, ``(False, True)``.
    """
    rows = batch.size
    found = [False] * rows
    measured = False

    def values(name: str, dims: int) -> Tensor:
        value = torch.as_tensor(outputs[name]).double()
        if value.dim() != dims or value.shape[0] != rows:
            raise ValueError(
                f"outputs: {name} must have {dims} dimension(s) and {rows} rows, got {tuple(value.shape)}"
            )
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"outputs: {name} must be finite")
        return value

    if "loss_mask" in outputs:
        mask = values("loss_mask", 2)
        found = [f or bool(m == 0) for f, m in zip(found, (mask != 0).sum(dim=1).tolist(), strict=True)]
        measured = True
    if "rewards" in outputs:
        rewards = values("rewards", 1).tolist()
        expected = batch.scores if convention is None else convention.rewards(batch)
        for i, (got, score) in enumerate(zip(rewards, expected, strict=True)):
            found[i] = found[i] or abs(got - score) > 1e-6 * max(1.0, abs(score))
        measured = True
    if "advantages_bootstrapped" in outputs:
        if "advantages" not in outputs:
            raise ValueError("outputs: advantages_bootstrapped needs the advantages it is compared with")
        plain, booted = values("advantages", 2), values("advantages_bootstrapped", 2)
        if plain.shape != booted.shape:
            raise ValueError("outputs: advantages and advantages_bootstrapped differ in shape")
        moved = ((plain - booted).abs().amax(dim=1) > 0).tolist()
        found = [f or bool(m) for f, m in zip(found, moved, strict=True)]
        measured = True
    return tuple(found) if measured else None


def truncation_problems(
    batch: StepBatch,
    result: StepResult,
    claimed: tuple[bool, ...] | None = None,
    convention: LengthPenalty | None = None,
) -> list[str]:
    """STEP-5's verdict: what is wrong with the rows the library treated as truncated (measured from
    ``result.outputs``), which must be exactly the rows without EOS; and with a runner's ``claimed``
    rows, which must equal the measurement. Empty: nothing. Raises ValueError when ``result`` has
    no output to measure from.

    With a declared ``convention`` (a length-only reward penalty, :class:`LengthPenalty`) the
    rewards are measured against score plus that penalty for every row, EOS-ended or cut: a row so
    rewarded is not treated as truncated (the penalty already reaches the rows cut at the budget,
    whose length is the budget), and the rows measured as treated must be rows without EOS (a cut
    row may be penalised further; an EOS-ended row rewarded other than the formula fails)."""
    if convention is not None and not isinstance(convention, LengthPenalty):
        raise ValueError(f"convention: expected a LengthPenalty or None, got {convention!r}")
    measured = treated_as_truncated(batch, result.outputs, convention)
    if measured is None:
        raise ValueError(
            f"result: its outputs hold none of {tuple(OUTPUTS)}; nothing to measure truncation from"
        )
    problems = []
    expected = batch.truncated
    if convention is not None:  # under the convention a cut row may, but need not, be treated further
        expected = tuple(m and t for m, t in zip(measured, batch.truncated, strict=True))
    if measured != expected:
        wrong = [i for i, (m, t) in enumerate(zip(measured, expected, strict=True)) if m != t]
        ended = [i for i in wrong if not batch.truncated[i]]
        problems.append(
            f"rows treated as truncated {measured}, expected {expected}"
            + (f" (rows {ended} end with EOS)" if ended else "")
            + f", measured from the library's {', '.join(sorted(set(result.outputs) & set(OUTPUTS)))}"
            + (
                ""
                if convention is None
                else f" against score + the declared length penalty ({convention.source}; L_cache "
                f"{convention.buffer}, L_max the budget {batch.budget})"
            )
        )
    if claimed is not None and tuple(claimed) != measured:
        problems.append(
            f"the runner reports rows {tuple(claimed)} as truncated, but the library treated {measured}"
        )
    return problems


def example_batch(budget: int = 6, vocab_size: int = 16, prompt_length: int = 9) -> StepBatch:
    """The suite's batch: 2 prompts (``prompt_length`` tokens) x 4 completions of unequal lengths
    1..budget, one row ending with EOS exactly at the budget (the longest, filling the padded
    width), two rows cut at the budget, scores spread within each group. Deterministic; ids 3..
    are ordinary tokens. A ``prompt_length`` that is a multiple of a padded width leaves the
    prompts unpadded under a pad-to-multiple rule (so completion padding is tested alone)."""
    if not isinstance(budget, int) or budget < 4:
        raise ValueError(f"budget: expected an int >= 4, got {budget!r}")
    if not isinstance(prompt_length, int) or prompt_length < 1:
        raise ValueError(f"prompt_length: expected an int >= 1, got {prompt_length!r}")
    if not isinstance(vocab_size, int) or vocab_size < 8:
        raise ValueError(f"vocab_size: expected an int >= 8, got {vocab_size!r}")
    generator = torch.Generator().manual_seed(7)

    def tokens(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in torch.randint(3, vocab_size, (n,), generator=generator))

    eos = 1
    completions = (
        (*tokens(budget - 1), eos),  # EOS exactly at the budget: terminal
        (*tokens(1), eos),
        tokens(budget),  # cut at the budget: truncated
        (*tokens(3), eos),
        (eos,),
        (*tokens(budget - 3), eos),
        (*tokens(budget - 2), eos),
        tokens(budget),  # truncated
    )
    return StepBatch(
        prompt_ids=(tokens(prompt_length), tokens(prompt_length)),
        completions=completions,
        scores=(1.0, 0.0, 0.5, -1.0, 0.25, 1.5, -0.5, 0.0),
        group_size=4,
        budget=budget,
        eos_id=eos,
        pad_id=0,
        vocab_size=vocab_size,
    )
