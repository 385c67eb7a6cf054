"""The critic-free on-policy shortcuts of stage 4 (issue 12, part 4).

* ``TrainerConfig.old_logprobs_from_sampler``: when the sampler draws from exactly the trained
  distribution (no critic, no top-k/top-p, no rollout temperature or correction, one minibatch),
  the sampler's own log-probs and entropies are the old ones and the policy's no-grad forward is
  skipped; stage 7's step-0 check recomputes every action token's log-prob and stops a run whose
  sampler disagrees.
* ``TrainerConfig.uses_reference_forward``: with ``kl_coef = 0`` and a fixed coefficient there is
  no KL term anywhere, so the reference's forward is skipped (no reference log-probs, no KL).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_task import tiny_config, tiny_setup

from ppo_ref.trainer import PPOTrainer, TrainerConfig, stages
from ppo_ref.trainer.update import LogprobMismatchError

GRPO: dict[str, Any] = {
    "advantage_estimator": "grpo",
    "group_size": 4,
    "num_minibatches": 1,
    "ppo_epochs": 2,
    "kl_in": "loss",
    "kl_coef": 0.1,
}


def _forbidden(*args: object, **kwargs: object) -> None:
    raise AssertionError("this forward must not run")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, True),
        ({"ppo_epochs": 1, "kl_coef": 0.0}, True),
        ({"advantage_estimator": "gae", "group_size": 1, "kl_in": "reward"}, False),  # values needed
        ({"num_minibatches": 2}, False),  # the step-0 check would see half the rows
        ({"top_k": 3}, False),
        ({"top_p": 0.9}, False),
        ({"rollout_temperature": 0.7}, False),
        ({"rollout_correction": "token-truncate"}, False),
        ({"mixed_precision": "bf16"}, False),
    ],
)
def test_the_sampler_log_probs_are_used_only_when_they_are_the_trained_distributions(
    tmp_path: Path, overrides: dict[str, Any], expected: bool
) -> None:
    config = tiny_config(tmp_path, **{**GRPO, **overrides})
    assert config.old_logprobs_from_sampler is expected


def test_the_reference_forward_runs_only_with_a_kl_term(tmp_path: Path) -> None:
    assert tiny_config(tmp_path).uses_reference_forward  # the default kl_coef 0.05
    assert not tiny_config(tmp_path, kl_coef=0.0).uses_reference_forward
    assert tiny_config(tmp_path, kl_coef=0.0, adaptive_kl=True).uses_reference_forward


def _full_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TrainerConfig, "old_logprobs_from_sampler", property(lambda self: False))


def test_the_shortcut_gives_the_update_of_the_full_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same rollout (same noise, same tokens), old log-probs and entropies within float noise, and
    the same parameters after two epochs; the shortcut runs no policy forward in stage 4."""
    results = []
    for shortcut in (True, False):
        with monkeypatch.context() as patch:
            if shortcut:
                patch.setattr(stages, "_forward_no_grad", _forbidden)
            else:
                _full_path(patch)
            config = tiny_config(tmp_path / str(shortcut), **GRPO)
            trainer = PPOTrainer(config, tiny_setup())
            rollout = trainer.collect_rollout(0)
            stats = trainer.update(rollout)
            params = [p.detach().clone() for p in trainer.actor_critic.policy_parameters()]
            results.append((rollout, stats, params))
    (fast, fast_stats, fast_params), (full, full_stats, full_params) = results
    mask = full.mask
    assert int(mask.sum()) > 0 and torch.equal(fast.sequences.input_ids, full.sequences.input_ids)
    assert fast.old_logprobs.dtype == full.old_logprobs.dtype == torch.float32
    assert torch.allclose(fast.old_logprobs[mask], full.old_logprobs[mask], atol=1e-5)
    assert torch.allclose(fast.entropy[mask], full.entropy[mask], atol=1e-5)
    assert not bool(fast.old_logprobs[~fast.sequences.response_mask].any())  # 0 after EOS
    assert full_stats.logprob_check_max_abs_diff == 0.0  # forward against forward
    assert 0.0 < fast_stats.logprob_check_max_abs_diff <= 1e-5  # forward against the sampler
    assert fast_stats.optimizer_steps == full_stats.optimizer_steps == 2
    assert fast_stats.policy_loss == pytest.approx(full_stats.policy_loss, abs=1e-6)
    moved = max(float((p - q).abs().max()) for p, q in zip(full_params, fast_params, strict=True))
    initial = [p.detach() for p in tiny_setup().policy.parameters()]
    changed = max(float((p - q).abs().max()) for p, q in zip(full_params, initial, strict=True))
    assert changed > 1e-4 and moved < 1e-5, (changed, moved)


def test_a_sampler_that_disagrees_with_the_forward_stops_the_run(tmp_path: Path) -> None:
    trainer = PPOTrainer(tiny_config(tmp_path, **GRPO), tiny_setup())
    rollout = trainer.collect_rollout(0)
    shifted = torch.where(rollout.mask, rollout.old_logprobs - 0.01, rollout.old_logprobs)
    with pytest.raises(LogprobMismatchError, match="differ from the rollout's old log-probs"):
        trainer.update(replace(rollout, old_logprobs=shifted))


def test_no_kl_term_means_no_reference_forward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stages, "_reference_logprobs", _forbidden)
    config = tiny_config(tmp_path, **{**GRPO, "kl_coef": 0.0}, iterations=1, audit_samples=2)
    trainer = PPOTrainer(config, tiny_setup())
    with monkeypatch.context() as patch:
        rollout = trainer.collect_rollout(0)
        assert rollout.ref_logprobs is None and rollout.kl is None
        stats = trainer.update(rollout)
        assert stats.optimizer_steps == 2 and stats.kl_loss is None
        record = trainer.iteration_metrics(rollout, stats, {})
        assert math.isnan(record["kl_ref"]) and "kl_loss" not in record
        audit = trainer.audit_records(rollout, 2)
        assert all(value is None for value in audit[0]["ref_logprobs"])
        patch.undo()
    # The evaluations still measure the KL to the reference (its forward runs there).
    monkeypatch.undo()
    summary = PPOTrainer(config, tiny_setup()).train()
    assert summary["kl_ref_initial"] == pytest.approx(0.0, abs=1e-6) and summary["kl_ref_final"] > 0
