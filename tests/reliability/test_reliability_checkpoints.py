"""Checkpoints: exact resume, atomic writes that survive SIGKILL, no pickle, resume rules on the CLI."""

from __future__ import annotations

import json
import math
import os
import pickle
import random
import signal
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from accelerate.utils import DistributedType
from reliability_support import cli_args, one_thread, out_dir, start_cli, wait_for, write_local_inputs
from safetensors import safe_open
from tiny_task import tiny_config, tiny_setup

from ppo_ref import cli
from ppo_ref.trainer import PPOTrainer, find_checkpoint, load_checkpoint
from ppo_ref.trainer.checkpoint import TEST_PAUSE_ENV, decode_tree, encode_tree
from tests.model_fixtures import assert_same_checkpoint

__all__ = ["one_thread", "out_dir"]


def test_a_resumed_run_ends_bitwise_equal_to_a_straight_run(tmp_path: Path) -> None:
    """2N = 4 iterations straight, against 2 iterations, a checkpoint, and a resumed run to 4.

    The adaptive KL controller and the entropy bonus are on, so the KL coefficient and every
    model carry state across the checkpoint. Before the resumed run trains, the global RNGs are
    reseeded: if the trainer drew from them, the runs would differ.
    """
    settings = {
        "iterations": 4,
        "save_every": 2,
        "adaptive_kl": True,
        "kl_target": 0.01,
        "entropy_coef": 0.01,
    }
    straight = PPOTrainer(tiny_config(tmp_path / "straight", **settings), tiny_setup())
    straight.train()
    assert sorted(p.name for p in (tmp_path / "straight" / "checkpoints").iterdir()) == [
        "iter-000002",
        "iter-000004",
    ]
    half = tmp_path / "straight" / "checkpoints" / "iter-000002"
    resumed = PPOTrainer(tiny_config(tmp_path / "resumed", **settings), tiny_setup(), resume=half)
    assert resumed.start_iteration == 2 and resumed.kl_controller.value != 0.05  # adapted, then saved
    torch.manual_seed(12345)
    np.random.seed(12345)
    random.seed(12345)
    summary = resumed.train()
    assert_same_checkpoint(tmp_path / "straight", tmp_path / "resumed")
    final_straight = [p.detach() for p in straight.policy.parameters()]
    assert all(
        torch.equal(a, b.detach()) for a, b in zip(final_straight, resumed.policy.parameters(), strict=True)
    )
    expected = json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert summary["eval_score_final"] == expected["eval_score_final"]
    assert summary["eval_score_initial"] == expected["eval_score_initial"]  # kept from the checkpoint
    assert summary["resumed_from"] == str(half) and summary["iterations_done"] == 4
    lines = (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == [0, 1, 2, 3]


def test_the_checkpoint_holds_the_complete_state_and_loads_without_pickle(
    out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = PPOTrainer(tiny_config(out_dir, iterations=1, critic="reward"), tiny_setup(reward_model=True))
    trainer.train()
    path = out_dir / "checkpoints" / "iter-000001"
    assert (
        find_checkpoint(out_dir) == path == find_checkpoint(path) == find_checkpoint(out_dir / "checkpoints")
    )
    names = sorted(p.name for p in path.iterdir())
    assert names == [
        "critic.safetensors",
        "metrics.jsonl",
        "optimizer.safetensors",
        "policy.safetensors",
        "reference.safetensors",
        "reward_model.safetensors",
        "rng.safetensors",
        "trainer_state.json",
    ]
    state = json.loads((path / "trainer_state.json").read_text())
    assert state["iteration"] == 1 and state["config"]["critic"] == "reward"
    assert state["kl_coef"] == 0.05 and state["nonfinite_steps"] == 0 and state["scheduler"] is None
    assert state["aliases"]["policy"] == {"lm_head.weight": "transformer.wte.weight"}  # tied, stored once
    for name in names:
        if name.endswith(".safetensors"):
            with safe_open(str(path / name), framework="pt") as handle:
                assert len(list(handle.keys())) > 0

    # Resuming reads nothing through pickle or torch.load.
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("pickle was used to read a checkpoint")

    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    config = tiny_config(out_dir, iterations=1, critic="reward")
    resumed = PPOTrainer(config, tiny_setup(reward_model=True), resume=out_dir)
    assert resumed.start_iteration == 1
    saved = load_checkpoint(out_dir).state_dict("critic")
    assert all(
        torch.equal(v, resumed.actor_critic.module.state_dict()[f"critic.{k}"]) for k, v in saved.items()
    )


def test_state_trees_round_trip_through_json_and_tensors() -> None:
    tree = {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2, 3)}, "groups": [{"betas": (0.9, 0.999)}]}
    encoded, tensors = encode_tree(tree, prefix="t.")
    decoded = decode_tree(json.loads(json.dumps(encoded)), tensors)
    assert decoded.keys() == tree.keys() and decoded["groups"] == [{"betas": (0.9, 0.999)}]
    assert torch.equal(decoded[0]["exp_avg"], torch.ones(2, 3)) and float(decoded[0]["step"]) == 3.0
    with pytest.raises(ValueError, match="cannot store a object without pickle"):
        encode_tree({"x": object()})


@pytest.mark.slow
def test_sigkill_during_a_checkpoint_write_leaves_the_previous_one_loadable(tmp_path: Path) -> None:
    inputs = write_local_inputs(tmp_path)
    out, log = tmp_path / "run", tmp_path / "log.txt"
    args = cli_args(inputs, out, 3, "--save-every", "1")
    process = start_cli(args, log, **{TEST_PAUSE_ENV: "2:60"})  # sleeps 60 s inside checkpoint 2

    def half_written() -> bool:
        root = out / "checkpoints"
        return root.is_dir() and any(
            p.name.startswith(".iter-000002.tmp-") and (p / "policy.safetensors").exists()
            for p in root.iterdir()
        )

    wait_for(half_written, process, log, timeout=120)
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL
    root = out / "checkpoints"
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == ["iter-000001"]
    assert find_checkpoint(out) == root / "iter-000001"  # the half-written one is never taken
    with pytest.raises(ValueError, match="no complete checkpoint"):
        find_checkpoint(next(p for p in root.iterdir() if p.name.startswith(".iter-000002")))
    previous = load_checkpoint(out)
    assert previous.iteration == 1 and previous.state_dict("policy") and previous.optimizer_state()
    # The run goes on from iteration 1, in place; the stale temporary directory is cleaned up.
    assert cli.main(["train", "--resume", str(out), "--no-progress-bar"]) == 0
    assert sorted(p.name for p in root.iterdir()) == ["iter-000001", "iter-000002", "iter-000003"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1, 2]
    assert all(math.isfinite(r["policy_loss"]) for r in records)


def test_resume_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs = write_local_inputs(tmp_path)
    first = tmp_path / "first"
    assert cli.main(cli_args(inputs, first, 1)) == 0
    # The run directory resumes from its newest checkpoint into a new --out; --iterations is the total.
    second = tmp_path / "second"
    assert cli.main(["train", "--resume", str(first), "--out", str(second), "--iterations", "2"]) == 0
    assert find_checkpoint(second).name == "iter-000002"
    summary = json.loads((second / "summary.json").read_text())
    assert summary["iterations_done"] == 2 and summary["resumed_from"].endswith("iter-000001")
    capsys.readouterr()
    # A field that changes the run's math cannot change on resume; fewer iterations than done fail.
    assert cli.main(["train", "--resume", str(second), "--learning-rate", "0.5"]) == 2
    assert "config field 'learning_rate' is 0.5 but 0.0001 in" in capsys.readouterr().err
    assert cli.main(["train", "--resume", str(second), "--iterations", "1"]) == 2
    assert "iterations=1 is fewer than the 2 iterations already done" in capsys.readouterr().err
    assert cli.main(["train", "--resume", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli.main(["train", "--resume", str(inputs["policy"])]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err


def test_resuming_under_deepspeed_is_refused_before_any_work(out_dir: Path) -> None:
    deepspeed = SimpleNamespace(
        num_processes=1,
        process_index=0,
        distributed_type=DistributedType.DEEPSPEED,
        device=torch.device("cpu"),
    )
    with pytest.raises(ValueError, match="resuming under DeepSpeed is not supported"):
        PPOTrainer(tiny_config(out_dir), tiny_setup(), accelerator=deepspeed, resume=out_dir)  # type: ignore[arg-type]
