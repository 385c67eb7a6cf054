"""Groups survive the multi-process gather: a GRPO run in two processes (torchrun, gloo, CPU) gives
the advantages of the same run in one, although a group's rows are split between the processes.

``python test_family_estimators_parallel.py OUT`` (alone or under torchrun) is the worker: it trains
the tiny task of tiny_task.py with ``advantage_estimator = "grpo"`` on batches of 12 rows in groups
of 4, so rows 0-5 (process 0) and 6-11 (process 1) split the middle group. Advantages computed per
process would differ (checked in-process by test_family_estimators.py); computed on the gathered
batch they are the one-process numbers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_task import tiny_config, tiny_policy, tiny_setup, tiny_tokenizer

from ppo_ref.trainer import PPOTrainer, TrainerConfig, TrainingSetup
from ppo_ref.trainer.distributed import exit_launched_process


def worker_config(out: Path) -> TrainerConfig:
    return tiny_config(
        out,
        iterations=2,
        advantage_estimator="grpo",
        group_size=4,
        rollout_batch_size=12,
        num_minibatches=2,
        kl_coef=0.5,
        eval_samples=8,
        audit_samples=12,
    )


def worker_setup() -> TrainingSetup:
    """The tiny task in float64, with a reference other than the initial policy (the returns carry
    a KL term, so the groups are not constant)."""
    from dataclasses import replace

    setup = replace(tiny_setup(), reference=tiny_policy(tiny_tokenizer(), seed=5))
    setup.policy.double()
    assert setup.reference is not None
    setup.reference.double()
    return setup


def _records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_give_the_group_advantages_of_one(tmp_path: Path) -> None:
    from accelerate import Accelerator

    # imported here: this file also runs as a torchrun worker, where tests/ is not importable
    from tests.model_fixtures import torchrun

    one, two = tmp_path / "one", tmp_path / "two"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        PPOTrainer(worker_config(one), worker_setup(), Accelerator(cpu=True, mixed_precision="no")).train()
    finally:
        torch.set_num_threads(threads)
    torchrun(__file__, str(two))

    audit_one, audit_two = _records(one / "rollouts.jsonl"), _records(two / "rollouts.jsonl")
    assert len(audit_one) == len(audit_two) == 24
    for a, b in zip(audit_one, audit_two, strict=True):
        assert a["sample_index"] == b["sample_index"] and a["prompt"] == b["prompt"]
        assert a["response_ids"] == b["response_ids"] and a["action_mask"] == b["action_mask"]
        for x, y in zip(a["advantages"], b["advantages"], strict=True):  # type: ignore[call-overload]
            assert (x is None and y is None) or abs(x - y) <= 1e-9, (a["sample_index"], x, y)
    middle = [a for a in audit_one if a["iteration"] == 0][4:8]
    assert len({m["prompt"] for m in middle}) == 1  # one group, its rows on both processes
    per_row = [next(v for v in m["advantages"] if v is not None) for m in middle]  # type: ignore[attr-defined]
    assert abs(sum(per_row)) < 1e-9 and max(per_row) > 0
    summary = json.loads((two / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["critic"] == "none"


if __name__ == "__main__":
    from accelerate import Accelerator

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True, mixed_precision="no")
    trainer = PPOTrainer(worker_config(Path(sys.argv[1])), worker_setup(), accelerator)
    trainer.train()
    exit_launched_process(accelerator)  # the trainer still held: no teardown hang or abort
