"""Trainer-step tier for ppo-ref's own trainer (spec STEP-1..8; contract :mod:`ppo_ref.adapters.step`).

Each run goes through the trainer's code, stage by stage: the response mask and stop reason of
the generator (:func:`ppo_ref.trainer.generation.first_eos_mask`, limited to the token budget as
the generator is), stage 4's forward (:meth:`ActorCritic.response_outputs` without gradient: the
old log-probs), stage 5's token rewards (:func:`ppo_ref.token_rewards`), stage 6's estimator
from :data:`ppo_ref.trainer.estimators.ADVANTAGE_ESTIMATORS` (``grpo``), and stage 7's
:func:`ppo_ref.trainer.update.minibatch_backward` with ``micro_batch_size = B / micro_batches``
(gradient accumulation). The gradient is the accumulated ``.grad`` of the policy before any
clipping or optimizer step. The model is a tiny GPT-2 (2 layers, width 32, dropout 0) in float64,
built from a fixed seed; ``MineStep(family="qwen2")`` (or ``"llama"``, :meth:`MineStep.with_family`,
STEP-7) builds that family's tiny model instead.

Loss modes: the four ``loss_agg`` modes with ``policy_loss = "ppo"`` (their names), and
``cispo`` (token-mean) and ``gspo`` (seq-mean-token-mean). Outputs (STEP-5): the rollout's
response mask (``loss_mask``) and stage 6's advantages; :meth:`MineStep.truncation_run` adds the
``gae`` advantages with the bootstrap value 0 and 1 (``truncation = "bootstrap"``).

STEP-6: the trainer's gradient-accumulation setting is ``micro_batch_size`` (:data:`ACCUMULATION`):
the runner's micro-batches are its accumulation steps, so STEP-6 reads ``run(micro_batches=k)``.

STEP-8: :meth:`MineStep.sampling_run` runs stage 5c's rollout correction (``token-truncate``) on
the suite's top-k / top-p rollout: the sampler's log-probs as the rollout's, its kept-set sizes as
the generator records them (``Generated.kept_counts``), stage 4's forward replaying them
(``kept_logmass``), then the step with the weights on the advantages. Convention ``"truncated"``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from ppo_ref.adapters.step import SampledRollout, StepBatch, StepResult
from ppo_ref.adapters.step_kit import (
    check_run,
    completion_logits,
    gradient_of,
    padded,
    step_result,
    tiny_config,
    tiny_model,
)
from ppo_ref.aggregation import LOSS_AGGREGATIONS

__all__ = ["MineStep", "make_step"]

LOSS_MODES: tuple[str, ...] = (*LOSS_AGGREGATIONS, "cispo", "gspo")

ACCUMULATION = (
    "TrainerConfig.micro_batch_size (rows per forward/backward; ppo_ref/trainer/update.py "
    "minibatch_backward: every micro-batch's loss is its share of the whole minibatch's, one backward "
    "each, the optimizer stepping once per minibatch in ppo_update)"
)
"""STEP-6: the setting the runner's ``micro_batches`` drive (``micro_batch_size = B / k``)."""


def _mode_settings(loss_mode: str) -> dict[str, Any]:
    if loss_mode == "cispo":
        return {"policy_loss": "cispo", "loss_agg": "token-mean"}
    if loss_mode == "gspo":
        return {"policy_loss": "gspo", "loss_agg": "seq-mean-token-mean"}
    return {"policy_loss": "ppo", "loss_agg": loss_mode}


class MineStep:
    """One stage-7 step of ppo-ref's trainer on a :class:`StepBatch` (see the module docstring)."""

    name = "mine"
    loss_modes = LOSS_MODES
    micro_batch_local: Mapping[str, str] = MappingProxyType({})
    accumulation_setting = ACCUMULATION
    sampling_convention = "truncated"
    provenance = (
        "ppo_ref.trainer: generation.first_eos_mask, ActorCritic.response_outputs (stage 4), "
        "token_rewards (stage 5), ADVANTAGE_ESTIMATORS['grpo'] / ['gae'] (stage 6), "
        "update.minibatch_backward with micro_batch_size (stage 7); outputs: the rollout's mask and "
        "stage 6's advantages; STEP-8: ActorCritic.response_outputs(kept_counts=...) and "
        "update.correction_weights (stage 5c)"
    )

    def __init__(self, seed: int = 0, family: str = "gpt2") -> None:
        import ppo_ref
        from ppo_ref.adapters.step_kit import FAMILIES

        if family not in FAMILIES:
            raise ValueError(f"family: expected one of {', '.join(FAMILIES)}, got {family!r}")
        self.version = ppo_ref.__version__
        self.seed = seed
        self.family = family

    def with_family(self, family: str) -> MineStep:
        """The same runner on a tiny ``family`` model (STEP-7)."""
        return MineStep(self.seed, family)

    def _actor_critic(self, vocab_size: int) -> Any:
        from ppo_ref.trainer.models import ActorCritic

        with torch.random.fork_rng(devices=[]):
            config = tiny_config(self.family, vocab_size, bos_id=1)
            policy = tiny_model(config, self.seed, dtype=torch.float64)
        return ActorCritic(policy)

    def _config(self, batch: StepBatch, micro_batches: int, **settings: Any) -> Any:
        from ppo_ref.trainer.config import TrainerConfig

        values: dict[str, Any] = {
            "rollout_batch_size": batch.size,
            "num_minibatches": 1,
            "micro_batch_size": batch.size // micro_batches,
            "max_new_tokens": batch.budget,
            "advantage_estimator": "grpo",
            "group_size": batch.group_size,
            "kl_coef": 0.0,
            "max_grad_norm": None,
            "tensorboard": False,
            "progress_bar": False,
            "plots": False,
        }
        values.update(settings)
        return TrainerConfig(**values)

    def _rollout(
        self,
        batch: StepBatch,
        actor_critic: Any,
        config: Any,
        pad_to: int | None,
        pad_fill: int | None,
        sampled: SampledRollout | None = None,
    ) -> Any:
        from ppo_ref import token_rewards
        from ppo_ref.trainer.data import Rollout, ScoredBatch, SequenceBatch
        from ppo_ref.trainer.generation import first_eos_mask
        from ppo_ref.trainer.update import correction_weights

        rows = batch.size
        prompts = [batch.prompt_ids[i // batch.group_size] for i in range(rows)]
        layout = padded(batch, pad_to, pad_fill)
        response_ids, lengths = layout.response_ids, layout.lengths
        width_r = response_ids.shape[1]
        eos_mask, ended = first_eos_mask(response_ids, batch.eos_id)
        # the generator writes at most max_new_tokens columns; padding beyond them is never an action
        mask = eos_mask & (torch.arange(width_r).unsqueeze(0) < lengths.unsqueeze(1))
        sequences = SequenceBatch.build(layout.prompt_ids, layout.prompt_mask, response_ids, mask)
        counts = None if sampled is None else sampled.kept_counts(width_r)
        with torch.no_grad():
            outputs = actor_critic.response_outputs(
                sequences, config.temperature, need_values=False, kept_counts=counts
            )
        old = outputs.logprobs
        rollout_logprobs = weights = None
        if sampled is not None:  # stage 5c, with the sampler's log-probs
            rollout_logprobs = sampled.padded("logprobs", width_r).to(old.dtype)
            weights = correction_weights(config, old, rollout_logprobs, mask, outputs.kept_logmass)
        scores = torch.tensor(batch.scores, dtype=old.dtype)
        rewards = token_rewards(scores, old, old, mask, 0.0)
        zeros = torch.zeros_like(old)
        return Rollout(
            iteration=0,
            sample_index=torch.arange(rows),
            prompts=[" ".join(map(str, p)) for p in prompts],
            responses=[" ".join(map(str, c)) for c in batch.completions],
            sequences=sequences,
            ended=ended,
            valid=torch.ones(rows, dtype=torch.bool),
            scored=ScoredBatch(scores, torch.zeros_like(scores), scores),
            old_logprobs=old,
            ref_logprobs=old,
            values=zeros,
            bootstrap_values=torch.zeros(rows, dtype=old.dtype),
            entropy=zeros,
            kl_coef=0.0,
            kl=zeros,
            rewards=rewards,
            raw_advantages=zeros,
            returns=zeros,
            advantages=zeros,
            rollout_logprobs=rollout_logprobs,
            correction_weights=weights,
        )

    def run(
        self,
        batch: StepBatch,
        *,
        loss_mode: str,
        micro_batches: int = 1,
        pad_to: int | None = None,
        pad_fill: int | None = None,
    ) -> StepResult:
        """One stage-7 step of the trainer on ``batch`` (module docstring)."""
        check_run(batch, loss_mode, LOSS_MODES, micro_batches, pad_to, pad_fill)
        config = self._config(batch, micro_batches, **_mode_settings(loss_mode))
        return self._step(batch, config, pad_to, pad_fill)

    def _step(
        self,
        batch: StepBatch,
        config: Any,
        pad_to: int | None,
        pad_fill: int | None,
        sampled: SampledRollout | None = None,
    ) -> StepResult:
        from ppo_ref.trainer.data import TrainingBatch
        from ppo_ref.trainer.estimators import ADVANTAGE_ESTIMATORS
        from ppo_ref.trainer.update import minibatch_backward

        actor_critic = self._actor_critic(batch.vocab_size)
        rollout = self._rollout(batch, actor_critic, config, pad_to, pad_fill, sampled)
        advantages, returns = ADVANTAGE_ESTIMATORS["grpo"](rollout, config)
        training = TrainingBatch(
            rollout.sequences,
            rollout.mask,
            rollout.old_logprobs,
            rollout.values,
            advantages,
            returns,
            correction_weights=rollout.correction_weights,
        )
        losses: list[Tensor] = []

        def backward(loss: Tensor) -> None:
            losses.append(loss.detach())
            loss.backward()  # type: ignore[no-untyped-call]

        result = minibatch_backward(actor_critic, training, config, contextlib.nullcontext, backward)
        stats: dict[str, float | None] = {
            "max_abs_log_ratio": result.max_abs_log_ratio,
            "clipfrac": result.clipfrac,
            "approx_kl": result.approx_kl,
        }
        outputs = {"loss_mask": rollout.mask, "advantages": advantages}
        if rollout.correction_weights is not None:
            outputs["correction_weights"] = rollout.correction_weights
        return step_result(gradient_of(actor_critic.policy.named_parameters()), losses, stats, outputs)

    def policy_logits(self, batch: StepBatch) -> Tensor:
        """(B, L, V) the policy's logits before any update at each completion position of ``batch``
        (position t predicts completion token t), divided by the temperature (1: the trainer's
        default), laid out as stage 4's forward has them (left-padded prompts, position ids from
        the mask; :func:`~ppo_ref.adapters.step_kit.completion_logits`)."""
        policy = self._actor_critic(batch.vocab_size).policy
        return completion_logits(policy.eval(), batch, self._config(batch, 1).temperature)

    def sampling_run(self, sampled: SampledRollout) -> StepResult:
        """One step (``token-mean``) with stage 5c's ``token-truncate`` correction on ``sampled``,
        the suite's top-k / top-p rollout; the trainer samples with the same ``top_k`` / ``top_p``."""
        if not isinstance(sampled, SampledRollout):
            raise ValueError(f"sampled: expected a SampledRollout, got {type(sampled).__name__}")
        batch = sampled.batch
        config = self._config(
            batch,
            1,
            rollout_correction="token-truncate",
            top_k=sampled.top_k,
            top_p=sampled.top_p,
            **_mode_settings("token-mean"),
        )
        return self._step(batch, config, None, None, sampled)

    def truncation_run(self, batch: StepBatch) -> StepResult:
        """Stage 6's ``gae`` advantages (``truncation = "bootstrap"``) with the critic's bootstrap
        value 0 and 1: a row whose advantages move is bootstrapped as truncated. No gradient."""
        from dataclasses import replace

        from ppo_ref.trainer.estimators import ADVANTAGE_ESTIMATORS

        config = self._config(batch, 1, advantage_estimator="gae", group_size=1, truncation="bootstrap")
        actor_critic = self._actor_critic(batch.vocab_size)
        rollout = self._rollout(batch, actor_critic, config, None, None)
        results = []
        for value in (0.0, 1.0):
            boot = torch.full_like(rollout.bootstrap_values, value)
            results.append(ADVANTAGE_ESTIMATORS["gae"](replace(rollout, bootstrap_values=boot), config)[0])
        outputs = {"loss_mask": rollout.mask, "advantages": results[0], "advantages_bootstrapped": results[1]}
        return StepResult(gradient={}, loss=0.0, stats={}, outputs=outputs)


def make_step() -> MineStep:
    """ppo-ref's own step runner. Its runs go through the trainer, so it needs the extra ``trainer``:
    without it (the suite-only install) this raises ``ModuleNotFoundError`` naming the extra, which
    the step tier reports as "not provided"."""
    from ppo_ref.trainer.requirements import missing_requirements, missing_trainer_message

    missing = missing_requirements()
    if missing:
        raise ModuleNotFoundError(f"ppo-ref's step runner is its trainer: {missing_trainer_message(missing)}")
    return MineStep()
