"""Stage 7: PPO epochs over reshuffled minibatches, with token-count-normalised gradient accumulation.

A minibatch's loss is one loss over all its rows, however it is split into micro-batches: each
micro-batch calls the reference losses with the whole minibatch's counts (their ``token_count`` /
``row_count`` keywords, spec AGG-2), so its loss is its share of the minibatch's and the
accumulated gradient equals the gradient of the whole minibatch's loss, for every ``loss_agg``
and policy loss (bug E4 of docs/bug-catalogue.md: a plain mean of micro-batch means weights a
1-token micro-batch like a 9-token one).

With W processes (:mod:`ppo_ref.trainer.distributed`) every process holds the whole rollout and
draws the same minibatches; process r runs forward and backward on its W-th of each minibatch's
rows, still weighted by shares of the *whole* minibatch, and its loss is scaled by the backend's
``gradient_scale`` (W, since DDP, FSDP and DeepSpeed average gradients). Statistics are summed
over processes, and every decision (skip a non-finite step, the step-0 check, early stop) is
taken on all-reduced values, so all processes take the same branch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ppo_ref import aggregate_loss, kl_loss, rollout_correction, value_loss
from ppo_ref.trainer.config import TrainerConfig
from ppo_ref.trainer.data import TrainingBatch
from ppo_ref.trainer.distributed import Collectives, LocalCollectives
from ppo_ref.trainer.estimators import WholeMinibatch, trainer_policy_loss
from ppo_ref.trainer.models import ActorCritic, NonFiniteError
from ppo_ref.trainer.seeding import Stream, stream_rng

__all__ = [
    "LogprobMismatchError",
    "MinibatchResult",
    "TooManyNonFiniteStepsError",
    "TrainingBatch",
    "UpdateStats",
    "corrected_advantages",
    "correction_weights",
    "minibatch_backward",
    "ppo_update",
]


class LogprobMismatchError(RuntimeError):
    """The first minibatch's recomputed log-probs differ from the rollout's old log-probs."""


class TooManyNonFiniteStepsError(RuntimeError):
    """More optimizer steps were skipped for non-finite values than ``max_nonfinite_steps`` allows."""


@dataclass
class MinibatchResult:
    """Statistics of one minibatch (token-weighted over its micro-batches) before its optimizer step."""

    policy_loss: float = 0.0
    value_loss: float = 0.0
    clipfrac: float = 0.0
    ratio_outside_frac: float = 0.0
    approx_kl: float = 0.0
    ratio_mean: float = 0.0
    ratio_max: float = 0.0
    max_abs_log_ratio: float = 0.0
    dual_clip_frac: float = 0.0
    kl_loss: float = 0.0
    tokens: int = 0

    _ALWAYS = ("policy_loss", "value_loss", "clipfrac", "ratio_outside_frac", "approx_kl", "ratio_mean")
    """The summed statistics every run records (:func:`ppo_update` averages them over the steps)."""
    _SUMS = (*_ALWAYS, "dual_clip_frac", "kl_loss")
    _MAXIMA = ("ratio_max", "max_abs_log_ratio")

    def combined(self, collectives: Collectives) -> MinibatchResult:
        """The minibatch's statistics over all processes (each holds shares of the whole minibatch)."""
        sums, maxima = collectives.sum_and_max(
            [getattr(self, name) for name in self._SUMS], [getattr(self, name) for name in self._MAXIMA]
        )
        result = MinibatchResult(tokens=self.tokens)
        for name, value in zip(self._SUMS + self._MAXIMA, sums + maxima, strict=True):
            setattr(result, name, float(value))
        return result


@dataclass
class UpdateStats:
    """Stage 7's statistics for one iteration, averaged over the optimizer steps taken
    (``dual_clip_frac`` only with a ``dual_clip``, ``kl_loss`` only with ``kl_in = "loss"``)."""

    policy_loss: float = math.nan
    value_loss: float = math.nan
    clipfrac: float = math.nan
    ratio_outside_frac: float = math.nan
    approx_kl: float = math.nan
    ratio_mean: float = math.nan
    ratio_max: float = math.nan
    dual_clip_frac: float | None = None
    kl_loss: float | None = None
    logprob_check_max_abs_diff: float = math.nan
    grad_norm_policy: float = math.nan
    grad_norm_critic: float = math.nan
    optimizer_steps: int = 0
    skipped_steps: int = 0
    empty_minibatches: int = 0
    early_stopped: bool = False
    minibatches: list[MinibatchResult] = field(default_factory=list)


def minibatch_backward(
    actor_critic: ActorCritic,
    batch: TrainingBatch,
    config: TrainerConfig,
    autocast: Callable[[], AbstractContextManager[object]],
    backward: Callable[[Tensor], None],
    *,
    rows: slice | None = None,
    collectives: Collectives | None = None,
    kl_coef: float = 0.0,
) -> MinibatchResult:
    """Forward and backward one minibatch in micro-batches; gradients accumulate in ``.grad``.

    ``batch`` is the whole minibatch; this process trains on ``batch.rows(rows)`` (all rows by
    default). Each micro-batch's loss is its share of the whole minibatch's loss: every reference
    loss gets the whole minibatch's counts (``token_count`` / ``row_count``, :class:`WholeMinibatch`),
    so the shares sum to the loss of one call on the whole minibatch, whatever the split (spec
    AGG-2). The loss of a micro-batch is

        policy (``config.policy_loss``, ``loss_agg``; advantages times the rollout-correction weights)
        + vf_coef * value_loss (token-mean; only with a critic)
        + kl_coef * kl_loss(``kl_loss_estimator``, ``loss_agg``) (only with ``kl_in = "loss"``)
        - entropy_coef * token-mean entropy,

    times ``collectives.gradient_scale``. A minibatch without any action token returns
    ``tokens=0`` and does nothing. Raises :class:`NonFiniteError` if a forward pass or the loss is
    not finite on any process (every process then raises, before its backward, so the caller
    skips the step). No optimizer step is taken here. The statistics returned are this process's
    shares; :meth:`MinibatchResult.combined` sums them over processes.
    """
    collectives = collectives or LocalCollectives()
    # The normalisers of the whole minibatch (every process holds all of its rows).
    whole = WholeMinibatch.of(batch.mask)
    result = MinibatchResult(tokens=int(whole.tokens))
    if result.tokens == 0:
        return result
    kl_in_loss = config.uses_kl_loss  # no term when kl_coef is 0
    if kl_in_loss and batch.ref_logprobs is None:
        raise ValueError("batch: kl_in = 'loss' needs the reference log-probs (batch.ref_logprobs)")
    aggregation = whole.keywords(config.loss_agg, config.loss_norm_constant)
    mine = batch if rows is None else batch.rows(rows)
    micro = config.micro_batch_size or max(mine.size, 1)
    loss_function = trainer_policy_loss(config)
    for start in range(0, mine.size, micro):
        part = mine.rows(slice(start, start + micro))
        problem: NonFiniteError | None = None
        kl_term: Tensor | None = None
        try:
            with autocast():
                outputs = actor_critic.response_outputs(
                    part.sequences,
                    config.temperature,
                    need_values=config.uses_critic,
                    need_entropy=config.entropy_coef > 0,
                )
            advantages = corrected_advantages(part)
            policy = loss_function(outputs.logprobs, part.old_logprobs, advantages, part.mask, config, whole)
            loss = policy.loss
            values = None
            if outputs.values is not None:  # a critic-free run has no value loss
                values = value_loss(
                    outputs.values,
                    part.old_values,
                    part.returns,
                    part.mask,
                    config.value_clip_eps,
                    token_count=whole.tokens,
                )
                loss = loss + config.vf_coef * values
            if kl_in_loss:
                assert part.ref_logprobs is not None
                kl_term = kl_loss(
                    outputs.logprobs,
                    part.ref_logprobs,
                    part.mask,
                    config.kl_loss_estimator or "k3",
                    config.loss_agg,
                    **aggregation,
                )
                loss = loss + kl_coef * kl_term
            if outputs.entropy is not None:
                bonus = aggregate_loss(outputs.entropy, part.mask, token_count=whole.tokens)
                loss = loss - config.entropy_coef * bonus
            if not bool(torch.isfinite(loss)):
                problem = NonFiniteError(f"non-finite loss {float(loss)} in a micro-batch")
        except NonFiniteError as error:
            problem = error
        if not collectives.all_true(problem is None):
            raise problem or NonFiniteError("non-finite values in another process's micro-batch")
        backward(loss * collectives.gradient_scale if collectives.gradient_scale != 1.0 else loss)
        with torch.no_grad():
            log_ratio = torch.where(part.mask, outputs.logprobs - part.old_logprobs, 0.0).abs().amax()
            weight = float(part.mask.sum() / whole.tokens)  # this micro-batch's share of the tokens
            result.policy_loss += float(policy.loss)
            result.value_loss += math.nan if values is None else float(values)
            result.kl_loss += math.nan if kl_term is None else float(kl_term)
            result.clipfrac += weight * float(policy.clipfrac)
            result.ratio_outside_frac += weight * float(policy.ratio_outside_frac)
            result.dual_clip_frac += weight * float(policy.dual_clip_frac)
            result.approx_kl += weight * float(policy.approx_kl)
            result.ratio_mean += weight * float(policy.ratio_mean)
            result.ratio_max = max(result.ratio_max, float(policy.ratio_max))
            result.max_abs_log_ratio = max(result.max_abs_log_ratio, float(log_ratio))
    return result


def corrected_advantages(batch: TrainingBatch) -> Tensor:
    """The advantages the policy loss sees: ``advantages * correction_weights`` with a rollout
    correction, else the advantages themselves.

    The rollout correction multiplies each token's policy objective by its weight ``w >= 0``
    (ppo_ref.rollout_correction). Every policy loss of the table is positively homogeneous in the
    advantage for a fixed ratio: ``min(r (wA), clip(r) (wA)) = w min(rA, clip(r)A)``, the dual
    clip's ``max(., c wA) = w max(., cA)``, CISPO's ``-sg[clip r] (wA) log p`` and GSPO's per-row
    ``min(s wA, clip(s) wA)`` (one weight per row at a sequence level); so weighting the
    advantages is weighting the per-token losses, and the reference functions stay as they are.
    Example: advantages ``[[1.0, -2.0]]`` and weights ``[[0.5, 2.0]]`` give ``[[0.5, -4.0]]``.
    """
    if batch.correction_weights is None:
        return batch.advantages
    return batch.advantages * batch.correction_weights.to(batch.advantages.dtype)


def correction_weights(
    config: TrainerConfig,
    old_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    kept_logmass: Tensor | None = None,
) -> Tensor:
    """(B, N) ``ppo_ref.rollout_correction`` weights of the old log-probs (the trained policy at
    ``temperature``) against the sampler's ``rollout_logprobs``, with the config's level
    (``token``, ``sequence``, ``geometric`` = ``sequence-geometric``), mode and bounds; in the
    old log-probs' dtype, 0 off the mask. Example: ``token-truncate`` with high 2 and log-probs
    ``log 0.9`` (old) vs ``log 0.3`` (sampler) gives ``min(3, 2) = 2``.

    Under top-k / top-p the sampler's log-probs are renormalised over the tokens it kept; with
    ``kept_logmass`` (B, N), the old policy's log-mass on the same number of most probable tokens
    (``ResponseOutputs.kept_logmass``), the old log-probs are renormalised over that support first,
    so the weights are 1 where the two policies agree (spec IS-3, STEP-8), not the kept mass S.
    """
    if config.rollout_correction == "none":
        raise ValueError("config: rollout_correction is 'none' (no weights to compute)")
    if kept_logmass is not None:
        old_logprobs = old_logprobs - kept_logmass
    level, mode = config.rollout_correction.rsplit("-", 1)
    weights = rollout_correction(
        old_logprobs,
        rollout_logprobs.to(old_logprobs.dtype),
        mask,
        level="sequence-geometric" if level == "geometric" else level,
        mode=mode,
        high=config.rollout_correction_high,
        low=config.rollout_correction_low,
    )
    return weights.to(old_logprobs.dtype)


def _mismatch_message(diff: float, tolerance: float) -> str:
    return (
        f"log-probs recomputed at the first minibatch, before any update, differ from the rollout's "
        f"old log-probs by up to {diff:.3g} nats (tolerance {tolerance:g}); the step-0 ratio must be 1. "
        "Likely causes: dropout active in the policy (a dropout layer with p > 0 or a model in train "
        "mode); the sampling temperature not applied to both (logits / temperature for old and new "
        "log-probs); padding or position ids (position ids must be cumsum(attention_mask) - 1 in every "
        "forward, with left-padded prompts); or batch-composition noise in low precision (raise "
        "logprob_check_tolerance)."
    )


def ppo_update(
    actor_critic: ActorCritic,
    optimizer: torch.optim.Optimizer,
    batch: TrainingBatch,
    config: TrainerConfig,
    iteration: int,
    *,
    autocast: Callable[[], AbstractContextManager[object]],
    backward: Callable[[Tensor], None],
    clip_grad_norm: Callable[[list[torch.nn.Parameter], float], Tensor],
    logprob_tolerance: float,
    nonfinite_steps_so_far: int = 0,
    collectives: Collectives | None = None,
    kl_coef: float = 0.0,
) -> UpdateStats:
    """Run the PPO epochs of one iteration; return their statistics.

    Each epoch reshuffles the rollout rows (keyed by seed, iteration and epoch) and takes one
    optimizer step per minibatch. The first minibatch is checked for the step-0 identity; a step
    with non-finite values is skipped and counted, and the run stops (raises) once more than
    ``config.max_nonfinite_steps`` were skipped. A minibatch without action tokens (every sample
    in it skipped for a bad score) takes no step. With ``target_approx_kl`` the epochs stop after a
    minibatch whose approx-KL to the rollout policy exceeds it. ``batch`` is the whole rollout;
    with several processes (``collectives``), each trains on its share of every minibatch.
    ``kl_coef`` weighs the KL loss of ``kl_in = "loss"`` (the rollout's KL coefficient).
    """
    collectives = collectives or LocalCollectives()
    stats = UpdateStats()
    max_norm = config.max_grad_norm if config.max_grad_norm is not None else math.inf
    policy_norms: list[float] = []
    critic_norms: list[float] = []
    size = config.minibatch_size
    if size % collectives.world_size != 0:
        raise ValueError(
            f"config: a minibatch of {size} rows cannot be split evenly over {collectives.world_size} "
            "processes (rollout_batch_size / num_minibatches must be a multiple of the process count)"
        )
    share = size // collectives.world_size
    mine = slice(collectives.rank * share, (collectives.rank + 1) * share)
    checked = False
    for epoch in range(config.ppo_epochs):
        order = torch.from_numpy(
            stream_rng(config.seed, Stream.SHUFFLE, iteration, epoch).permutation(batch.size)
        )
        for start in range(0, batch.size, size):
            rows = order[start : start + size].to(batch.mask.device)
            try:
                result = minibatch_backward(
                    actor_critic,
                    batch.rows(rows),
                    config,
                    autocast,
                    backward,
                    rows=mine,
                    collectives=collectives,
                    kl_coef=kl_coef,
                )
                if result.tokens == 0:
                    stats.empty_minibatches += 1
                    continue
                result = result.combined(collectives)
                if not checked:
                    checked = True
                    stats.logprob_check_max_abs_diff = result.max_abs_log_ratio
                    if not result.max_abs_log_ratio <= logprob_tolerance:
                        raise LogprobMismatchError(
                            _mismatch_message(result.max_abs_log_ratio, logprob_tolerance)
                        )
                # Read after the backward: FSDP2 registers its unsharded parameters on the modules
                # while they are gathered (the root's stay gathered after a no-grad forward, such as
                # the rollout's), and the sharded ones, which hold the gradients, after the backward.
                policy_params = actor_critic.policy_parameters()
                critic_params = actor_critic.critic_parameters()
                policy_norm = float(clip_grad_norm(policy_params, max_norm))
                # A critic-free run has no critic parameters: its critic norm is NaN (null in metrics).
                critic_norm = float(clip_grad_norm(critic_params, max_norm)) if critic_params else math.nan
                if not (math.isfinite(policy_norm) and (math.isfinite(critic_norm) or not critic_params)):
                    raise NonFiniteError("non-finite gradient norm")
            except NonFiniteError as error:
                optimizer.zero_grad(set_to_none=True)
                stats.skipped_steps += 1
                if nonfinite_steps_so_far + stats.skipped_steps > config.max_nonfinite_steps:
                    raise TooManyNonFiniteStepsError(
                        f"{nonfinite_steps_so_far + stats.skipped_steps} optimizer steps skipped for "
                        f"non-finite values (max_nonfinite_steps={config.max_nonfinite_steps}); last: {error}"
                    ) from error
                continue
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            stats.optimizer_steps += 1
            stats.minibatches.append(result)
            policy_norms.append(policy_norm)
            critic_norms.append(critic_norm)
            if config.target_approx_kl is not None and result.approx_kl > config.target_approx_kl:
                stats.early_stopped = True
                break
        if stats.early_stopped:
            break
    done = stats.minibatches
    if done:
        for name in MinibatchResult._ALWAYS:
            setattr(stats, name, sum(getattr(m, name) for m in done) / len(done))
        # The optional terms' statistics exist only in runs that use them.
        if config.dual_clip is not None:
            stats.dual_clip_frac = sum(m.dual_clip_frac for m in done) / len(done)
        if config.uses_kl_loss:
            stats.kl_loss = sum(m.kl_loss for m in done) / len(done)
        stats.ratio_max = max(m.ratio_max for m in done)
        stats.grad_norm_policy = sum(policy_norms) / len(policy_norms)
        stats.grad_norm_critic = sum(critic_norms) / len(critic_norms)
    return stats
