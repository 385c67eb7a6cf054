"""FSDP2 on two CPU processes (gloo): the sharded trainer gives the result of one process.

The processes are started as on a GPU machine, ``accelerate launch --config_file
examples/accelerate/fsdp2.yaml --num_processes 2``, and the trainer's default accelerator
switches accelerate to FSDP2, which accelerate declines on CPUs by itself
(``ppo_ref.trainer.distributed.cpu_fsdp2_accelerator``). From there accelerate's own FSDP2 code
wraps the model: every parameter a DTensor, each process holding half of the elements. The run is
data_parallel_worker.py's (float64 tiny task, two iterations, adaptive KL, micro-batches of one
row), with a checkpoint after every iteration.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import FullyShardedDataParallelPlugin
from data_parallel_worker import ITERATIONS, float64_setup
from fsdp2_worker import ROWS, STEPS, fsdp2_config
from reliability_support import (
    REPO,
    TIMING,
    assert_close,
    assert_runs_agree,
    free_port,
    launch,
    one_thread,
    read_records,
)
from safetensors.torch import load_file

from ppo_ref.trainer import PPOTrainer, load_checkpoint
from ppo_ref.trainer.distributed import cpu_fsdp2_accelerator

__all__ = ["one_thread"]

WORKER = Path(__file__).with_name("fsdp2_worker.py")
CONFIG = REPO / "examples" / "accelerate" / "fsdp2.yaml"


def _accelerate_launch(*args: str) -> None:
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIG)]
    launch([*launcher, "--num_processes", "2", "--main_process_port", str(free_port()), str(WORKER), *args])


def _reports(out: Path) -> list[dict[str, object]]:
    return [json.loads((out / f"fsdp2-rank{rank}.json").read_text()) for rank in (0, 1)]


def _worst(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    assert first.keys() == second.keys()
    assert all(first[k].shape == second[k].shape for k in first)  # full tensors, not shards
    return max(float((first[k] - second[k]).abs().max()) for k in first)


def _model_difference(one: Path, two: Path) -> float:
    a, b = load_checkpoint(one), load_checkpoint(two)
    return max(_worst(a.state_dict(name), b.state_dict(name)) for name in ("policy", "critic"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The run in this process, and in two FSDP2 processes."""
    root = tmp_path_factory.mktemp("fsdp2")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        PPOTrainer(fsdp2_config(root / "one"), float64_setup()).train()
    finally:
        torch.set_num_threads(threads)
    _accelerate_launch(str(root / "two"))
    return SimpleNamespace(root=root, one=root / "one", two=root / "two", reports=_reports(root / "two"))


def _iteration(run: Path, completed: int) -> Path:
    return run / "checkpoints" / f"iter-{completed:06d}"


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_fsdp2_processes_train_like_one(runs: SimpleNamespace) -> None:
    """Sharded for real; the same samples, statistics (gradient norms included) to 1e-9, and
    parameters and optimizer state to 1e-6 (float64: measured differences are ~4e-16)."""
    for report in runs.reports:
        assert report["distributed_type"] == "DistributedType.FSDP" and report["backend"] == "fsdp"
        assert report["sharded_parameters"] is True
        assert report["dtensor_parameters"] == report["parameters"] == 58
        assert report["fsdp_modules"] == 5  # the 2 + 2 GPT-2 blocks of policy and critic, and the root
        assert report["local_elements"] < report["global_elements"]
    assert sum(r["local_elements"] for r in runs.reports) == runs.reports[0]["global_elements"]
    # Every forward is a collective: both processes made the same policy forwards.
    assert runs.reports[0]["policy_forwards"] == runs.reports[1]["policy_forwards"] > 0

    final_one, final_two = _iteration(runs.one, ITERATIONS), _iteration(runs.two, ITERATIONS)
    assert _model_difference(final_one, final_two) < 1e-6
    start = load_file(str(final_one / "reference.safetensors"))
    trained = load_checkpoint(final_one).state_dict("policy")
    assert max(float((trained[k] - v).abs().max()) for k, v in start.items()) > 1e-4  # it did train
    optimizer_one, optimizer_two = (
        load_file(str(p / "optimizer.safetensors")) for p in (final_one, final_two)
    )
    assert _worst(optimizer_one, optimizer_two) < 1e-6
    moments = [t for t in optimizer_one.values() if t.numel() > 1]  # not the step counts
    assert max(float(t.abs().max()) for t in moments) > 1e-3  # AdamW moments were kept

    assert_runs_agree(runs.one, runs.two, 8 * ITERATIONS, "fsdp")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_an_fsdp2_checkpoint_resumes_like_the_straight_run(runs: SimpleNamespace) -> None:
    """The checkpoint after iteration 1, gathered from the shards, holds the one-process state; two
    FSDP2 processes resume it to the straight run's weights, and so does one process."""
    middle = _iteration(runs.two, 1)
    checkpoint = load_checkpoint(middle)
    assert checkpoint.state["data_parallel"] == "fsdp" and checkpoint.state["processes"] == 2
    assert _model_difference(_iteration(runs.one, 1), middle) < 1e-6

    resumed = runs.root / "resumed"
    _accelerate_launch(str(resumed), str(middle))
    assert all(r["resumed"] and r["backend"] == "fsdp" for r in _reports(resumed))
    assert _model_difference(_iteration(runs.two, ITERATIONS), _iteration(resumed, ITERATIONS)) < 1e-6
    straight, again = read_records(runs.two / "metrics.jsonl"), read_records(resumed / "metrics.jsonl")
    assert len(again) == ITERATIONS
    for a, b in zip(straight, again, strict=True):
        for key in (k for k in a if not k.startswith(TIMING)):
            assert_close([a[key]], [b[key]], key)

    alone = runs.root / "resumed-alone"
    PPOTrainer(fsdp2_config(alone), float64_setup(), resume=middle).train()
    assert _model_difference(_iteration(runs.one, ITERATIONS), _iteration(alone, ITERATIONS)) < 1e-6


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sharded_generation_samples_until_every_process_has_ended(runs: SimpleNamespace) -> None:
    """Rank 0's rows end at their first token, rank 1's run to max_new_tokens: rank 0 keeps making
    the forwards (collectives) until rank 1 is done, and its samples are those it draws alone."""
    first, second = (r["generation"] for r in runs.reports)
    assert first["alone_forwards"] == 1 and second["alone_forwards"] == STEPS  # the rows' own needs
    assert first["sharded_forwards"] == second["sharded_forwards"] == STEPS
    # Rank 0 was done at every step, never all processes (rank 1's rows never end).
    assert first["sharded_waited_steps"] == STEPS and second["sharded_waited_steps"] == 0
    eos, pad = first["eos_id"], first["pad_id"]
    assert first["alone_response_ids"] == [[eos]] * ROWS and first["alone_response_mask"] == [[True]] * ROWS
    assert first["sharded_response_ids"] == [[eos] + [pad] * (STEPS - 1)] * ROWS
    assert first["sharded_response_mask"] == [[True] + [False] * (STEPS - 1)] * ROWS
    assert all(len(row) == STEPS and eos not in row for row in second["alone_response_ids"])
    assert second["sharded_response_ids"] == second["alone_response_ids"]
    assert second["sharded_response_mask"] == second["alone_response_mask"] == [[True] * STEPS] * ROWS


def test_cpu_fsdp2_accelerator_refuses_what_it_cannot_shard(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked before any accelerator is built: one process, a wrong plugin, FSDP version 1."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="WORLD_SIZE: sharding needs several processes"):
        cpu_fsdp2_accelerator()
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="plugin: expected a FullyShardedDataParallelPlugin, got dict"):
        cpu_fsdp2_accelerator({"fsdp_version": 2})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="plugin: fsdp_version 1 is not supported"):
        cpu_fsdp2_accelerator(FullyShardedDataParallelPlugin(fsdp_version=1))
