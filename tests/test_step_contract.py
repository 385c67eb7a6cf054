"""The trainer-step tier's contract (ppo_ref.adapters.step) and ppo-ref's own step runner (spec STEP-1..5).

The runner's checks are the suite's (conformance/test_step_tier.py); here: the batch's validation,
the helpers, the runner lookup, and that each STEP comparison catches the bug it is for, by breaking
ppo-ref's trainer on purpose (a micro-batch-local normaliser, forwards without position ids, truncation
inferred from the padded length) and watching the comparison move far above the tolerance.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ppo_ref.trainer.data as data_module
import ppo_ref.trainer.generation as generation_module
import ppo_ref.trainer.update as update_module
from ppo_ref.adapters.step import (
    BUILTIN_STEP_RUNNERS,
    StepBatch,
    StepResult,
    StepRunner,
    example_batch,
    gradient_difference,
    step_problems,
    step_runner,
    treated_as_truncated,
    truncation_problems,
)
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

    assert set(BUILTIN_STEP_RUNNERS) == {"mine", "trl", "trl116", "verl"}  # the adapters' names
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
