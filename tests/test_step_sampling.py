"""STEP-8 (a rollout sampled with top-k or top-p): the suite's sampler, the verdict, ppo-ref's runner
and the mutants the clause must kill."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
import torch

import ppo_ref.trainer.models as models_module
from ppo_ref.adapters.step import (
    SAMPLINGS,
    SampledRollout,
    StepBatch,
    StepResult,
    clause_not_judged,
    example_batch,
    sampled_rollout,
    sampling_convention,
    sampling_not_provided,
    sampling_problems,
    step_problems,
)
from ppo_ref.adapters.step_mine import MineStep
from ppo_ref.adapters.step_sampling import kept_set

pytest.importorskip("transformers")


def _batch() -> StepBatch:
    from conformance import test_step_tier as tier

    return example_batch(budget=tier.BUDGET, prompt_length=tier.PROMPT_LENGTH)


def test_kept_set_by_hand() -> None:
    """The hand case's distribution: top_p 0.8 keeps 0, 1, 2 (masses before them 0, 0.5, 0.75 < 0.8;
    0.9 is not); top_k 2 keeps 0, 1; both off keep all, most probable first."""
    logp = torch.tensor([0.25, 0.5, 0.10, 0.15], dtype=torch.float64).log()
    assert kept_set(logp, 0, 0.8) == (1, 0, 3)
    assert kept_set(logp, 2, 1.0) == (1, 0)
    assert kept_set(logp, 2, 0.8) == (1, 0)
    assert kept_set(logp, 0, 1.0) == (1, 0, 3, 2)
    # a cumulative mass on the boundary: kernels that find it another way could keep another set
    with pytest.raises(ValueError, match=r"^top_p: 0.75 lies within 1e-05 of a cumulative mass"):
        kept_set(logp, 0, 0.75)
    with pytest.raises(ValueError, match=r"^top_k: the log-probs on either side of the cut at 1 tie"):
        kept_set(torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64).log(), 1, 1.0)
    for top_k, top_p, name in (
        (-1, 1.0, "top_k"),
        (True, 1.0, "top_k"),
        (0, 0.0, "top_p"),
        (0, 1.5, "top_p"),
    ):
        with pytest.raises(ValueError, match=rf"^{name}: expected"):
            kept_set(logp, top_k, top_p)  # type: ignore[arg-type]


def _table_logits(batch: StepBatch) -> torch.Tensor:
    """A toy model: the same logits at every position, [0.5, 0.25, 0.15, 0.10] on ids 3..6 after a
    little mass on the special ids (pad, EOS, BOS) and the rest."""
    probs = torch.full((batch.vocab_size,), 0.002, dtype=torch.float64)
    probs[1] = 0.03  # EOS
    probs[3:7] = torch.tensor([0.45, 0.22, 0.13, 0.09], dtype=torch.float64)
    probs = probs / probs.sum()
    width = max(len(c) for c in batch.completions)
    return probs.log().expand(batch.size, width, batch.vocab_size).clone()


def test_sampled_rollout_draws_from_the_kept_set_and_reports_log_q() -> None:
    template = _batch()
    for top_k, top_p in ((0, 0.8), (3, 1.0)):
        sampled = sampled_rollout(_table_logits, template, top_k, top_p, seed=1)
        assert isinstance(sampled, SampledRollout) and sampled.batch.scores == template.scores
        logp = _table_logits(template)[0, 0]
        kept = kept_set(logp, top_k, top_p)
        mass = float(logp[list(kept)].exp().sum())
        for row, q, p, sets in zip(
            sampled.batch.completions, sampled.logprobs, sampled.full_logprobs, sampled.kept, strict=True
        ):
            assert len(row) == len(q) == len(p) == len(sets) and all(s == kept for s in sets)
            assert all(t in kept and t not in (0, 2) for t in row)  # never the pad or BOS id
            assert row[-1] == template.eos_id or len(row) == template.budget
            for token, lq, lp in zip(row, q, p, strict=True):
                assert lp == pytest.approx(float(logp[token]), abs=1e-12)
                assert lq == pytest.approx(lp - math.log(mass), abs=1e-12)
        s = sampled.padded("kept_mass")
        assert float(s[0, 0]) == pytest.approx(mass, abs=1e-12) and float(s[0, -1]) in (
            0.0,
            pytest.approx(mass),
        )
        counts = sampled.kept_counts(8)
        assert counts.shape == (8, 8) and int(counts[0, 0]) == len(kept) and int(counts[0, 7]) == 1
    with pytest.raises(
        ValueError, match=r"^logits_of: expected a \(B=8, L > 0, V=16\) tensor, got \(8, 1, 4\)"
    ):
        sampled_rollout(lambda b: torch.zeros(8, 1, 4), template, 0, 0.8)
    with pytest.raises(
        ValueError, match=r"^logits_of: expected a \(B=8, L > 0, V=16\) tensor, got \(8, 0, 16\)"
    ):
        sampled_rollout(lambda b: torch.zeros(8, 0, 16), template, 0, 0.8)
    for args, name in (((None, template, 0, 0.8), "logits_of"), ((_table_logits, None, 0, 0.8), "template")):
        with pytest.raises(ValueError, match=rf"^{name}: expected"):
            sampled_rollout(*args)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^top_p: expected"):
        sampled_rollout(_table_logits, template, 0, 0.0)
    with pytest.raises(ValueError, match=r"^name: expected logprobs"):
        sampled.padded("weights")


def test_step8_passes_on_ppo_ref_and_kills_a_correction_without_the_replayed_support(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ppo-ref's runner (convention "truncated") passes STEP-8 under top-p and top-k with weights 1;
    with the kept log-mass gone from stage 4's forward (the trainer before f32e8b0: the full softmax
    against the sampler's renormalised log-probs) the weights are the kept mass S and STEP-8 fails,
    naming the other convention."""
    from conformance import test_step_tier as tier

    runner, batch = MineStep(), _batch()
    assert step_problems(runner) == [] and sampling_convention(runner) == "truncated"
    assert clause_not_judged(runner, "STEP-8") is None
    measures: list[tuple[str, object]] = []
    for top_k, top_p in SAMPLINGS:
        tier.test_step8_correction_on_a_truncated_rollout(
            runner, batch, top_k, top_p, lambda k, v: measures.append((k, v))
        )
    assert [k for k, _ in measures] == ["step_measure", "step_measure"]
    with pytest.raises(ValueError, match=r"^sampled: expected a SampledRollout, got StepBatch"):
        runner.sampling_run(batch)  # type: ignore[arg-type]
    assert "weights: mean 1.0000" in str(measures[0][1]) and "kept mass S over" in str(measures[0][1])

    def no_replay(logits: torch.Tensor, counts: torch.Tensor, temperature: float) -> torch.Tensor:
        return torch.zeros(counts.shape, dtype=torch.float64)

    monkeypatch.setattr(models_module, "support_logmass", no_replay)
    for top_k, top_p in SAMPLINGS:
        with pytest.raises(AssertionError) as failed:
            tier.test_step8_correction_on_a_truncated_rollout(runner, batch, top_k, top_p, lambda *_: None)
        message = str(failed.value)
        assert "differ from the declared 'truncated' convention's (1)" in message
        assert "they are the other convention's: within" in message and "of S)" in message


class _FullSupport(MineStep):
    """ppo-ref's step with the replay switched off, declared as what it is: convention "full"."""

    name = "full-support"
    sampling_convention = "full"

    def sampling_run(self, sampled: SampledRollout) -> StepResult:
        original = models_module.support_logmass
        models_module.support_logmass = lambda logits, counts, t: torch.zeros(counts.shape)  # type: ignore[assignment]
        try:
            return super().sampling_run(sampled)
        finally:
            models_module.support_logmass = original


class _Bypass(MineStep):
    """The sampler's log-probs as the PPO ratio's old log-probs (verl's bypass_mode, TRL's
    AsyncGRPO): a step-0 ratio of S whatever the convention."""

    name = "bypass"

    def _rollout(self, batch: StepBatch, actor_critic: Any, config: Any, *args: Any) -> Any:
        rollout = super()._rollout(batch, actor_critic, config, *args)
        if rollout.rollout_logprobs is None:
            return rollout
        return replace(rollout, old_logprobs=rollout.rollout_logprobs * rollout.mask)


def test_step8_shows_a_declared_full_support_and_fails_a_mixed_ratio() -> None:
    """Weights equal to the kept mass pass under a declared "full" (measured and shown as the
    convention); a PPO ratio of the sampler's log-probs against a full softmax fails under any
    declaration."""
    from conformance import test_step_tier as tier

    batch = _batch()
    recorded: list[tuple[str, object]] = []
    tier.test_step8_correction_on_a_truncated_rollout(
        _FullSupport(), batch, 0, 0.8, lambda k, v: recorded.append((k, v))
    )
    declared = [v for k, v in recorded if k == "step_declared"]
    assert len(declared) == 1 and "the correction weights are the kept mass S (declared 'full'" in str(
        declared[0]
    )
    # the report turns the clause's verdict into "declared convention", with this source
    [(key, value, source)] = [v for k, v in recorded if k == "step_convention"]  # type: ignore[misc]
    assert (key, value) == ("sampling_convention", "full") and "kept mass S (TRL #6789); measured: " in source
    with pytest.raises(
        AssertionError, match=r"top_k 4, top_p 1: max \|logp - old_logp\| = .* not on one support"
    ):
        tier.test_step8_correction_on_a_truncated_rollout(_Bypass(), batch, 4, 1.0, lambda *_: None)


def test_sampling_problems_names_a_missing_output_and_a_missing_ratio() -> None:
    sampled = sampled_rollout(_table_logits, _batch(), 0, 0.8)
    result = StepResult(gradient={}, loss=0.0, stats={}, outputs={})
    problems, measure = sampling_problems(sampled, result, "full")
    assert problems[0] == "top_k 0, top_p 0.8: the runner reports no max_abs_log_ratio"
    assert "expected the output correction_weights (B=8, >= " in problems[1] and "kept mass S" in measure
    with pytest.raises(ValueError, match=r"^convention: expected one of full, truncated"):
        sampling_problems(sampled, result, "replayed")


class _NoTopP(MineStep):
    name = "no-top-p"
    sampling_convention = None  # type: ignore[assignment]
    sampling_not_provided = "test library samples without top-k / top-p (lib.py:1)"
    sampling_run = None  # type: ignore[assignment]
    policy_logits = None  # type: ignore[assignment]


def test_step8_not_provided_not_run_and_bad_declarations_are_named() -> None:
    from conformance import test_step_tier as tier

    batch = _batch()
    runner = _NoTopP()
    assert step_problems(runner) == [] and sampling_not_provided(runner) == runner.sampling_not_provided
    with pytest.raises(
        pytest.skip.Exception, match=r"^not provided: no-top-p's rollout samples without top-k"
    ):
        tier.test_step8_correction_on_a_truncated_rollout(runner, batch, 0, 0.8, lambda *_: None)

    class _Silent(MineStep):
        name = "silent"
        sampling_convention = None  # type: ignore[assignment]
        sampling_run = None  # type: ignore[assignment]
        policy_logits = None  # type: ignore[assignment]

    class _NoRun(MineStep):
        name = "no-run"
        sampling_run = None  # type: ignore[assignment]

    assert step_problems(_Silent()) == [] and step_problems(_NoRun()) == []
    assert (
        clause_not_judged(_Silent(), "STEP-8")
        == "not run: silent's runner declares no sampling_convention (spec STEP-8)"
    )
    with pytest.raises(pytest.skip.Exception, match=r"^not run: no-run's runner has no sampling_run, so"):
        tier.test_step8_correction_on_a_truncated_rollout(_NoRun(), batch, 0, 0.8, lambda *_: None)

    class _Both(_NoTopP):
        sampling_convention = "full"

    class _Unknown(MineStep):
        sampling_convention = "replayed"

    class _MethodsOnly(_Silent):
        def policy_logits(self, batch: StepBatch) -> torch.Tensor:
            raise NotImplementedError

    assert any("declared together with sampling_convention" in p for p in step_problems(_Both()))
    assert any(
        p.startswith("sampling_convention: expected one of full, truncated")
        for p in step_problems(_Unknown())
    )
    assert (
        "policy_logits: needs sampling_convention, the support the library's correction uses"
        in step_problems(_MethodsOnly())
    )
    with pytest.raises(ValueError, match=r"^runner: sampling_convention must be one of full, truncated"):
        sampling_convention(_Unknown())
    with pytest.raises(AssertionError, match="sampling_not_provided"):
        tier.test_step8_correction_on_a_truncated_rollout(_Both(), batch, 0, 0.8, lambda *_: None)


def test_completion_logits_match_the_trainer_forward() -> None:
    """The kit's ``completion_logits`` (every runner's ``policy_logits``, ppo-ref's included) give
    the log-probs of ppo-ref's stage-4 forward on the same weights: left-padded prompts, position
    ids from the mask, position t predicting completion token t; and it checks its temperature."""
    from ppo_ref.adapters.step_kit import completion_logits, padded
    from ppo_ref.trainer.data import SequenceBatch

    batch = _batch()
    runner = MineStep()
    logits = runner.policy_logits(batch)
    assert logits.shape == (batch.size, batch.budget, batch.vocab_size) and logits.dtype == torch.float64
    layout = padded(batch)
    sequences = SequenceBatch.build(
        layout.prompt_ids, layout.prompt_mask, layout.response_ids, layout.response_mask.bool()
    )
    with torch.no_grad():
        stage4 = runner._actor_critic(batch.vocab_size).response_outputs(sequences, 1.0, need_values=False)
    ours = torch.log_softmax(logits, -1).gather(-1, layout.response_ids.unsqueeze(-1)).squeeze(-1)
    mask = layout.response_mask.bool()
    torch.testing.assert_close(ours[mask], stage4.logprobs[mask].double(), rtol=0, atol=1e-12)
    model = runner._actor_critic(batch.vocab_size).policy
    torch.testing.assert_close(completion_logits(model, batch, 0.5), 2 * logits, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"^temperature: expected a number > 0"):
        completion_logits(model, batch, 0.0)
