"""Resume through the ``ppo-ref`` command, for every built-in tiny task (issue 15, item 1).

The built-in tasks hand the trainer a policy warmed up in place, with its last warm-up gradient
still in ``.grad``; resuming then crashed in torch's optimizer-state loader ("Expected device to be
set"), and the straight run added that stale gradient to its first PPO step. Each task here runs
3 iterations straight with a checkpoint after each, then is resumed from its iteration-1 checkpoint
(a checkpoint directory, into a new --out) and from a copy of the run directory that holds only that
checkpoint (a run directory, in place); both must end bitwise equal to the straight run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_cli_as_a_user import ppo_ref

from tests.model_fixtures import assert_same_checkpoint

SMALL = [
    "--rollout-batch-size", "8", "--num-minibatches", "2", "--ppo-epochs", "2", "--eval-samples", "8",
    "--max-new-tokens", "8", "--no-progress-bar", "--no-tensorboard", "--no-plots",
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("task", ["positive-review", "positive-review-rm", "reverse", "length"])
def test_resume_on_the_command_line_ends_equal_to_a_straight_run(tmp_path: Path, task: str) -> None:
    straight = tmp_path / "straight"
    result = ppo_ref("train", "--task", task, "--seed", "3", "--iterations", "3", "--save-every", "1",
                     "--out", str(straight), *SMALL)  # fmt: skip
    assert result.returncode == 0, result.stderr
    final = straight / "checkpoints" / "iter-000003"

    # A checkpoint directory, into a new --out (the command).
    moved = tmp_path / "moved"
    result = ppo_ref("train", "--iterations", "3", "--resume", str(straight / "checkpoints" / "iter-000001"),
                     "--out", str(moved))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert_same_checkpoint(final, moved / "checkpoints" / "iter-000003")

    # A run directory whose newest checkpoint is iteration 1, continued in place (default --out).
    in_place = tmp_path / "in_place"
    shutil.copytree(straight, in_place)
    for later in ("iter-000002", "iter-000003"):
        shutil.rmtree(in_place / "checkpoints" / later)
    result = ppo_ref("train", "--resume", str(in_place))
    assert result.returncode == 0, result.stderr
    assert_same_checkpoint(final, in_place / "checkpoints" / "iter-000003")
