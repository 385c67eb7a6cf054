"""Golden runs: the trainer's numbers must not move when its code is reorganised.

Each case trains a few iterations and compares every metrics.jsonl value except the timings, the
rollouts.jsonl records, the summary's evaluation figures and a SHA-256 of the final trained weights
(policy and critic) with data written by the code before the trainer's redesign (issue 12). Case
``default`` is the default task (quickly built) with the default config at a small size; case
``tiny-value-head-rm`` covers the other paths (value-head critic, a reward model with its own scorer,
forward and micro-batch chunking, bootstrap truncation, adaptive KL).

Floating-point bits differ between CPUs, so the data is kept per CPU fingerprint
(``tests/trainer/golden_cpus.py``, ``data/golden/<cpu>/``):

- on a CPU with data of its own, both cases are compared bit for bit;
- on every CPU, the tiny case is compared with every CPU's data within a relative tolerance of 100
  times the drift measured between the known CPUs (8.7e-6 between the AMD EPYC and the Intel Xeon,
  so 8.7e-4), token ids, masks and texts exactly; three seeded behaviour changes (clip range
  0.2 -> 0.02: the case's ratios stay within 1 +- 0.055, so 0.1 would change nothing; a dropped KL term; one
  extra optimizer step) must fail that comparison, so it is a check that can fail;
- the default case has no tolerance path: its 200-step SFT warm-up turns the CPUs' rounding into
  other sampled tokens by iteration 0 (the EPYC and the Xeon sample different responses), so on a CPU
  without data of its own its bitwise test skips, saying so.

A change that is meant to change the numbers regenerates this CPU's data with
``PPO_REF_WRITE_GOLDEN=1 .venv/bin/python -m pytest tests/trainer/test_trainer_golden.py`` (a new CPU
gets a folder of its own) and says why in its commit. The other CPUs' folders are then stale: the
commit rewrites them on their CPUs or removes them (the tolerance then uses the drift recorded in
``golden_cpus.RECORDED_DRIFT``), since the tolerance test compares against every folder.
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
from tests.trainer import golden_cpus
from tests.trainer.tiny_task import tiny_config, tiny_setup

TINY = "tiny-value-head-rm"
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


def _tiny_case(out: Path, **overrides: Any) -> tuple[TrainerConfig, TrainingSetup]:
    settings: dict[str, Any] = {
        "iterations": 3,
        "critic": "value-head",
        "forward_batch_size": 3,
        "micro_batch_size": 3,
        "truncation": "bootstrap",
        "adaptive_kl": True,
        "kl_target": 0.5,
        "entropy_coef": 0.01,
    }
    return tiny_config(out, **(settings | overrides)), tiny_setup(reward_model=True)


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
    return _train(*CASES[name](out), out)


def _train(config: TrainerConfig, setup: TrainingSetup, out: Path) -> dict[str, Any]:
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


_RUNS: dict[str, dict[str, Any]] = {}


def _cached_run(name: str, out: Path) -> dict[str, Any]:
    """One training run per case and session, as JSON stores it (NaN -> null)."""
    if name not in _RUNS:
        _RUNS[name] = json.loads(json.dumps(_run(name, out)))
    return _RUNS[name]


@pytest.mark.parametrize("name", sorted(CASES))
def test_training_is_bitwise_the_golden_run(tmp_path: Path, name: str) -> None:
    current = golden_cpus.fingerprint()
    folder = golden_cpus.matching_folder(current)
    writing = os.environ.get("PPO_REF_WRITE_GOLDEN") == "1"
    if folder is None and not writing:
        known = ", ".join(f.name for f in golden_cpus.known_folders())
        pytest.skip(
            f"no golden data for this CPU ({current['cpu_model']}, {current['torch_cpu_capability']}, "
            f"{current['torch_threads']} threads; known: {known}): the tiny case is checked within the "
            "cross-CPU tolerance instead; PPO_REF_WRITE_GOLDEN=1 writes this CPU's data"
        )
    result = _cached_run(name, tmp_path / "run")
    if writing:
        folder = golden_cpus.folder_for(current)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"golden-{name}.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        (folder / "fingerprint.json").write_text(json.dumps(current, indent=1) + "\n", encoding="utf-8")
    assert folder is not None
    golden = golden_cpus.load(folder, name)
    assert len(result["metrics"]) == len(golden["metrics"])
    for ours, theirs in zip(result["metrics"], golden["metrics"], strict=True):
        assert ours == theirs, (
            f"iteration {theirs['iteration']}: metrics differ from the golden run ({folder.name})"
        )
    assert result["rollouts"] == golden["rollouts"]
    assert result["summary"] == golden["summary"]
    assert result["weights_sha256"] == golden["weights_sha256"]


@pytest.mark.parametrize("folder", golden_cpus.known_folders(), ids=lambda f: f.name)
def test_tiny_case_within_cross_cpu_tolerance(tmp_path: Path, folder: Path) -> None:
    rtol, drift = golden_cpus.cross_cpu_rtol(TINY)
    result = _cached_run(TINY, tmp_path / "run")
    diffs = golden_cpus.differences(
        golden_cpus.comparable(result), golden_cpus.comparable(golden_cpus.load(folder, TINY)), rtol
    )
    assert not diffs, (
        f"{len(diffs)} values differ from {folder.name}'s data beyond rtol {rtol:.2g} "
        f"({golden_cpus.DRIFT_FACTOR:g} x the drift {drift:.2g} measured between the known CPUs):\n"
        + "\n".join(diffs[:10])
    )


def _extra_first_step(patch: pytest.MonkeyPatch) -> dict[str, Any]:
    """One extra optimizer step: the run's first AdamW step is taken twice (same gradients)."""
    real_step = torch.optim.AdamW.step
    calls = {"n": 0}

    def step(self: torch.optim.AdamW, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            real_step(self, *args, **kwargs)
        return real_step(self, *args, **kwargs)

    patch.setattr(torch.optim.AdamW, "step", step)
    return {}


SEEDED_CHANGES: dict[str, Callable[[pytest.MonkeyPatch], dict[str, Any]]] = {
    "clip-range-0.2-to-0.02": lambda patch: {"clip_eps": 0.02},
    "kl-term-dropped": lambda patch: {"kl_coef": 0.0, "adaptive_kl": False},
    "one-extra-optimizer-step": _extra_first_step,
}
"""Behaviour changes the tolerance path must see: each returns the tiny case's config overrides."""


@pytest.mark.parametrize("change", sorted(SEEDED_CHANGES))
def test_cross_cpu_tolerance_fails_on_seeded_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """The tolerance path can fail: each seeded change leaves it, against every CPU's data."""
    rtol, _ = golden_cpus.cross_cpu_rtol(TINY)
    out = tmp_path / "run"
    changed = json.loads(json.dumps(_train(*_tiny_case(out, **SEEDED_CHANGES[change](monkeypatch)), out)))
    for folder in golden_cpus.known_folders():
        golden = golden_cpus.load(folder, TINY)
        diffs = golden_cpus.differences(golden_cpus.comparable(changed), golden_cpus.comparable(golden), rtol)
        assert diffs, f"{change}: the tiny case stayed within rtol {rtol:.2g} of {folder.name}'s data"


def test_differences_compares_floats_relatively_and_the_rest_exactly() -> None:
    golden = {"loss": 2.0, "zero": 0.0, "ids": [3, 4], "text": "ab", "nan": None}
    assert golden_cpus.differences(golden | {"loss": 2.0 * (1 + 1e-4)}, golden, 1e-3) == []
    assert golden_cpus.differences(golden | {"loss": 2.01}, golden, 1e-3) == [
        ".loss: 2.01 (this run) vs 2.0 (golden)"
    ]
    assert len(golden_cpus.differences(golden | {"zero": 1e-30}, golden, 1e-3)) == 1
    assert len(golden_cpus.differences(golden | {"ids": [3, 5]}, golden, 1.0)) == 1
    assert len(golden_cpus.differences(golden | {"text": "ac", "nan": 0.0}, golden, 1.0)) == 2
    with pytest.raises(ValueError, match="rtol"):
        golden_cpus.differences(golden, golden, -1.0)
    with pytest.raises(ValueError, match="differ exactly"):
        golden_cpus.max_relative_drift(golden | {"ids": [3, 5]}, golden)
