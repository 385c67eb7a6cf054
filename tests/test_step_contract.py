"""The trainer-step tier's contract (ppo_ref.adapters.step) and ppo-ref's own step runner (spec STEP-1..8).

The runner's checks are the suite's (conformance/test_step_tier.py); here: the batch's validation,
the helpers, the runner lookup, and that each STEP comparison catches the bug it is for, by breaking
ppo-ref's trainer on purpose (a micro-batch-local normaliser, forwards without position ids, truncation
inferred from the padded length) and watching the comparison move far above the tolerance.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest
import torch

import ppo_ref.trainer.data as data_module
import ppo_ref.trainer.generation as generation_module
import ppo_ref.trainer.update as update_module
from ppo_ref.adapters.step import (
    BUILTIN_STEP_RUNNERS,
    LengthPenalty,
    StepBatch,
    StepResult,
    StepRunner,
    accumulation_not_provided,
    accumulation_setting,
    example_batch,
    gradient_difference,
    step_problems,
    step_runner,
    treated_as_truncated,
    truncation_convention,
    truncation_not_provided,
    truncation_problems,
)
from ppo_ref.adapters.step_kit import padded
from ppo_ref.adapters.step_mine import MineStep
from ppo_ref.trainer.estimators import WholeMinibatch

BATCH = example_batch()


def _relative(first: StepResult, second: StepResult) -> float:
    diff, scale = gradient_difference(first, second)
    return diff / scale


def _kwargs(**changes: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "prompt_ids": ((3, 4), (5, 6)),
        "completions": ((3, 1), (4, 4, 4), (1,), (5, 1)),
        "scores": (1.0, 0.0, 0.5, 0.25),
        "group_size": 2,
        "budget": 3,
    }
    values.update(changes)
    return values


@pytest.mark.parametrize(
    ("changes", "argument"),
    [
        ({"eos_id": 0}, "eos_id"),
        ({"vocab_size": 2}, "vocab_size"),
        ({"group_size": 1}, "group_size"),
        ({"budget": 0}, "budget"),
        ({"prompt_ids": ((3, 4), (5,))}, "prompt_ids"),
        ({"completions": ((3, 1), (4, 4, 4), (1,))}, "completions"),
        ({"completions": ((1, 3), (4, 4, 4), (1,), (5, 1))}, "completions"),  # EOS before the end
        ({"completions": ((3,), (4, 4, 4), (1,), (5, 1))}, "completions"),  # no EOS, budget not filled
        ({"completions": ((3, 99), (4, 4, 4), (1,), (5, 1))}, "completions"),
        ({"scores": (1.0, 0.0, 0.5)}, "scores"),
        ({"scores": (1.0, 0.0, 0.5, float("nan"))}, "scores"),
    ],
)
def test_step_batch_rejects_bad_input_naming_the_argument(changes: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        StepBatch(**_kwargs(**changes))


def test_step_batch_truncated_rows_are_the_rows_without_eos() -> None:
    batch = StepBatch(**_kwargs())
    assert batch.truncated == (False, True, False, False)
    assert batch.size == 4
    replaced = batch.with_completion(1, (4, 1))
    assert replaced.truncated == (False, False, False, False) and replaced.scores == batch.scores


def test_example_batch_has_an_eos_row_filling_the_budget_and_two_cut_rows() -> None:
    assert BATCH.truncated.count(True) == 2
    longest = max(len(c) for c in BATCH.completions)
    assert longest == BATCH.budget
    assert any(len(c) == longest and c[-1] == BATCH.eos_id for c in BATCH.completions)
    assert len({len(c) for c in BATCH.completions}) >= 4  # unequal lengths
    with pytest.raises(ValueError, match="budget"):
        example_batch(budget=3)
    with pytest.raises(ValueError, match="prompt_length"):
        example_batch(prompt_length=0)


def test_gradient_difference() -> None:
    first = StepResult({"w": torch.tensor([1.0, -2.0])}, 0.0)
    second = StepResult({"w": torch.tensor([1.0, -2.5])}, 0.0)
    assert gradient_difference(first, second) == (0.5, 2.0)
    with pytest.raises(ValueError, match="second"):
        gradient_difference(first, StepResult({"v": torch.zeros(2)}, 0.0))


def test_runner_lookup_and_contract() -> None:
    runner = MineStep()
    assert isinstance(runner, StepRunner) and step_problems(runner) == []
    assert step_problems(object())  # names, modes, methods missing

    class WithStep:
        name = "other"
        step = runner

    class Named:
        name = "mine"

    class Unknown:
        name = "no-such-library"

    class BadStep:
        name = "mine"
        step = object()

    names = {"mine", "trl", "trl116", "verl", "openrlhf", "swift", "rlinf", "skyrl"}  # the adapters' names
    assert set(BUILTIN_STEP_RUNNERS) == names
    assert step_runner(WithStep()) is runner
    assert isinstance(step_runner(Named()), MineStep)
    assert step_runner(Unknown()) is None
    with pytest.raises(ValueError, match="adapter"):
        step_runner(BadStep())


def test_mine_rejects_bad_run_arguments() -> None:
    runner = MineStep()
    with pytest.raises(ValueError, match="loss_mode"):
        runner.run(BATCH, loss_mode="bnpo")
    with pytest.raises(ValueError, match="micro_batches"):
        runner.run(BATCH, loss_mode="token-mean", micro_batches=3)
    with pytest.raises(ValueError, match="pad_fill"):
        runner.run(BATCH, loss_mode="token-mean", pad_fill=BATCH.eos_id)


def test_mine_step_zero_and_partition_in_float64() -> None:
    runner = MineStep()
    whole = runner.run(BATCH, loss_mode="token-mean")
    split = runner.run(BATCH, loss_mode="token-mean", micro_batches=4)
    assert whole.stats["max_abs_log_ratio"] == 0.0 and whole.stats["clipfrac"] == 0.0
    assert _relative(whole, split) < 1e-12
    assert max(float(g.abs().max()) for g in whole.gradient.values()) > 1e-3  # a real gradient


def test_step2_catches_a_micro_batch_local_normaliser(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each micro-batch normalised by its own token count (a mean of micro-batch means)."""
    runner = MineStep()
    whole = runner.run(BATCH, loss_mode="token-mean")
    original = update_module.trainer_policy_loss

    def local(config: Any) -> Any:
        loss = original(config)
        return lambda logp, old, adv, mask, cfg, _whole: loss(
            logp, old, adv, mask, cfg, WholeMinibatch.of(mask)
        )

    monkeypatch.setattr(update_module, "trainer_policy_loss", local)
    assert _relative(whole, runner.run(BATCH, loss_mode="token-mean", micro_batches=4)) > 1e-2


def test_step3_catches_forwards_without_position_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """Position ids counted from the first column (no cumsum of the mask), as a forward without them."""
    runner = MineStep()
    plain = runner.run(BATCH, loss_mode="token-mean")
    padded = runner.run(BATCH, loss_mode="token-mean", pad_to=10)
    assert _relative(plain, padded) < 1e-12
    monkeypatch.setattr(
        data_module, "position_ids_from_mask", lambda mask: torch.arange(mask.shape[1]).expand(mask.shape)
    )
    plain_broken = runner.run(BATCH, loss_mode="token-mean")  # the prompts have no padding: unchanged
    assert _relative(plain, plain_broken) < 1e-12
    assert _relative(plain, runner.run(BATCH, loss_mode="token-mean", pad_to=10)) > 1e-2


def test_step5_catches_truncation_inferred_from_the_padded_width(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = MineStep()
    assert truncation_problems(BATCH, runner.truncation_run(BATCH)) == []
    original = generation_module.first_eos_mask

    def by_length(response_ids: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        mask, _ = original(response_ids, eos_id)
        return mask, mask.sum(dim=1) < response_ids.shape[1]  # "ended" when shorter than the width

    monkeypatch.setattr(generation_module, "first_eos_mask", by_length)
    got = treated_as_truncated(BATCH, runner.truncation_run(BATCH).outputs)
    assert got is not None and got != BATCH.truncated and got[0]  # row 0 ends with EOS at the budget


class _Misreporting(MineStep):
    """A runner whose library bootstraps the EOS-ended row that fills the budget (truncation inferred
    from the padded width) while the runner says the library got it right."""

    def truncated_rows(self, batch: StepBatch) -> tuple[bool, ...]:
        return batch.truncated


def test_step5_catches_a_runner_that_misreports_truncation(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = _Misreporting()
    assert truncation_problems(BATCH, runner.truncation_run(BATCH), runner.truncated_rows(BATCH)) == []
    original = generation_module.first_eos_mask

    def by_length(response_ids: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        mask, _ = original(response_ids, eos_id)
        return mask, mask.sum(dim=1) < response_ids.shape[1]

    monkeypatch.setattr(generation_module, "first_eos_mask", by_length)
    problems = truncation_problems(BATCH, runner.truncation_run(BATCH), runner.truncated_rows(BATCH))
    assert len(problems) == 2, problems
    assert "rows [0] end with EOS" in problems[0] and "advantages_bootstrapped" in problems[0]
    assert problems[1].startswith("the runner reports rows")


def test_truncation_is_derived_from_each_kind_of_output() -> None:
    rows, width = BATCH.size, BATCH.budget
    mask = torch.ones(rows, width)
    assert treated_as_truncated(BATCH, {}) is None
    assert treated_as_truncated(BATCH, {"loss_mask": mask}) == (False,) * rows
    mask[2] = 0
    assert treated_as_truncated(BATCH, {"loss_mask": mask}) == (False, False, True, *(False,) * 5)
    rewards = torch.tensor(BATCH.scores)
    rewards[7] -= 1.0  # a missing-EOS penalty
    assert treated_as_truncated(BATCH, {"rewards": rewards}) == (*(False,) * 7, True)
    advantages = torch.zeros(rows, width)
    booted = advantages.clone()
    booted[0, -1] = 1.0
    got = treated_as_truncated(BATCH, {"advantages": advantages, "advantages_bootstrapped": booted})
    assert got == (True, *(False,) * 7)
    with pytest.raises(ValueError, match="outputs"):
        treated_as_truncated(BATCH, {"rewards": torch.zeros(3)})
    with pytest.raises(ValueError, match="outputs"):
        treated_as_truncated(BATCH, {"advantages_bootstrapped": booted})
    with pytest.raises(ValueError, match="result"):
        truncation_problems(BATCH, StepResult({}, 0.0))


def test_length_penalty_is_dapos_soft_overlong_punishment() -> None:
    """DAPO R_length with L_max 6, L_cache 2: 0 up to 4 tokens, -(|y| - 4) / 2 up to 6, -1 beyond."""
    dapo = LengthPenalty(buffer=2, factor=1.0, source="DAPO R_length")
    assert [dapo.penalty(n, 6) for n in range(1, 8)] == [0.0, 0.0, 0.0, 0.0, -0.5, -1.0, -1.0]
    assert LengthPenalty(buffer=1, factor=0.5).penalty(6, 6) == -0.5
    assert LengthPenalty(buffer=1).rewards(BATCH) == tuple(
        s - (len(c) == BATCH.budget) for s, c in zip(BATCH.scores, BATCH.completions, strict=True)
    )
    for kwargs, argument in (({"buffer": 0}, "buffer"), ({"buffer": 1, "factor": 0.0}, "factor")):
        with pytest.raises(ValueError, match=f"^{argument}:"):
            LengthPenalty(**kwargs)
    with pytest.raises(ValueError, match=r"^source:"):
        LengthPenalty(buffer=1, source="")
    with pytest.raises(ValueError, match=r"^budget:"):
        dapo.penalty(1, 1)
    with pytest.raises(ValueError, match=r"^convention:"):
        zeros = StepResult({}, 0.0, outputs={"rewards": torch.zeros(8)})
        truncation_problems(BATCH, zeros, None, 1)  # type: ignore[arg-type]


class _LengthShaped:
    """A library whose reward path adds DAPO's soft overlong punishment to each score, reading the
    response length from the attention mask it receives (as verl's ``dapo`` reward manager does), and
    whose runner declares that convention. ``eos_aware`` breaks it the stop-reason-aware way: the
    penalty skips rows that end with EOS, which the declared formula does not."""

    name = "length-shaped"
    version = "0"
    provenance = "tests/test_step_contract.py"
    loss_modes = ("token-mean",)
    micro_batch_local: Mapping[str, str] = MappingProxyType({})
    truncation_convention = LengthPenalty(buffer=2, source="DAPO R_length (test library)")

    def __init__(self, eos_aware: bool = False) -> None:
        self.eos_aware = eos_aware

    def run(self, batch: StepBatch, **kwargs: Any) -> StepResult:
        raise NotImplementedError  # STEP-5 reads truncation_run

    def truncation_run(self, batch: StepBatch) -> StepResult:
        layout = padded(batch, response_width=batch.budget)
        prompt = layout.prompt_ids.shape[1]
        lengths = layout.attention_mask[:, prompt:].sum(dim=1).tolist()
        ended = (layout.response_ids == batch.eos_id).any(dim=1).tolist()
        rewards = []
        for score, length, eos in zip(batch.scores, lengths, ended, strict=True):
            start = batch.budget - 2
            shaped = 0.0 if self.eos_aware and eos else min(-(length - start) / 2, 0.0)
            rewards.append(score + shaped)
        return StepResult({}, 0.0, outputs={"rewards": torch.tensor(rewards)})


def test_step5_applies_a_declared_length_penalty_and_still_fails_an_eos_row_rewarded_otherwise() -> None:
    """The suite's STEP-5 (``truncation_problems`` with the runner's declared convention): every row
    rewarded score + DAPO's length penalty passes (row 0 ends with EOS on its 6th token and gets -1,
    as the formula says); the same rewards fail without the declaration; a library that spares the
    EOS-ended rows (stop-reason aware) while its runner declares the length-only formula fails, naming
    the EOS rows rewarded otherwise (0 and 6: 6 tokens and 5 tokens with EOS)."""
    runner = _LengthShaped()
    assert step_problems(runner) == []
    convention = truncation_convention(runner)
    assert convention is runner.truncation_convention
    result = runner.truncation_run(BATCH)
    assert result.outputs["rewards"].tolist() == list(convention.rewards(BATCH))
    assert treated_as_truncated(BATCH, result.outputs, convention) == (False,) * BATCH.size
    assert truncation_problems(BATCH, result, None, convention) == []
    plain = truncation_problems(BATCH, result)
    assert len(plain) == 1 and "rows [0, 6] end with EOS" in plain[0], plain
    broken = _LengthShaped(eos_aware=True)
    problems = truncation_problems(BATCH, broken.truncation_run(BATCH), None, truncation_convention(broken))
    assert len(problems) == 1 and "rows [0, 6] end with EOS" in problems[0], problems
    assert "declared length penalty (DAPO R_length (test library); L_cache 2" in problems[0]
    # a cut row penalised beyond the formula (a missing-EOS penalty) stays allowed; an EOS row does not
    rewards = torch.tensor(convention.rewards(BATCH))
    rewards[7] -= 1.0
    assert (
        truncation_problems(BATCH, StepResult({}, 0.0, outputs={"rewards": rewards}), None, convention) == []
    )
    rewards[5] -= 0.5
    problems = truncation_problems(BATCH, StepResult({}, 0.0, outputs={"rewards": rewards}), None, convention)
    assert len(problems) == 1 and "rows [5] end with EOS" in problems[0], problems


def test_a_runner_declaring_something_else_is_named() -> None:
    class _Bad(_LengthShaped):
        truncation_convention = "DAPO"  # type: ignore[assignment]

    assert any(p.startswith("truncation_convention:") for p in step_problems(_Bad()))
    with pytest.raises(ValueError, match=r"^runner: truncation_convention"):
        truncation_convention(_Bad())
    assert truncation_convention(MineStep()) is None


class _NoTruncationHandling:
    """A library with no truncation handling of its own: every row keeps its score and its whole loss
    mask, EOS or not; its runner says so (``truncation_not_provided``). ``eos_penalised`` breaks it: the
    EOS-ended row filling the budget is rewarded other than its score, which the declaration denies."""

    name = "no-truncation"
    version = "0"
    provenance = "tests/test_step_contract.py"
    loss_modes = ("token-mean",)
    micro_batch_local: Mapping[str, str] = MappingProxyType({})
    truncation_not_provided = "the stop reason reaches only the metrics (test library, lib.py:1)"

    def __init__(self, eos_penalised: bool = False) -> None:
        self.eos_penalised = eos_penalised

    def run(self, batch: StepBatch, **kwargs: Any) -> StepResult:
        rewards = torch.tensor(batch.scores)
        if self.eos_penalised:
            rewards[0] -= 1.0  # row 0 ends with EOS on the budget's last token
        mask = padded(batch, response_width=batch.budget).attention_mask[:, -batch.budget :].double()
        return StepResult({}, 0.0, outputs={"loss_mask": mask, "rewards": rewards})


def test_step5_reports_a_declared_missing_truncation_handling_as_not_provided() -> None:
    """The suite's STEP-5 test itself: a runner declaring ``truncation_not_provided`` is skipped as
    "not provided" with its reason (never a pass, never a FAIL) when its outputs treat no row as
    truncated; one whose outputs contradict the declaration fails; the attribute is type-checked."""
    from conformance import test_step_tier as tier

    batch = example_batch(budget=tier.BUDGET, prompt_length=tier.PROMPT_LENGTH)
    runner = _NoTruncationHandling()
    assert step_problems(runner) == [] and truncation_not_provided(runner) == runner.truncation_not_provided
    measures: list[tuple[str, object]] = []
    with pytest.raises(pytest.skip.Exception) as skipped:
        tier.test_step5_only_rows_cut_at_the_budget_are_truncated(
            runner, batch, lambda k, v: measures.append((k, v))
        )
    message = str(skipped.value)
    assert message.startswith("not provided: no-truncation has no truncation handling of its own: ")
    assert "test library, lib.py:1" in message
    assert measures and "rows treated as truncated (False," in str(measures[0][1])
    # without the declaration the same outputs fail STEP-5 (rows 2 and 7 are cut, treated as ended)
    assert truncation_problems(batch, runner.run(batch, loss_mode="token-mean"))
    with pytest.raises(
        AssertionError, match=r"declares no truncation handling .* treat rows \[0\] as truncated"
    ):
        tier.test_step5_only_rows_cut_at_the_budget_are_truncated(
            _NoTruncationHandling(eos_penalised=True), batch, lambda k, v: None
        )
    assert truncation_not_provided(MineStep()) is None

    class _Empty(_NoTruncationHandling):
        truncation_not_provided = ""

    class _Both(_NoTruncationHandling):
        truncation_convention = LengthPenalty(buffer=2)

    assert any(
        p.startswith("truncation_not_provided: expected a non-empty str") for p in step_problems(_Empty())
    )
    assert any("declared together with truncation_convention" in p for p in step_problems(_Both()))
    with pytest.raises(ValueError, match=r"^runner: truncation_not_provided"):
        truncation_not_provided(_Empty())
    with pytest.raises(
        AssertionError, match="truncation_not_provided"
    ):  # the STEP-5 test checks the contract
        tier.test_step5_only_rows_cut_at_the_budget_are_truncated(_Empty(), batch, lambda k, v: None)
    # the contract test does not count for STEP-5: a clause passes once one of its tests passed, which
    # would make a not-provided STEP-5 a pass in the report
    clauses = [m.args for m in tier.test_step_runner_contract.pytestmark if m.name == "clause"]
    assert clauses == [("STEP-1", "STEP-2", "STEP-3", "STEP-4")], clauses


def _divided_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant of STEP-6 (ms-swift #10116/#10117): every accumulation step's loss, already its share
    of the whole window's, is divided once more by the number of accumulation steps."""
    original = update_module.minibatch_backward

    def twice(actor_critic: Any, batch: Any, config: Any, autocast: Any, backward: Any, **kw: Any) -> Any:
        steps = -(-batch.size // (config.micro_batch_size or batch.size))
        return original(actor_critic, batch, config, autocast, lambda loss: backward(loss / steps), **kw)

    monkeypatch.setattr(update_module, "minibatch_backward", twice)


def test_step6_passes_on_ppo_ref_and_kills_an_accumulation_divided_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The suite's STEP-6 test on ppo-ref's runner: passes (its micro-batches are its accumulation
    steps, ``micro_batch_size``); with the loss of each accumulation step divided by k once more it
    fails at k = 2 and 4 with the gradient's norm at 1/k of the whole batch's."""
    from conformance import test_step_tier as tier

    batch = example_batch(budget=tier.BUDGET, prompt_length=tier.PROMPT_LENGTH)
    runner = MineStep()
    assert step_problems(runner) == [] and accumulation_setting(runner) == runner.accumulation_setting
    measures: list[tuple[str, object]] = []
    for k in (2, 4):
        tier._RESULTS.clear()
        tier.test_step6_accumulation_steps_give_the_whole_batch_step(
            runner, batch, k, lambda key, value: measures.append((key, value))
        )
    assert any("micro_batch_size" in str(v) for key, v in measures if key == "step_declared")
    _divided_twice(monkeypatch)
    for k in (2, 4):
        tier._RESULTS.clear()
        with pytest.raises(AssertionError) as failed:
            tier.test_step6_accumulation_steps_give_the_whole_batch_step(runner, batch, k, lambda *_: None)
        message = str(failed.value)
        assert f"token-mean: {k} accumulation steps against the whole batch" in message
        assert f"ratio of norms {1 / k:.4g}" in message, message
    tier._RESULTS.clear()


class _NoAccumulation(MineStep):
    name = "no-accumulation"
    accumulation_setting = None  # type: ignore[assignment]
    accumulation_not_provided = "test library has no accumulation setting (lib.py:1)"


def test_step6_not_provided_and_bad_declarations_are_named() -> None:
    """A runner declaring ``accumulation_not_provided`` is skipped as "not provided" with its reason
    (never a pass); one declaring neither is "not provided" too; bad declarations are named."""
    from conformance import test_step_tier as tier

    batch = example_batch(budget=tier.BUDGET, prompt_length=tier.PROMPT_LENGTH)
    runner = _NoAccumulation()
    assert (
        step_problems(runner) == [] and accumulation_not_provided(runner) == runner.accumulation_not_provided
    )
    with pytest.raises(pytest.skip.Exception, match=r"^not provided: no-accumulation has no gradient-accum"):
        tier.test_step6_accumulation_steps_give_the_whole_batch_step(runner, batch, 2, lambda *_: None)

    class _Silent(MineStep):
        accumulation_setting = None  # type: ignore[assignment]

    with pytest.raises(pytest.skip.Exception, match="declares no accumulation_setting"):
        tier.test_step6_accumulation_steps_give_the_whole_batch_step(_Silent(), batch, 2, lambda *_: None)

    class _Both(_NoAccumulation):
        accumulation_setting = "lib.accumulate"  # type: ignore[assignment]

    class _Empty(MineStep):
        accumulation_setting = " "

    class _RunWithoutSetting(_Silent):
        def accumulation_run(self, batch: StepBatch, **kwargs: Any) -> StepResult:
            raise NotImplementedError

    assert any("declared together with accumulation_setting" in p for p in step_problems(_Both()))
    assert any(
        p.startswith("accumulation_setting: expected a non-empty str") for p in step_problems(_Empty())
    )
    assert any(
        p.startswith("accumulation_run: needs accumulation_setting")
        for p in step_problems(_RunWithoutSetting())
    )
    with pytest.raises(ValueError, match=r"^runner: accumulation_setting"):
        accumulation_setting(_Empty())
    with pytest.raises(ValueError, match=r"^runner: accumulation_not_provided"):

        class _EmptyReason(MineStep):
            accumulation_setting = None  # type: ignore[assignment]
            accumulation_not_provided = ""

        accumulation_not_provided(_EmptyReason())
    with pytest.raises(AssertionError, match="accumulation_not_provided"):
        tier.test_step6_accumulation_steps_give_the_whole_batch_step(_Both(), batch, 2, lambda *_: None)


def test_step6_counts_the_optimizer_steps_of_an_accumulation_run() -> None:
    """A runner with its own ``accumulation_run`` whose library steps the optimizer at every
    accumulation step (TRL 1.12's end-of-dataloader sync) fails STEP-6 on the count alone."""
    from conformance import test_step_tier as tier

    batch = example_batch(budget=tier.BUDGET, prompt_length=tier.PROMPT_LENGTH)

    class _Stepping(MineStep):
        name = "stepping"
        loss_modes = ("token-mean",)

        def accumulation_run(
            self, batch: StepBatch, *, loss_mode: str, accumulation_steps: int
        ) -> StepResult:
            result = self.run(batch, loss_mode=loss_mode, micro_batches=accumulation_steps)
            result.stats["optimizer_steps"] = float(accumulation_steps)
            return result

    tier._RESULTS.clear()
    with pytest.raises(AssertionError, match="took 2 optimizer steps, expected 1"):
        tier.test_step6_accumulation_steps_give_the_whole_batch_step(_Stepping(), batch, 2, lambda *_: None)
    tier._RESULTS.clear()


def _no_position_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant of STEP-3 / STEP-7 (known-bugs A5): position ids counted from the first column, as a
    forward without them."""
    monkeypatch.setattr(
        data_module, "position_ids_from_mask", lambda mask: torch.arange(mask.shape[1]).expand(mask.shape)
    )


def test_step7_kills_missing_position_ids_that_step3_misses_on_a_rotary_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On ppo-ref's runner built on Qwen2 (rotary), a forward without position ids passes the suite's
    STEP-3 tests (the shift cancels in the attention scores) and fails STEP-7, which runs the same
    left padding on GPT-2; unbroken, both pass on both families."""
    from conformance import test_step_tier as tier

    batch = example_batch(budget=tier.BUDGET, prompt_length=tier.PROMPT_LENGTH)
    rotary = MineStep(family="qwen2")
    assert step_problems(rotary) == [] and MineStep().family == "gpt2"
    for runner in (MineStep(), rotary):
        tier._RESULTS.clear()
        tier.test_step3_extra_prompt_padding(runner, batch, lambda *_: None)
        tier.test_step7_prompt_padding_on_the_other_position_scheme(runner, batch, lambda *_: None)
    _no_position_ids(monkeypatch)
    tier._RESULTS.clear()
    tier._FAMILY_RUNNERS.clear()
    tier.test_step3_extra_prompt_padding(rotary, batch, lambda *_: None)  # passes: rotary cancels the shift
    with pytest.raises(AssertionError, match=r"gpt2 \(absolute positions\): prompts left-padded by 1"):
        tier.test_step7_prompt_padding_on_the_other_position_scheme(rotary, batch, lambda *_: None)
    with pytest.raises(AssertionError, match="prompts left-padded by 1"):  # and GPT-2's own STEP-3 fails
        tier.test_step3_extra_prompt_padding(MineStep(), batch, lambda *_: None)
    tier._RESULTS.clear()
    tier._FAMILY_RUNNERS.clear()


class _OneFamily(MineStep):
    name = "one-family"
    with_family = None  # type: ignore[assignment]


class _NoGpt2(MineStep):
    name = "no-gpt2"
    family_not_provided = MappingProxyType({"gpt2": "test library cannot load GPT-2 (lib.py:1)"})


def test_step7_not_run_not_provided_and_bad_declarations_are_named() -> None:
    """A runner that builds one family is "not run" (never a pass), one whose library cannot run the
    other family "not provided" with its reason, in the step test and in STEP-7's hand case alike;
    bad declarations are named by the contract."""
    from conformance import test_step_tier as tier
    from ppo_ref.adapters.step import clause_not_judged, other_position_scheme, runner_family

    assert other_position_scheme("gpt2") == ("qwen2", "rotary")
    assert other_position_scheme("llama") == ("gpt2", "absolute")
    assert other_position_scheme("mistral") is None
    assert runner_family(MineStep(family="llama")) == "llama" and runner_family(object()) is None
    assert clause_not_judged(MineStep(), "STEP-7") is None and clause_not_judged(MineStep(), "STEP-3") is None
    batch = example_batch(budget=tier.BUDGET, prompt_length=tier.PROMPT_LENGTH)
    one, no_gpt2 = _OneFamily(), _NoGpt2(family="qwen2")
    assert step_problems(one) == [] and step_problems(no_gpt2) == []
    with pytest.raises(pytest.skip.Exception, match=r"^not run: the runner builds only its gpt2 model"):
        tier.test_step7_prompt_padding_on_the_other_position_scheme(one, batch, lambda *_: None)
    with pytest.raises(pytest.skip.Exception, match=r"^not provided: test library cannot load GPT-2"):
        tier.test_step7_prompt_padding_on_the_other_position_scheme(no_gpt2, batch, lambda *_: None)
    # STEP-7's hand case skips with the same message (conformance/test_hand_cases.py), so verl's
    # declared GPT-2 gap is "not provided" in the matrix, not a pass through the case's op
    assert clause_not_judged(no_gpt2, "STEP-7") == "not provided: test library cannot load GPT-2 (lib.py:1)"
    assert clause_not_judged(one, "STEP-7").startswith("not run: ")  # type: ignore[union-attr]

    class _Bad(MineStep):
        family_not_provided = MappingProxyType({"gpt2": ""})

    class _Own(MineStep):
        family_not_provided = MappingProxyType({"gpt2": "cannot"})

    nameless = MineStep()
    nameless.family = None  # type: ignore[assignment]
    assert any(p.startswith("family_not_provided: expected a Mapping") for p in step_problems(_Bad()))
    assert "family_not_provided: names the runner's own family 'gpt2'" in step_problems(_Own())
    assert "with_family: needs family, the family of the runner's model" in step_problems(nameless)
    with pytest.raises(ValueError, match=r"^family: expected one of gpt2, llama, qwen2"):
        MineStep(family="opt")
