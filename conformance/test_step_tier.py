"""The trainer-step tier (spec STEP-1..8): one optimisation step of the library's own training code.

Runs only for an adapter with a step runner (:func:`ppo_ref.adapters.step.step_runner`: its
``step`` attribute or the built-in runner of its name); otherwise every test here is skipped as
"not provided". Every comparison is between two runs of the same runner on the batch of
:func:`ppo_ref.adapters.step.example_batch` (2 prompts x 4 completions of unequal lengths, one
EOS-ended completion filling the budget, two cut at it), for every loss mode the runner lists;
STEP-5 measures which rows the library treated as truncated from the library's own per-row
outputs in the result (:data:`ppo_ref.adapters.step.OUTPUTS`), not from the runner's word; a
runner's declared ``truncation_convention`` (a length-only reward penalty as a paper writes it) is
applied to every row's expected reward and shown with the verdict; a runner declaring
``truncation_not_provided`` (its library has no truncation handling of its own, with the reason) gets
STEP-5 "not provided" with that reason, once its outputs are seen to treat no row as truncated.
The measured differences are attached to each test as ``user_properties`` (``step_measure``) so
that a report, or ``-rA`` with ``--junitxml``, shows them; a mode the runner declares
``micro_batch_local`` has its STEP-2 dependence measured and shown, not failed. STEP-6 runs the
library's gradient-accumulation setting the runner declares (``accumulation_setting``: its
``accumulation_run``, or its micro-batches where they are that setting's accumulation steps) against
the whole batch in one step; a runner declaring ``accumulation_not_provided`` gets "not provided".
STEP-7 runs STEP-3's left padding again on a model of the position scheme the runner's own model
lacks (``with_family``): GPT-2's absolute positions for a rotary model, where a forward without
position ids shows, and a rotary one for GPT-2. STEP-8 draws a rollout from the runner's own model
(``policy_logits``) under top-p and under top-k, feeds the sampler's renormalised log-probs to the
library's rollout correction (``sampling_run``) and checks the step-0 ratio (1) and the weights
against the convention the runner declares (``sampling_convention``: 1 on the replayed support, or
the kept mass S against the full softmax, measured and shown).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ppo_ref.adapters.step import (
    ACCUMULATION_STEPS,
    RATIO_TOLERANCE,
    RELATIVE_TOLERANCE,
    SAMPLINGS,
    SUITE_BUDGET,
    SUITE_PROMPT_LENGTH,
    StepBatch,
    StepMove,
    StepResult,
    StepRunner,
    accumulation_setting,
    clause_not_judged,
    example_batch,
    other_position_scheme,
    runner_family,
    sampled_rollout,
    sampling_convention,
    sampling_problems,
    step_problems,
    step_runner,
    treated_as_truncated,
    truncation_convention,
    truncation_not_provided,
    truncation_problems,
)

from .support import Context

BUDGET = SUITE_BUDGET
# pad_to = 9 pads the completions only; pad_to = 10 also left-pads the prompts by 1
PROMPT_LENGTH = SUITE_PROMPT_LENGTH
MICRO_BATCHES = (2, 4)

pytestmark = pytest.mark.slow  # about 40 training steps of a tiny model (TRL: about 1 s each)

_RESULTS: dict[tuple[int, str, int, int | None, int | None], StepResult] = {}
# STEP-7's runners on another family, held for the session: _RESULTS is keyed by the runner's id,
# which a freed runner would hand on to the next one made.
_FAMILY_RUNNERS: dict[tuple[int, str], StepRunner] = {}


@pytest.fixture(scope="module")
def runner(ctx: Context) -> StepRunner:
    try:
        found = step_runner(ctx.adapter)
    except ModuleNotFoundError as error:  # a built-in runner whose library or extra is not installed
        pytest.skip(f"not provided: adapter {ctx.impl!r}'s trainer-step runner cannot run here: {error}")
    if found is None:
        pytest.skip(f"not provided: adapter {ctx.impl!r} has no trainer-step runner (spec STEP-1..8)")
    return found


@pytest.fixture(scope="module")
def batch() -> StepBatch:
    return example_batch(budget=BUDGET, prompt_length=PROMPT_LENGTH)


def _run(
    runner: StepRunner,
    batch: StepBatch,
    mode: str,
    micro_batches: int = 1,
    pad_to: int | None = None,
    pad_fill: int | None = None,
) -> StepResult:
    key = (id(runner), mode, micro_batches, pad_to, pad_fill)
    if key not in _RESULTS:
        _RESULTS[key] = runner.run(
            batch, loss_mode=mode, micro_batches=micro_batches, pad_to=pad_to, pad_fill=pad_fill
        )
    return _RESULTS[key]


def _compare(
    runner: StepRunner,
    batch: StepBatch,
    record: Callable[[str, object], None],
    label: str,
    **variant: int,
) -> list[str]:
    """Each mode's whole-batch run against ``variant``: the failures (relative gradient or loss
    difference above the tolerance), every measure recorded."""
    failures = []
    for mode in runner.loss_modes:
        base = _run(runner, batch, mode)
        other = _run(runner, batch, mode, **variant)
        moved = StepMove.between(base, other)
        record("step_measure", f"{runner.name} {mode} {label}: {moved.measure}")
        if moved.beyond_tolerance:
            failures.append(
                f"{mode}: {label} moved the gradient by {moved.diff:.3g} (its largest entry "
                f"{moved.scale:.3g}, relative {moved.relative:.2e} > {RELATIVE_TOLERANCE:g}) and the loss "
                f"by {moved.loss_diff:.3g}"
            )
    return failures


def _skip_unless_judged(runner: StepRunner, clause: str) -> None:
    """The contract, checked for ``clause`` too; then the skip (not provided / not run) where the
    runner declares the clause's setting absent or cannot reach it (``clause_not_judged``)."""
    assert step_problems(runner) == []
    reason = clause_not_judged(runner, clause)
    if reason is not None:
        pytest.skip(reason)


# Not STEP-5: a clause is "pass" once one of its tests passed, so this test would turn a STEP-5 that
# the library does not provide (truncation_not_provided, or no per-row outputs) into a pass; the STEP-5
# test checks the contract itself.
@pytest.mark.clause("STEP-1", "STEP-2", "STEP-3", "STEP-4")
def test_step_runner_contract(runner: StepRunner) -> None:
    assert step_problems(runner) == []


@pytest.mark.clause("STEP-1")
def test_step1_ratio_is_one_before_any_update(
    runner: StepRunner, batch: StepBatch, record_property: Callable[[str, object], None]
) -> None:
    problems = []
    for mode in runner.loss_modes:
        for micro in (1, *MICRO_BATCHES):
            stats = _run(runner, batch, mode, micro).stats
            ratio, clipfrac, kl = (stats.get(k) for k in ("max_abs_log_ratio", "clipfrac", "approx_kl"))
            record_property("step_measure", f"{runner.name} {mode} x{micro}: {stats}")
            if ratio is None:
                problems.append(f"{mode}: the runner reports no max_abs_log_ratio")
            elif not ratio <= RATIO_TOLERANCE:
                problems.append(f"{mode} x{micro}: max |logp - old_logp| = {ratio:.3g} before any update")
            if clipfrac is not None and clipfrac == clipfrac and clipfrac != 0.0:  # NaN: not logged
                problems.append(f"{mode} x{micro}: clip fraction {clipfrac} before any update")
            if kl is not None and kl == kl and abs(kl) > RATIO_TOLERANCE:
                problems.append(f"{mode} x{micro}: approx KL {kl} before any update")
    assert not problems, "\n".join(problems)


@pytest.mark.clause("STEP-2")
@pytest.mark.parametrize("micro_batches", MICRO_BATCHES)
def test_step2_micro_batches_give_the_whole_batch_gradient(
    runner: StepRunner, batch: StepBatch, micro_batches: int, record_property: Callable[[str, object], None]
) -> None:
    failures = _compare(
        runner, batch, record_property, f"{micro_batches} micro-batches", micro_batches=micro_batches
    )
    declared = [f for f in failures if f.split(":")[0] in runner.micro_batch_local]
    for failure in declared:  # a documented micro-batch-local mode: measured and shown
        mode = failure.split(":")[0]
        record_property("step_declared", f"{failure} [declared: {runner.micro_batch_local[mode]}]")
        record_property("step_convention", ("micro_batch_local", mode, runner.micro_batch_local[mode]))
    failures = [f for f in failures if f not in declared]
    assert not failures, "\n".join(failures)


@pytest.mark.clause("STEP-3")
def test_step3_extra_completion_padding(
    runner: StepRunner, batch: StepBatch, record_property: Callable[[str, object], None]
) -> None:
    failures = _compare(
        runner, batch, record_property, f"completions padded to {PROMPT_LENGTH}", pad_to=PROMPT_LENGTH
    )
    assert not failures, "\n".join(failures)


@pytest.mark.clause("STEP-3")
def test_step3_extra_prompt_padding(
    runner: StepRunner, batch: StepBatch, record_property: Callable[[str, object], None]
) -> None:
    label = f"prompts left-padded by 1 and completions padded to {PROMPT_LENGTH + 1}"
    failures = _compare(runner, batch, record_property, label, pad_to=PROMPT_LENGTH + 1)
    assert not failures, "\n".join(failures)


@pytest.mark.clause("STEP-7")
def test_step7_prompt_padding_on_the_other_position_scheme(
    runner: StepRunner, batch: StepBatch, record_property: Callable[[str, object], None]
) -> None:
    _skip_unless_judged(runner, "STEP-7")
    own = runner_family(runner)
    other = other_position_scheme(own) if own is not None else None
    assert other is not None  # else clause_not_judged gave a reason
    family, scheme = other
    label = (
        f"{family} ({scheme} positions): prompts left-padded by 1, completions padded to {PROMPT_LENGTH + 1}"
    )
    key = (id(runner), family)
    if key not in _FAMILY_RUNNERS:
        _FAMILY_RUNNERS[key] = runner.with_family(family)  # type: ignore[attr-defined]
    failures = _compare(_FAMILY_RUNNERS[key], batch, record_property, label, pad_to=PROMPT_LENGTH + 1)
    assert not failures, "\n".join(failures)


@pytest.mark.clause("STEP-4")
def test_step4_padding_token_ids_carry_no_gradient(
    runner: StepRunner, batch: StepBatch, record_property: Callable[[str, object], None]
) -> None:
    fill = batch.vocab_size - 1  # an ordinary token id in every padding slot instead of the pad id
    failures = _compare(runner, batch, record_property, f"token {fill} in the padding slots", pad_fill=fill)
    assert not failures, "\n".join(failures)


@pytest.mark.clause("STEP-5")
def test_step5_only_rows_cut_at_the_budget_are_truncated(
    runner: StepRunner, batch: StepBatch, record_property: Callable[[str, object], None]
) -> None:
    assert batch.truncated == (False, False, True, False, False, False, False, True)
    assert max(len(c) for c in batch.completions) == len(batch.completions[0]) == batch.budget  # EOS-ended
    assert step_problems(runner) == []  # the contract, for this clause too (see test_step_runner_contract)
    probe = getattr(runner, "truncation_run", None)
    result = probe(batch) if probe is not None else _run(runner, batch, runner.loss_modes[0])
    convention = truncation_convention(runner)  # a declared length-only reward penalty, or None
    measured = treated_as_truncated(batch, result.outputs, convention)
    if measured is None:
        pytest.skip(f"not provided: {runner.name}'s results carry none of the library's per-row outputs")
    claim = getattr(runner, "truncated_rows", None)  # a runner's own claim: cross-checked only
    record_property(
        "step_measure", f"{runner.name}: rows treated as truncated {measured} (from {sorted(result.outputs)})"
    )
    reason = truncation_not_provided(runner)  # the library has no truncation handling of its own
    if reason is not None:
        wrongly = [i for i, row in enumerate(measured) if row]
        assert not wrongly, (
            f"{runner.name} declares no truncation handling ({reason}), yet its outputs treat rows "
            f"{wrongly} as truncated"
        )
        pytest.skip(clause_not_judged(runner, "STEP-5") or reason)
    if convention is not None:
        plain = treated_as_truncated(batch, result.outputs)
        record_property(
            "step_declared",
            f"{runner.name}: rewards measured against score + {convention.source} (L_cache "
            f"{convention.buffer}, L_max {batch.budget}); against the score alone: rows {plain}",
        )
        value = f"LengthPenalty(buffer={convention.buffer}, factor={convention.factor:g})"
        record_property("step_convention", ("truncation_convention", value, convention.source))
    problems = truncation_problems(batch, result, None if claim is None else tuple(claim(batch)), convention)
    assert not problems, "\n".join(problems)


@pytest.mark.clause("STEP-6")
@pytest.mark.parametrize("accumulation_steps", ACCUMULATION_STEPS)
def test_step6_accumulation_steps_give_the_whole_batch_step(
    runner: StepRunner,
    batch: StepBatch,
    accumulation_steps: int,
    record_property: Callable[[str, object], None],
) -> None:
    _skip_unless_judged(runner, "STEP-6")
    setting = accumulation_setting(runner)
    assert setting is not None  # else clause_not_judged gave a reason
    record_property("step_declared", f"{runner.name}: accumulation through {setting}")
    accumulate = getattr(runner, "accumulation_run", None)
    k = accumulation_steps
    failures = []
    for mode in runner.loss_modes:
        base = _run(runner, batch, mode)
        if accumulate is None:  # the runner's micro-batches are the setting's accumulation steps
            other = _run(runner, batch, mode, k)
        else:
            other = accumulate(batch, loss_mode=mode, accumulation_steps=k)
        steps = other.stats.get("optimizer_steps")
        moved = StepMove.between(base, other)
        record_property(
            "step_measure",
            f"{runner.name} {mode} {k} accumulation steps: {moved.measure}, optimizer steps {steps}",
        )
        problems = []
        if steps is not None and steps != 1:
            problems.append(f"the library took {steps:g} optimizer steps, expected 1")
        if moved.beyond_tolerance:
            problems.append(
                f"the gradient moved by {moved.diff:.3g} (its largest entry {moved.scale:.3g}, relative "
                f"{moved.relative:.2e} > {RELATIVE_TOLERANCE:g}; ratio of norms "
                f"{_norm(other) / max(_norm(base), 1e-30):.4g}) and the loss by {moved.loss_diff:.3g}"
            )
        if not problems:
            continue
        text = f"{mode}: {k} accumulation steps against the whole batch: {'; '.join(problems)}"
        if mode in runner.micro_batch_local and steps in (None, 1):  # documented local normalisation
            record_property("step_declared", f"{text} [declared: {runner.micro_batch_local[mode]}]")
            record_property("step_convention", ("micro_batch_local", mode, runner.micro_batch_local[mode]))
        else:
            failures.append(text)
    assert not failures, "\n".join(failures)


def _norm(result: StepResult) -> float:
    return float(sum(float((g**2).sum()) for g in result.gradient.values()) ** 0.5)


@pytest.mark.clause("STEP-8")
@pytest.mark.parametrize("top_k, top_p", SAMPLINGS)
def test_step8_correction_on_a_truncated_rollout(
    runner: StepRunner,
    batch: StepBatch,
    top_k: int,
    top_p: float,
    record_property: Callable[[str, object], None],
) -> None:
    _skip_unless_judged(runner, "STEP-8")
    convention = sampling_convention(runner)
    assert convention is not None  # else clause_not_judged gave a reason
    sampled = sampled_rollout(runner.policy_logits, batch, top_k, top_p)  # type: ignore[attr-defined]
    result = runner.sampling_run(sampled)  # type: ignore[attr-defined]
    problems, measure = sampling_problems(sampled, result, convention)
    record_property("step_measure", f"{runner.name}: {measure}")
    if convention == "full" and not problems:  # the kept mass as the weight: a declared convention
        record_property(
            "step_declared",
            f"{runner.name}: the correction weights are the kept mass S (declared 'full': the old "
            "log-probs over the whole vocabulary against the sampler's renormalised ones, TRL #6789); "
            + measure,
        )
        source = (
            "the correction compares the library's full-vocabulary old log-probs with the sampler's "
            f"renormalised ones, so each weight is the kept mass S (TRL #6789); measured: {measure}"
        )
        record_property("step_convention", ("sampling_convention", "full", source))
    assert not problems, "\n".join(problems)
