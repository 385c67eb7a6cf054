"""Data parallelism: two processes (torchrun, gloo, CPU) give the result of one with the same global batch."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from data_parallel_worker import ITERATIONS, float64_setup, run, worker_config
from reliability_support import assert_runs_agree, cli_args, one_thread, out_dir, write_local_inputs
from safetensors.torch import load_file
from tiny_task import tiny_config, tiny_setup

from ppo_ref.trainer import PPOTrainer
from ppo_ref.trainer.update import minibatch_backward
from tests.model_fixtures import TwoProcessesInOne, torchrun

__all__ = ["one_thread", "out_dir"]

WORKER = Path(__file__).with_name("data_parallel_worker.py")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_documented_torchrun_command_trains_and_both_processes_exit(tmp_path: Path) -> None:
    """docs/distributed.md's ``torchrun --standalone --nproc_per_node 2 -m ppo_ref.cli train``, on
    local inputs for one iteration: both processes exit 0 (the command line ends them through
    ``exit_launched_process``), process 0 alone prints the summary and writes the run's files."""
    import json

    out = tmp_path / "two"
    stdout = torchrun("-m", "ppo_ref.cli", *cli_args(write_local_inputs(tmp_path / "inputs"), out, 1))
    assert stdout.count("eval score ") == 1, stdout[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["iterations_done"] == 1


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_train_like_one(tmp_path: Path) -> None:
    """One iteration pair of the float64 tiny task (batch 8, minibatches of 4, micro-batches of 1,
    adaptive KL, entropy bonus) in one process here and in two torchrun processes over gloo.

    Equal means: the same samples; the same statistics (KL controller input, whitened advantages,
    losses, and the pre-clipping gradient norms, which would differ if the two processes' gradients
    were averaged instead of summed: AdamW and clipping alone are blind to a gradient scale); and
    parameters within 1e-6 (float64: measured differences are ~3e-16, from summation order).
    """
    one, two = tmp_path / "one", tmp_path / "two"
    run(one)
    torchrun(WORKER, str(two))
    # Both processes hold the same parameters, bitwise (DDP synchronises the gradients).
    rank0, rank1 = (
        load_file(str(two / "parameters-rank0.safetensors")),
        load_file(str(two / "parameters-rank1.safetensors")),
    )
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)
    single = load_file(str(one / "parameters-rank0.safetensors"))
    assert single.keys() == rank0.keys() and all(t.dtype == torch.float64 for t in single.values())
    worst = max(float((single[k] - rank0[k]).abs().max()) for k in single)
    assert worst < 1e-6, worst
    start = load_file(str(one / "checkpoints" / "iter-000002" / "reference.safetensors"))
    moved = max(
        float((single[f"policy.{k}"] - v).abs().max()) for k, v in start.items() if f"policy.{k}" in single
    )
    assert moved > 1e-4  # the runs did train, far more than they differ
    # The same samples, token advantages and statistics.
    assert_runs_agree(one, two, 8 * ITERATIONS, "ddp")
    # The checkpoints are global too: one process continues the two-process run like its own.
    continued = []
    for source in (one, two):
        config = replace(worker_config(tmp_path / f"more-{source.name}"), iterations=ITERATIONS + 1)
        trainer = PPOTrainer(config, float64_setup(), resume=source)
        trainer.train()
        continued.append([p.detach() for p in trainer.policy.parameters()])
    assert max(float((a - b).abs().max()) for a, b in zip(*continued, strict=True)) < 1e-6


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_the_shares_of_a_minibatch_sum_to_its_gradient(out_dir: Path, loss_agg: str) -> None:
    """Each process weights its rows by shares of the *whole* minibatch: the two halves' gradients
    (what DDP sums, after the scale by W undoes its average) add up to the one-process gradient."""
    config = tiny_config(out_dir, num_minibatches=1, micro_batch_size=1, loss_agg=loss_agg, entropy_coef=0.01)
    trainer = PPOTrainer(config, tiny_setup())
    batch = trainer.collect_rollout(0).training_batch()
    lengths = batch.mask.sum(dim=1)
    assert lengths[:4].sum() != lengths[4:].sum(), "the halves must hold different token counts"
    params = trainer.actor_critic.policy_parameters() + trainer.actor_critic.critic_parameters()

    def gradient(**shard: object) -> list[torch.Tensor]:
        trainer.optimizer.zero_grad(set_to_none=True)
        minibatch_backward(
            trainer.actor_critic, batch, config, trainer.autocast, torch.Tensor.backward, **shard
        )  # type: ignore[arg-type]
        return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]

    whole = gradient()
    halves = [gradient(rows=slice(4 * r, 4 * r + 4), collectives=TwoProcessesInOne(r)) for r in (0, 1)]
    for full, first, second in zip(whole, *halves, strict=True):
        assert torch.allclose(full, first + second, atol=1e-6, rtol=1e-4)
    assert any(float(g.abs().sum()) > 0 for g in whole)


def test_a_batch_that_does_not_split_evenly_is_refused_before_any_work(out_dir: Path) -> None:
    three = SimpleNamespace(num_processes=3, process_index=0)
    with pytest.raises(ValueError, match="rollout_batch_size = 8 cannot be split evenly over 3 processes"):
        PPOTrainer(tiny_config(out_dir), tiny_setup(), accelerator=three)  # type: ignore[arg-type]
    two = SimpleNamespace(num_processes=2, process_index=1)
    with pytest.raises(ValueError, match="eval_samples = 7 cannot be split evenly over 2 processes"):
        PPOTrainer(tiny_config(out_dir, eval_samples=7), tiny_setup(), accelerator=two)  # type: ignore[arg-type]
    assert not out_dir.exists()
