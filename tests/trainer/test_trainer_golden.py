"""Bitwise golden runs: the trainer's numbers must not move when its code is reorganised.

Each case trains a few iterations and compares, bit for bit, every metrics.jsonl value except the
timings, the rollouts.jsonl records, the summary's evaluation figures and a SHA-256 of the final
trained weights (policy and critic) with data written by the code before the trainer's redesign
(issue 12). Case ``default`` is the default task (quickly built) with the default config at a
small size; case ``tiny-value-head-rm`` covers the other paths (value-head critic, a reward model
with its own scorer, forward and micro-batch chunking, bootstrap truncation, adaptive KL).

A change that is meant to change the numbers regenerates the data with
``PPO_REF_WRITE_GOLDEN=1 .venv/bin/python -m pytest tests/trainer/test_trainer_golden.py`` and
says why in its commit.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ppo_ref.trainer import PPOTrainer, TrainerConfig, TrainingSetup
from ppo_ref.trainer.metrics import STAGE_SECONDS
from tests.trainer.tiny_task import tiny_config, tiny_setup

DATA = Path(__file__).parent / "data"
SUMMARY_KEYS = (
    "iterations_done",
    "eval_samples",
    "eval_score_initial",
    "eval_score_final",
    "kl_ref_initial",
    "kl_ref_final",
    "well_formed_rate_initial",
    "well_formed_rate_final",
    "eos_rate_initial",
    "eos_rate_final",
    "nonfinite_steps",
    "skipped_samples",
)


def _default_case(out: Path) -> tuple[TrainerConfig, TrainingSetup]:
    """The command line's set-up of the default task; its policy warms up for 200 steps only."""
    from ppo_ref.tasks.review import build_positive_review
    from ppo_ref.trainer import setup as setups

    user = {
        "seed": 0,
        "out": str(out),
        "iterations": 3,
        "rollout_batch_size": 16,
        "eval_samples": 16,
        "tensorboard": False,
        "progress_bar": False,
        "plots": False,
    }
    quick = pytest.MonkeyPatch()
    with quick.context() as patch:
        patch.setattr(setups, "_build_task", lambda name, seed: build_positive_review(seed, sft_steps=200))
        setup, config = setups.build_setup(TrainerConfig(**user), set(user))
    return config, setup


def _tiny_case(out: Path) -> tuple[TrainerConfig, TrainingSetup]:
    config = tiny_config(
        out,
        iterations=3,
        critic="value-head",
        forward_batch_size=3,
        micro_batch_size=3,
        truncation="bootstrap",
        adaptive_kl=True,
        kl_target=0.5,
        entropy_coef=0.01,
    )
    return config, tiny_setup(reward_model=True)


CASES: dict[str, Callable[[Path], tuple[TrainerConfig, TrainingSetup]]] = {
    "default": _default_case,
    "tiny-value-head-rm": _tiny_case,
}


def weights_sha256(trainer: PPOTrainer) -> str:
    """SHA-256 over the trained module's state dict: names, dtypes, shapes and raw bytes, in key order."""
    digest = hashlib.sha256()
    state = trainer.actor_critic.module.state_dict()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def _run(name: str, out: Path) -> dict[str, Any]:
    config, setup = CASES[name](out)
    trainer = PPOTrainer(config, setup)
    summary = trainer.train()
    timing = set(STAGE_SECONDS)
    metrics = [
        {k: v for k, v in json.loads(line).items() if k not in timing}
        for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    rollouts = [
        json.loads(line) for line in (out / "rollouts.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    return {
        "metrics": metrics,
        "rollouts": rollouts,
        "summary": {key: json.loads(json.dumps(summary[key])) for key in SUMMARY_KEYS},
        "weights_sha256": weights_sha256(trainer),
    }


@pytest.mark.parametrize("name", sorted(CASES))
def test_training_is_bitwise_the_golden_run(tmp_path: Path, name: str) -> None:
    path = DATA / f"golden-{name}.json"
    result = json.loads(json.dumps(_run(name, tmp_path / "run")))  # as JSON stores it (NaN -> null)
    if os.environ.get("PPO_REF_WRITE_GOLDEN") == "1":
        path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    golden = json.loads(path.read_text(encoding="utf-8"))
    assert len(result["metrics"]) == len(golden["metrics"])
    for ours, theirs in zip(result["metrics"], golden["metrics"], strict=True):
        assert ours == theirs, f"iteration {theirs['iteration']}: metrics differ from the golden run"
    assert result["rollouts"] == golden["rollouts"]
    assert result["summary"] == golden["summary"]
    assert result["weights_sha256"] == golden["weights_sha256"]
