"""Rollout correction in the trainer (issue 12, part 2): the sampler's log-probs and the weights.

The generator records each sampled token's log-probability under the distribution it sampled
from (temperature, top-k, top-p); stage 4 weighs the old log-probs against them with
``ppo_ref.rollout_correction``. With the sampler equal to the policy the weights are 1, under
top-k / top-p too (the old log-probs renormalised over the sampler's kept set, spec IS-3); with a
sampler at another temperature (``rollout_temperature``) they spread away from 1, the metrics show
it, and a small run still learns.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from tiny_task import config_choices, tiny_config, tiny_policy, tiny_setup, tiny_tokenizer

from ppo_ref import rollout_correction
from ppo_ref.trainer import PPOTrainer, TrainerConfig
from ppo_ref.trainer.data import SequenceBatch
from ppo_ref.trainer.generation import generate, left_pad, sample_from_logits, sampling_logprob
from ppo_ref.trainer.models import response_logprobs
from ppo_ref.trainer.update import correction_weights


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.7, 3, 1.0), (1.3, 0, 0.6)])
def test_the_sampling_logprob_is_the_log_of_the_sampled_frequency(
    temperature: float, top_k: int, top_p: float
) -> None:
    logits = torch.tensor([[1.5, 0.2, -0.3, 0.9, -2.0, 0.0]])
    probabilities = sampling_logprob(logits.expand(6, 6), torch.arange(6), temperature, top_k, top_p).exp()
    assert float(probabilities.sum()) == pytest.approx(1.0, abs=1e-6)  # float32 logits
    draws = 200_000
    uniforms = torch.rand(draws, generator=torch.Generator().manual_seed(0))
    tokens = sample_from_logits(logits.expand(draws, 6), uniforms, temperature, top_k, top_p)
    frequencies = torch.bincount(tokens, minlength=6).double() / draws
    assert torch.allclose(frequencies, probabilities, atol=4e-3)  # ~4 standard errors at p = 0.5
    assert torch.equal(frequencies == 0, probabilities == 0)  # never a token outside the kept set
    if top_k == 0 and top_p == 1.0:
        assert torch.allclose(probabilities.log(), torch.log_softmax(logits[0] / temperature, -1).double())


def test_generate_records_the_samplers_logprobs() -> None:
    """Without top-k/top-p the sampler's log-probs are the policy's at the sampling temperature
    (what a full forward recomputes); with top-k they are renormalised over the kept tokens, so
    never below the policy's."""
    tokenizer = tiny_tokenizer()
    policy = tiny_policy(tokenizer).eval()
    ids, mask = left_pad([[3, 4, 5], [6], [7, 8]], pad_id=0)
    noise = torch.rand(3, 6, generator=torch.Generator().manual_seed(0))
    for temperature, top_k in ((1.0, 0), (1.7, 0), (1.0, 4)):
        out = generate(
            policy,
            ids,
            mask,
            noise,
            eos_id=1,
            pad_id=0,
            temperature=temperature,
            top_k=top_k,
            return_logprobs=True,
        )
        assert out.logprobs is not None and out.logprobs.shape == out.response_ids.shape
        sequences = SequenceBatch.build(ids, mask, out.response_ids, out.response_mask)
        with torch.no_grad():
            recomputed = response_logprobs(policy, sequences, temperature).double()
        on = out.response_mask
        assert bool((out.logprobs[~on] == 0).all())
        if top_k == 0:
            assert torch.allclose(out.logprobs[on], recomputed[on], atol=1e-5)
            assert out.kept_counts is None  # nothing truncated: no kept set to replay
        else:
            assert bool((out.logprobs[on] >= recomputed[on] - 1e-6).all())
            assert out.kept_counts is not None and out.kept_counts.dtype == torch.int64
            assert bool((out.kept_counts[on] == top_k).all()) and bool((out.kept_counts[~on] == 1).all())
    assert generate(policy, ids, mask, noise, eos_id=1, pad_id=0).logprobs is None


@pytest.mark.parametrize(
    "mode", sorted(str(mode) for mode in config_choices("rollout_correction") - {"none"})
)
def test_the_weights_are_the_reference_functions(mode: str) -> None:
    generator = torch.Generator().manual_seed(0)
    old = torch.randn(3, 5, generator=generator) * 0.3 - 1.0
    rollout = old + torch.randn(3, 5, generator=generator, dtype=torch.float64) * 0.2
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[2, 3:] = False
    config = TrainerConfig(rollout_correction=mode, rollout_correction_low=0.9, rollout_correction_high=1.1)
    level, kind = mode.rsplit("-", 1)
    expected = rollout_correction(
        old,
        rollout.float(),
        mask,
        level={"geometric": "sequence-geometric"}.get(level, level),
        mode=kind,
        low=0.9,
        high=1.1,
    )
    ours = correction_weights(config, old, rollout, mask)
    assert ours.dtype == old.dtype and torch.equal(ours, expected)
    assert bool((ours != 1).any())  # the bounds bind somewhere: the test can tell the modes apart
    with pytest.raises(ValueError, match="rollout_correction is 'none'"):
        correction_weights(TrainerConfig(), old, rollout, mask)


def _weights(out_dir: Path, **overrides: object) -> torch.Tensor:
    config = tiny_config(
        out_dir, rollout_correction="token-truncate", rollout_correction_high=10.0, **overrides
    )
    rollout = PPOTrainer(config, tiny_setup()).collect_rollout(0)
    assert rollout.rollout_logprobs is not None and rollout.correction_weights is not None
    assert rollout.training_batch().correction_weights is rollout.correction_weights
    return rollout.correction_weights[rollout.mask]


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (0, 0.8), (3, 1.0), (5, 0.9)])
def test_the_weights_are_one_when_the_sampler_is_the_policy(out_dir: Path, top_k: int, top_p: float) -> None:
    """Under top-k / top-p too (spec IS-3): the sampler's log-probs are renormalised over the tokens
    it kept, the old ones over the policy's same number of most probable tokens. Weighing the full
    old log-probs instead would give each step's kept mass S (TRL #6789's pattern; ppo-ref's own
    trainer did until this test: mean 0.874 at top_p 0.8 on the reverse task)."""
    same = _weights(out_dir, top_k=top_k, top_p=top_p)
    assert float((same - 1).abs().max()) < 1e-4
    other = _weights(out_dir, top_k=top_k, top_p=top_p, rollout_temperature=1.6)
    assert float((other - 1).abs().max()) > 0.05


def test_under_top_p_the_kept_set_truncates_and_the_old_logprobs_stay_full(out_dir: Path) -> None:
    """The case above is not vacuous: top_p 0.8 drops mass at the sampled steps (the sampler's
    log-probs sit above the full ones by log S), and the old log-probs, which enter the PPO ratio,
    are the full distribution's (the step-0 ratio is 1 against the update's full forward)."""
    config = tiny_config(
        out_dir, rollout_correction="token-truncate", rollout_correction_high=10.0, top_p=0.8
    )
    trainer = PPOTrainer(config, tiny_setup())
    rollout = trainer.collect_rollout(0)
    assert rollout.rollout_logprobs is not None
    on = rollout.mask
    log_kept_mass = rollout.old_logprobs.double() - rollout.rollout_logprobs.double()
    assert float(log_kept_mass[on].max()) < 1e-5 and float(log_kept_mass[on].min()) < math.log(0.9)
    with torch.no_grad():
        full = trainer.actor_critic.response_outputs(rollout.sequences, config.temperature).logprobs
    assert torch.allclose(rollout.old_logprobs[on], full[on], atol=1e-5)


@pytest.mark.slow
def test_a_run_sampling_at_another_temperature_learns_with_the_correction(out_dir: Path) -> None:
    """The generator samples at 1.5 while the policy trains at 1.0: the logged weights spread away
    from 1 and the held-out score still climbs (measured here: -0.51 -> 0.06 in 15 iterations)."""
    config = tiny_config(
        out_dir,
        iterations=15,
        rollout_batch_size=32,
        num_minibatches=2,
        learning_rate=1e-3,
        eval_samples=64,
        rollout_correction="token-truncate",
        rollout_temperature=1.5,
    )
    summary = PPOTrainer(config, tiny_setup()).train()
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        assert record["rollout_weight_std"] > 0.01
        assert record["rollout_weight_min"] < 0.99 < record["rollout_weight_max"] <= 2.0
        assert record["rollout_weight_zero_frac"] == 0.0  # truncation never rejects
    assert summary["eval_score_final"] - summary["eval_score_initial"] > 0.3, summary
    first, last = records[0]["score_mean"], records[-1]["score_mean"]
    assert last - first > 0.3, (first, last)
