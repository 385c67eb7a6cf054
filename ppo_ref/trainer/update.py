"""Stage 7: PPO epochs over reshuffled minibatches, with token-count-normalised gradient accumulation.

A minibatch's loss is one token-mean over all its action tokens, however it is split into
micro-batches: each micro-batch's token-mean loss is weighted by its share of the minibatch's
tokens (its share of rows for the ``seq-mean-*`` policy-loss aggregations), so the accumulated
gradient equals the gradient of the whole minibatch's loss (bug E4 of docs/bug-catalogue.md: a plain mean of
micro-batch means weights a 1-token micro-batch like a 9-token one).

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

from ppo_ref import masked_mean, value_loss
from ppo_ref.trainer.config import TrainerConfig
from ppo_ref.trainer.data import TrainingBatch
from ppo_ref.trainer.distributed import Collectives, LocalCollectives
from ppo_ref.trainer.estimators import trainer_policy_loss
from ppo_ref.trainer.models import ActorCritic, NonFiniteError
from ppo_ref.trainer.seeding import Stream, stream_rng

__all__ = [
    "LogprobMismatchError",
    "MinibatchResult",
    "TooManyNonFiniteStepsError",
    "TrainingBatch",
    "UpdateStats",
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
    tokens: int = 0

    _SUMS = ("policy_loss", "value_loss", "clipfrac", "ratio_outside_frac", "approx_kl", "ratio_mean")
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
    """Stage 7's statistics for one iteration, averaged over the optimizer steps taken."""

    policy_loss: float = math.nan
    value_loss: float = math.nan
    clipfrac: float = math.nan
    ratio_outside_frac: float = math.nan
    approx_kl: float = math.nan
    ratio_mean: float = math.nan
    ratio_max: float = math.nan
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
) -> MinibatchResult:
    """Forward and backward one minibatch in micro-batches; gradients accumulate in ``.grad``.

    ``batch`` is the whole minibatch; this process trains on ``batch.rows(rows)`` (all rows by
    default), weighting each micro-batch by its share of the whole minibatch's tokens (rows for
    ``seq-mean-*``), times ``collectives.gradient_scale``. A minibatch without any action token
    returns ``tokens=0`` and does nothing. Raises :class:`NonFiniteError` if a forward pass or the
    loss is not finite on any process (every process then raises, before its backward, so the
    caller skips the step). No optimizer step is taken here. The statistics returned are this
    process's shares; :meth:`MinibatchResult.combined` sums them over processes.
    """
    collectives = collectives or LocalCollectives()
    # The normalisers of the whole minibatch (every process holds all of its rows).
    total_tokens = batch.mask.sum()
    total_rows = batch.mask.any(dim=1).sum()
    result = MinibatchResult(tokens=int(total_tokens))
    if result.tokens == 0:
        return result
    mine = batch if rows is None else batch.rows(rows)
    micro = config.micro_batch_size or max(mine.size, 1)
    loss_function = trainer_policy_loss(config)
    for start in range(0, mine.size, micro):
        part = mine.rows(slice(start, start + micro))
        problem: NonFiniteError | None = None
        try:
            with autocast():
                outputs = actor_critic.response_outputs(
                    part.sequences,
                    config.temperature,
                    need_values=config.uses_critic,
                    need_entropy=config.entropy_coef > 0,
                )
            token_weight = part.mask.sum() / total_tokens
            row_weight = part.mask.any(dim=1).sum() / total_rows
            policy = loss_function(outputs.logprobs, part.old_logprobs, part.advantages, part.mask, config)
            values = (  # a critic-free run has no value loss
                torch.zeros(())
                if outputs.values is None
                else value_loss(
                    outputs.values, part.old_values, part.returns, part.mask, config.value_clip_eps
                )
            )
            policy_weight = token_weight if config.loss_agg == "token-mean" else row_weight
            loss = policy_weight * policy.loss + config.vf_coef * token_weight * values
            if outputs.entropy is not None:
                loss = loss - config.entropy_coef * token_weight * masked_mean(outputs.entropy, part.mask)
            if not bool(torch.isfinite(loss)):
                problem = NonFiniteError(f"non-finite loss {float(loss)} in a micro-batch")
        except NonFiniteError as error:
            problem = error
        if not collectives.all_true(problem is None):
            raise problem or NonFiniteError("non-finite values in another process's micro-batch")
        backward(loss * collectives.gradient_scale if collectives.gradient_scale != 1.0 else loss)
        with torch.no_grad():
            log_ratio = torch.where(part.mask, outputs.logprobs - part.old_logprobs, 0.0).abs().amax()
            weight = float(token_weight)
            result.policy_loss += float(policy_weight * policy.loss)
            result.value_loss += weight * float(values)
            result.clipfrac += weight * float(policy.clipfrac)
            result.ratio_outside_frac += weight * float(policy.ratio_outside_frac)
            result.approx_kl += weight * float(policy.approx_kl)
            result.ratio_mean += weight * float(policy.ratio_mean)
            result.ratio_max = max(result.ratio_max, float(policy.ratio_max))
            result.max_abs_log_ratio = max(result.max_abs_log_ratio, float(log_ratio))
    return result


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
) -> UpdateStats:
    """Run the PPO epochs of one iteration; return their statistics.

    Each epoch reshuffles the rollout rows (keyed by seed, iteration and epoch) and takes one
    optimizer step per minibatch. The first minibatch is checked for the step-0 identity; a step
    with non-finite values is skipped and counted, and the run stops (raises) once more than
    ``config.max_nonfinite_steps`` were skipped. A minibatch without action tokens (every sample
    in it skipped for a bad score) takes no step. With ``target_approx_kl`` the epochs stop after a
    minibatch whose approx-KL to the rollout policy exceeds it. ``batch`` is the whole rollout;
    with several processes (``collectives``), each trains on its share of every minibatch.
    """
    collectives = collectives or LocalCollectives()
    stats = UpdateStats()
    policy_params, critic_params = actor_critic.policy_parameters(), actor_critic.critic_parameters()
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
        for name in (
            "policy_loss",
            "value_loss",
            "clipfrac",
            "ratio_outside_frac",
            "approx_kl",
            "ratio_mean",
        ):
            setattr(stats, name, sum(getattr(m, name) for m in done) / len(done))
        stats.ratio_max = max(m.ratio_max for m in done)
        stats.grad_norm_policy = sum(policy_norms) / len(policy_norms)
        stats.grad_norm_critic = sum(critic_norms) / len(critic_norms)
    return stats
