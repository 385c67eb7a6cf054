"""Stages 1-7 of an iteration, and the held-out evaluation, as functions of the run's
:class:`~ppo_ref.trainer.build.TrainerState` and the data types of :mod:`ppo_ref.trainer.data`.

    1. sample prompts            2. generate responses          3. score them
    4. old log-probs, reference log-probs and values (no-grad forwards)
    5. token rewards (KL penalty on every action token, score on the last)
    6. advantages by the run's estimator (:mod:`ppo_ref.trainer.estimators`; GAE by default),
       on the whole (gathered) batch, then whitened over all its action tokens if the estimator
       says so (GAE, REINFORCE++; the group estimators GRPO, Dr. GRPO and RLOO are not)
    7. PPO epochs over reshuffled minibatches (:mod:`ppo_ref.trainer.update`)

All PPO math is a call to a ppo_ref reference function; this module only moves tensors between
them. Every random draw is keyed by (seed, stream, iteration, global sample index): see
:mod:`ppo_ref.trainer.seeding`. With several processes each one generates, scores and forwards its
rows of the batch, and everything batch-wide is computed on the gathered batch: see
:mod:`ppo_ref.trainer.distributed`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ppo_ref import kl_penalty, masked_whiten, token_rewards
from ppo_ref.trainer.build import TrainerState
from ppo_ref.trainer.data import EvalResult, Rollout, ScoredBatch, SequenceBatch
from ppo_ref.trainer.estimators import advantage_estimator
from ppo_ref.trainer.generation import generate, left_pad
from ppo_ref.trainer.metrics import well_formed_rate
from ppo_ref.trainer.models import ResponseOutputs, parameter_dtype, parameter_fingerprint, response_logprobs
from ppo_ref.trainer.rollout import gather_rollout
from ppo_ref.trainer.scoring import Scorer, apply_missing_eos_rule, check_scores
from ppo_ref.trainer.seeding import Stream, sampling_uniforms, stream_rng
from ppo_ref.trainer.update import UpdateStats, correction_weights, ppo_update

__all__ = [
    "Clock",
    "ReferenceModelChangedError",
    "check_reference_unchanged",
    "collect_rollout",
    "evaluate",
    "update",
]


class ReferenceModelChangedError(RuntimeError):
    """The frozen reference policy's parameters changed during training."""


def collect_rollout(state: TrainerState, iteration: int, timings: dict[str, float] | None = None) -> Rollout:
    """Stages 1-6: sample prompts, generate, score, forward, token rewards, advantages."""
    config = state.config
    clock = Clock(state.device, timings)

    # 1. Sample prompts (keyed by seed and iteration; without replacement when there are enough),
    #    rollout_batch_size / group_size of them, each group_size times in consecutive rows.
    #    Every process draws the same batch and takes its block of rows, left-padded to the
    #    width of the whole batch.
    count = config.rollout_batch_size
    distinct = count // config.group_size
    chosen = stream_rng(config.seed, Stream.PROMPTS, iteration).choice(
        len(state.train_prompt_ids), size=distinct, replace=len(state.train_prompt_ids) < distinct
    )
    if config.group_size > 1:
        chosen = np.repeat(chosen, config.group_size)
    sample_index, prompts, prompt_ids, prompt_mask = _my_prompts(
        state, chosen, state.setup.train_prompts, state.train_prompt_ids, "rollout_batch_size"
    )
    clock.lap("seconds_prompts")

    # 2. Generate responses (per-sample noise; stop at the first EOS; mask from the first EOS).
    uniforms = sampling_uniforms(config.seed, Stream.SAMPLING, iteration, sample_index, config.max_new_tokens)
    #    At sampling_temperature (rollout_temperature, else temperature); a rollout correction
    #    also records each sampled token's log-prob under the sampler's distribution, and so does
    #    a sampler whose log-probs are the old log-probs (see 4).
    from_sampler = config.old_logprobs_from_sampler and state.autocast_dtype is None
    sequences, ended, responses, rollout_logprobs, sampler_entropy, kept_counts = _generate(
        state,
        prompt_ids,
        prompt_mask,
        uniforms,
        config.sampling_temperature,
        with_logprobs=config.rollout_correction != "none" or from_sampler,
        with_entropy=from_sampler,
    )
    clock.lap("seconds_generate")

    # 3. Score (reward model at the last real token, or a rule), check every score, then the
    #    missing-EOS rule. A bad score stops the run, or (on_bad_score = "skip") its sample
    #    becomes invalid: no action token, so it trains nothing and enters no statistic.
    scored, valid = _score(state, state.train_scorer, prompts, responses, sequences, ended, sample_index)
    clock.lap("seconds_score")

    # 4. Old log-probs, entropies and values (policy in eval mode, logits / temperature; values
    #    only with a critic: a critic-free run has no value model, and its rollout holds zeros),
    #    reference log-probs (only when a KL term can be nonzero: kl_coef > 0 or adaptive).
    #    When the sampler drew from the trained distribution itself (config.old_logprobs_from_sampler:
    #    no critic, temperature, no top-k/top-p, one minibatch, no bf16) its log-probs and entropies
    #    are the old ones and the policy's no-grad forward is skipped; stage 7's step-0 check then
    #    recomputes every action token's log-prob with the update's forward and stops the run if it
    #    differs from the sampler's by more than the tolerance.
    if from_sampler:
        assert rollout_logprobs is not None and sampler_entropy is not None
        wide = parameter_dtype(state.actor_critic.policy) == torch.float64
        dtype = torch.float64 if wide else torch.float32  # the forward's dtype (at least float32)
        outputs = ResponseOutputs(rollout_logprobs.to(dtype), None, None, sampler_entropy.to(dtype))
        rollout_logprobs = None  # the old log-probs themselves, not a correction's rollout log-probs
    else:
        outputs = _forward_no_grad(
            state, sequences, config.temperature, need_values=config.uses_critic, kept_counts=kept_counts
        )
    ref_logprobs = None
    if config.uses_reference_forward:
        ref_logprobs = _reference_logprobs(state, sequences, config.temperature)
    assert outputs.entropy is not None
    values, bootstrap_values = outputs.values, outputs.bootstrap_values
    if values is None or bootstrap_values is None:
        values, bootstrap_values = torch.zeros_like(outputs.logprobs), outputs.logprobs.new_zeros(len(ended))
    clock.lap("seconds_forward")

    # 5. Token rewards: -kl_coef * KL on every action token, the score on the last one (with
    #    kl_in = "loss" the score alone: the KL is in stage 7's loss instead).
    mask = sequences.response_mask & valid.to(state.device).unsqueeze(1)
    scores = scored.scores.to(state.device)
    kl_coef = state.kl_controller.value
    kl = None  # without a reference forward (kl_coef 0, fixed): no KL, and no KL term anywhere
    if ref_logprobs is not None:
        kl = kl_penalty(outputs.logprobs, ref_logprobs, config.kl_estimator, mask=sequences.response_mask)
    reward_kl_coef = kl_coef if config.kl_in == "reward" and ref_logprobs is not None else 0.0
    reference = outputs.logprobs if ref_logprobs is None else ref_logprobs  # a zero KL when there is none
    rewards = token_rewards(scores, outputs.logprobs, reference, mask, reward_kl_coef, config.kl_estimator)
    # 5c. Rollout correction: the old log-probs against the sampler's. Under top-k / top-p the
    #     sampler's are renormalised over the tokens it kept, so the old ones are too, over the
    #     same number of most probable tokens (spec IS-3: the weights are 1 where the two policies
    #     agree on that support, not the kept mass S); the old log-probs themselves stay full.
    weights = None
    if rollout_logprobs is not None:
        weights = correction_weights(config, outputs.logprobs, rollout_logprobs, mask, outputs.kept_logmass)

    local = Rollout(
        iteration=iteration,
        sample_index=sample_index,
        prompts=prompts,
        responses=responses,
        sequences=sequences,
        ended=ended,
        valid=valid.to(state.device),
        scored=scored,
        old_logprobs=outputs.logprobs,
        ref_logprobs=ref_logprobs,
        values=values,
        bootstrap_values=bootstrap_values,
        entropy=outputs.entropy,
        kl_coef=kl_coef,
        kl=kl,
        rewards=rewards,
        raw_advantages=torch.zeros_like(rewards),  # filled by stage 6 below
        returns=torch.zeros_like(rewards),
        advantages=torch.zeros_like(rewards),
        rollout_logprobs=rollout_logprobs,
        correction_weights=weights,
    )
    # From here on every process holds the whole batch.
    rollout = gather_rollout(state.parallel, local, state.pad_id)

    # 5b. The KL controller sees the mean per-sequence summed KL of the batch (kl is 0 off the mask).
    if rollout.kl is not None:
        state.kl_controller.update(float(rollout.kl.sum(dim=1).mean()), n_steps=count)

    # 6a. Advantages and returns by the run's estimator (ppo_ref.trainer.estimators; "gae":
    #     terminal, or bootstrapped from the critic for responses cut at max length; the group
    #     estimators: groups keyed by prompt), on the whole batch, so that a group whose rows
    #     several processes generated is one group.
    estimator = advantage_estimator(config)
    raw_advantages, returns = estimator(rollout, config)
    rollout = replace(rollout, raw_advantages=raw_advantages, returns=returns, advantages=raw_advantages)

    # 6b. Advantages whitened over all action tokens of the batch (if the estimator whitens);
    #     returns stay raw.
    if estimator.whiten:
        if int(rollout.mask.sum()) < 2:
            raise ValueError(
                f"iteration {iteration}: fewer than 2 action tokens left to whiten "
                f"({int((~rollout.valid).sum())} of {count} samples skipped for bad scores)"
            )
        rollout = replace(rollout, advantages=masked_whiten(raw_advantages, rollout.mask))
    clock.lap("seconds_advantages")
    return rollout


def _score(
    state: TrainerState,
    scorer: Scorer,
    prompts: Sequence[str],
    responses: Sequence[str],
    sequences: SequenceBatch,
    ended: Tensor,
    sample_index: Tensor,
) -> tuple[ScoredBatch, Tensor]:
    """Stage 3 for this process's rows: ``(scored, valid)``; scores are 0 where not valid."""
    config = state.config
    raw = scorer(prompts, responses, sequences, ended.cpu())
    checked, valid = check_scores(raw, prompts, responses, sample_index.tolist(), config.on_bad_score)
    zero = torch.zeros((), dtype=checked.dtype)
    adjusted = apply_missing_eos_rule(
        torch.where(valid, checked, zero),
        ended.cpu(),
        config.missing_eos,
        config.missing_eos_penalty,
        config.missing_eos_score,
    )
    scored = ScoredBatch(
        raw=checked,
        adjustment=torch.where(valid, adjusted.adjustment, zero),
        scores=torch.where(valid, adjusted.scores, zero),
    )
    return scored, valid


def _generate(
    state: TrainerState,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    uniforms: Tensor,
    temperature: float,
    top: bool = True,
    with_logprobs: bool = False,
    with_entropy: bool = False,
) -> tuple[SequenceBatch, Tensor, list[str], Tensor | None, Tensor | None, Tensor | None]:
    """Stage 2 for a batch: ``(sequences, ended, response texts without EOS, sampler log-probs,
    sampler entropies, kept counts)``; the log-probs (B, N) only ``with_logprobs``, the entropies
    (B, N) only ``with_entropy``, the kept counts (B, N) only ``with_logprobs`` under top-k / top-p
    (else None)."""
    config = state.config
    uniforms = uniforms.to(state.device)
    # With several processes, each keeps sampling until every process's rows have ended.
    all_ended = state.parallel.all_true if state.parallel.world_size > 1 else None
    pieces = state.in_chunks(
        prompt_ids.shape[0],
        lambda rows: generate(
            state.actor_critic.policy_caller(),
            prompt_ids[rows],
            prompt_mask[rows],
            uniforms[rows],
            eos_id=state.eos_id,
            pad_id=state.pad_id,
            temperature=temperature,
            top_k=config.top_k if top else 0,
            top_p=config.top_p if top else 1.0,
            all_ended=all_ended,
            return_logprobs=with_logprobs,
            return_entropy=with_entropy,
            inference_mode=not state.parallel.sharded_parameters,
            sampler=config.sampler,
        ),
    )
    width = max(p.response_ids.shape[1] for p in pieces)
    response_ids = torch.cat([_pad_right(p.response_ids, width, state.pad_id) for p in pieces])
    response_mask = torch.cat([_pad_right(p.response_mask, width, False) for p in pieces])
    ended = torch.cat([p.ended for p in pieces])
    sequences = SequenceBatch.build(prompt_ids, prompt_mask, response_ids, response_mask)
    lengths = response_mask.sum(dim=1) - ended.long()  # tokens before the EOS
    rows_without_eos = [row[:n] for row, n in zip(response_ids.tolist(), lengths.tolist(), strict=True)]
    sampled = None
    if with_logprobs:
        sampled = torch.cat([_pad_right(p.logprobs, width, 0) for p in pieces if p.logprobs is not None])
    spread = None
    if with_entropy:
        spread = torch.cat([_pad_right(p.entropy, width, 0) for p in pieces if p.entropy is not None])
    kept = None
    if pieces[0].kept_counts is not None:  # 1 past a row's end, as generate leaves it after EOS
        kept = torch.cat([_pad_right(p.kept_counts, width, 1) for p in pieces if p.kept_counts is not None])
    return sequences, ended, state.tokenizer.batch_decode(rows_without_eos), sampled, spread, kept


@torch.no_grad()
def _forward_no_grad(
    state: TrainerState,
    sequences: SequenceBatch,
    temperature: float,
    *,
    need_values: bool,
    need_entropy: bool = True,
    kept_counts: Tensor | None = None,
) -> ResponseOutputs:
    """Stage 4 for the policy (and critic, entropies; with ``kept_counts`` the log-mass on each
    step's kept set), in chunks of ``forward_batch_size`` rows."""
    parts = state.in_chunks(
        sequences.input_ids.shape[0],
        lambda rows: state.actor_critic.response_outputs(
            sequences.rows(rows),
            temperature,
            need_values=need_values,
            need_entropy=need_entropy,
            kept_counts=None if kept_counts is None else kept_counts[rows],
        ),
    )
    values = [p.values for p in parts]
    boots = [p.bootstrap_values for p in parts]
    entropies = [p.entropy for p in parts]
    return ResponseOutputs(
        logprobs=torch.cat([p.logprobs for p in parts]),
        values=torch.cat(values) if all(v is not None for v in values) else None,  # type: ignore[arg-type]
        bootstrap_values=torch.cat(boots) if all(b is not None for b in boots) else None,  # type: ignore[arg-type]
        entropy=torch.cat(entropies) if all(e is not None for e in entropies) else None,  # type: ignore[arg-type]
        kept_logmass=None if kept_counts is None else torch.cat([p.kept_logmass for p in parts]),  # type: ignore[misc]
    )


@torch.no_grad()
def _reference_logprobs(state: TrainerState, sequences: SequenceBatch, temperature: float) -> Tensor:
    parts = state.in_chunks(
        sequences.input_ids.shape[0],
        lambda rows: response_logprobs(state.reference, sequences.rows(rows), temperature),
    )
    return torch.cat(parts)


def _my_prompts(
    state: TrainerState, chosen: Any, texts: Sequence[str], encoded: Sequence[list[int]], what: str
) -> tuple[Tensor, list[str], Tensor, Tensor]:
    """Stage 1's layout, for training and evaluation: this process's block of the ``chosen``
    prompts as ``(sample_index, texts, prompt_ids, prompt_mask)``, left-padded to the width of
    the whole batch (every process draws the same batch and takes its block of rows)."""
    count = len(chosen)
    mine = state.parallel.rows(count, what)
    sample_index = torch.arange(count)[mine]
    prompts = [texts[i] for i in chosen[mine]]
    width = max(len(encoded[i]) for i in chosen)
    prompt_ids, prompt_mask = left_pad([encoded[i] for i in chosen[mine]], state.pad_id, state.device, width)
    return sample_index, prompts, prompt_ids, prompt_mask


def update(state: TrainerState, rollout: Rollout, nonfinite_steps_so_far: int) -> UpdateStats:
    """Stage 7: the PPO epochs on this rollout (raises on a failed step-0 check; more than
    ``max_nonfinite_steps`` skipped steps in the run, ``nonfinite_steps_so_far`` before it, raise)."""
    stats = ppo_update(
        state.actor_critic,
        state.optimizer,
        rollout.training_batch(),
        state.config,
        rollout.iteration,
        autocast=state.autocast,
        backward=state.accelerator.backward,
        clip_grad_norm=state.clip_grad_norm,
        logprob_tolerance=state.logprob_tolerance,
        nonfinite_steps_so_far=nonfinite_steps_so_far,
        collectives=state.parallel,
        kl_coef=rollout.kl_coef,
    )
    return stats


def check_reference_unchanged(state: TrainerState) -> None:
    """Raise if the frozen reference's parameters differ from their initial fingerprint."""
    if not torch.equal(parameter_fingerprint(state.reference), state.reference_fingerprint):
        raise ReferenceModelChangedError(
            "the reference model's parameters changed during training; it must stay the frozen initial policy"
        )


@torch.no_grad()
def evaluate(state: TrainerState) -> EvalResult:
    """Score ``eval_samples`` responses sampled at temperature 1 from the held-out prompts.

    Prompt i is ``eval_prompts[i % len]``; its noise is keyed by the evaluation stream, never
    the training one, so the initial and final evaluations see the same prompts and noise.
    With several processes each evaluates its block of the samples.
    """
    config = state.config
    count = config.eval_samples
    chosen = [i % len(state.eval_prompt_ids) for i in range(count)]
    sample_index, prompts, prompt_ids, prompt_mask = _my_prompts(
        state, chosen, state.setup.eval_prompts, state.eval_prompt_ids, "eval_samples"
    )
    uniforms = sampling_uniforms(config.seed, Stream.EVAL_SAMPLING, 0, sample_index, config.max_new_tokens)
    sequences, ended, responses, _, _, _ = _generate(state, prompt_ids, prompt_mask, uniforms, 1.0, top=False)
    scored, valid = _score(state, state.eval_scorer, prompts, responses, sequences, ended, sample_index)
    logprobs = _forward_no_grad(state, sequences, 1.0, need_values=False, need_entropy=False).logprobs
    ref_logprobs = _reference_logprobs(state, sequences, 1.0)
    kl = kl_penalty(logprobs, ref_logprobs, config.kl_estimator, mask=sequences.response_mask)
    rows = state.parallel.gather_rows
    scores, valid, ended = rows(scored.scores), rows(valid), rows(ended.cpu())
    kl_sums = rows(kl.sum(dim=1).cpu())
    prompts, responses = state.parallel.gather_list(prompts), state.parallel.gather_list(responses)
    return EvalResult(
        score=float(scores[valid].mean()) if bool(valid.any()) else math.nan,
        kl_ref=float(kl_sums.mean()),
        well_formed_rate=well_formed_rate(state.setup.well_formed, prompts, responses, ended),
        eos_rate=float(ended.float().mean()),
        samples=count,
        skipped_samples=int((~valid).sum()),
    )


class Clock:
    """Stage timer: ``lap(name)`` stores the seconds since the previous lap (device-synchronised)."""

    def __init__(self, device: torch.device, timings: dict[str, float] | None) -> None:
        self.device = device
        self.timings = timings
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.timings is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.timings[name] = now - self.last
        self.last = now


def _pad_right(tensor: Tensor, width: int, value: int | bool) -> Tensor:
    if tensor.shape[1] == width:
        return tensor
    fill = torch.full(
        (tensor.shape[0], width - tensor.shape[1]), value, dtype=tensor.dtype, device=tensor.device
    )
    return torch.cat([tensor, fill], dim=1)
