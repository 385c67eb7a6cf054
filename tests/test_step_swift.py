"""The trainer-step tier run against ms-swift 4.6.0's own ``GRPOTrainer``, in ``.envs/swift``
(spec STEP-1..8).

``pytest conformance/test_step_tier.py --impl=swift`` (the built-in step runner of the ``swift``
adapter, ``ppo_ref.adapters.thirdparty.swift_step``: ms-swift's ``SwiftRLHF`` pipeline builds the
``GRPOTrainer`` and ``train()`` takes one optimizer step; the batch's completions come back from a
stand-in for the generation engine with vLLM's ``finish_reason``; every ``loss_type`` with a
policy-gradient loss). The verdicts are pinned in :data:`EXPECTED_FAILURES`: a change upstream, or a
regression of the runner, shows up here. The gradient is also checked against the formula computed here
independently on the same model. Skipped where the environment is missing
(``python tools/thirdparty_envs.py swift``).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.thirdparty_env import run_step_check, run_step_tier

EXPECTED_FAILURES = {
    "test_step1_ratio_is_one_before_any_update",  # swift-cispo-epsilon
    "test_step2_micro_batches_give_the_whole_batch_gradient[2]",  # swift-bnpo-micro-batch-mean
    "test_step2_micro_batches_give_the_whole_batch_gradient[4]",
    "test_step6_accumulation_steps_give_the_whole_batch_step[2]",  # the same: its micro-batches accumulate
    "test_step6_accumulation_steps_give_the_whole_batch_step[4]",
}

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.thirdparty]


def test_step_tier_verdicts_of_swift() -> None:
    done = run_step_tier("swift", "-rfEs")
    assert done.failed == EXPECTED_FAILURES, done.stdout[-3000:]
    assert done.passed == 10 - len(done.failed), done.stdout[-3000:]
    # STEP-7: the runner builds Llama only; STEP-8's two: not run (no sampling_run yet)
    assert done.skipped == 3, done.stdout[-3000:]


CHECK = """
import json
import torch
from ppo_ref.adapters.step import example_batch, treated_as_truncated
from ppo_ref.adapters.thirdparty.swift_step import SwiftGrpoStep
from step_formula import (group_advantages, ratio_one_surrogate, refusals,
                           relative_gradient_difference, tiny_model)
batch = example_batch(budget=6, prompt_length=9)
runner = SwiftGrpoStep()
out = {}
record = runner._train(batch, "grpo", 2, None, batch.pad_id)
trainer = record["trainer"]
out["trainer"] = [type(trainer).__module__ + "." + type(trainer).__name__, float(trainer.temperature),
                  trainer.loss_type, trainer.advantage_estimator, trainer.scale_rewards]
out["requests"] = sorted(record["order"].rows)
plain = runner.run(batch, loss_mode="grpo")
out["plain_rewards"] = plain.outputs["rewards"].tolist()
out["plain_mask_rows"] = plain.outputs["loss_mask"].sum(dim=1).tolist()
out["plain_rows"] = list(treated_as_truncated(batch, plain.outputs))
cut = runner.truncation_run(batch)
out["cut_mask_rows"] = cut.outputs["loss_mask"].sum(dim=1).tolist()
out["cut_rows"] = list(treated_as_truncated(batch, cut.outputs))
out["x4"] = runner.run(batch, loss_mode="grpo", micro_batches=4).stats["micro_batches_run"]
out["pad9"] = runner.run(batch, loss_mode="grpo", pad_to=9).stats["columns"]
out["errors"] = refusals(runner.run, batch, ({"loss_mode": "token-mean"},
                        {"loss_mode": "grpo", "micro_batches": 3}, {"loss_mode": "grpo", "pad_fill": 1}))
# the formula, computed independently on the same model (tests/env_helpers/step_formula.py)
model = tiny_model(runner, batch)
adv = group_advantages(batch, 1e-4)
out["advantages"] = float((plain.outputs["advantages"][:, 0] - adv.double()).abs().max())
temperature = 0.9
for mode in ("grpo", "dapo"):
    for micro in (1, 4):
        theirs = runner.run(batch, loss_mode=mode, micro_batches=micro)
        model.zero_grad()
        loss, value = ratio_one_surrogate(model, batch, adv, range(batch.size), mode == "dapo", temperature)
        loss.backward()
        relative = relative_gradient_difference(model, theirs.gradient)
        out[f"independent_{mode}_x{micro}"] = [relative, abs(value - theirs.loss)]
print("RESULT" + json.dumps(out))
"""


@functools.lru_cache(maxsize=1)
def _checked() -> dict[str, Any]:
    """CHECK's measurements (one ms-swift process for the tests below)."""
    return run_step_check("swift", CHECK, timeout=600)


def test_swift_step_gradient_is_the_formula_on_the_same_model() -> None:
    """ms-swift's step-0 ``grpo`` gradient is ``-(1/B) sum_i mean_t A_i grad logp_t`` and its ``dapo``
    gradient ``-(1/N) sum A_t grad logp_t``, log-probs of the logits over ms-swift's default
    temperature 0.9, with its group advantages (group mean, unbiased std + 1e-4), computed here
    independently on the same model, to float32 rounding, in one micro-batch and in four; the loss is
    the surrogate's value at ratio 1 (``-sum A`` weighted the same way)."""
    result = _checked()
    trainer = ["swift.rlhf_trainers.grpo_trainer.GRPOTrainer", 0.9, "grpo", "grpo", "group"]
    assert result["trainer"] == trainer, result
    assert result["requests"] == list(range(8)), result
    assert result["advantages"] < 1e-6, result
    for mode in ("grpo", "dapo"):
        for micro in (1, 4):
            relative, loss = result[f"independent_{mode}_x{micro}"]
            assert relative < 1e-5 and loss < 1e-5, (mode, micro, result)
    assert result["errors"] == ["loss_mode", "micro_batches", "pad_fill"], result


def test_swift_rollout_layout_and_truncation() -> None:
    """The runs go through the split and the widths asked for (4 micro-batches run; ``pad_to`` 9
    widens the collated sequences from 15 to 18 columns, the completion window to 9); the plain run's
    rewards are the scores and its loss mask covers each completion, EOS included; with
    ``overlong_filter`` exactly the rows the engine reports as ``finish_reason == "length"`` (2 and 7,
    cut at the budget) are masked out, the EOS-ended row 0 of the budget's length is kept."""
    result = _checked()
    assert result["x4"] == 4.0 and result["pad9"] == 9.0, result
    assert result["plain_rewards"] == [1.0, 0.0, 0.5, -1.0, 0.25, 1.5, -0.5, 0.0], result
    assert result["plain_mask_rows"] == [6, 2, 6, 4, 1, 4, 5, 6], result
    assert result["plain_rows"] == [False] * 8, result
    assert result["cut_mask_rows"] == [6, 2, 0, 4, 1, 4, 5, 0], result
    assert result["cut_rows"] == [False, False, True, False, False, False, False, True], result
