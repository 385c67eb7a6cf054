"""The PPO-RLHF loop, stage by stage (the numbers are the stages of the algorithm).

    1. sample prompts            2. generate responses          3. score them
    4. old log-probs, reference log-probs and values (no-grad forwards)
    5. token rewards (KL penalty on every action token, score on the last)
    6. GAE advantages, whitened over all action tokens of the rollout batch
    7. PPO epochs over reshuffled minibatches (:mod:`ppo_ref.trainer.update`)
    8. metrics, checks and checkpoints

All PPO math is a call to a ppo_ref reference function; this module only moves tensors between
them. Every random draw is keyed by (seed, stream, iteration, global sample index): see
:mod:`ppo_ref.trainer.seeding`. With several processes each one generates, scores and forwards its
rows of the batch, and everything batch-wide is computed on the gathered batch: see
:mod:`ppo_ref.trainer.distributed`. Checkpoints and resuming: :mod:`ppo_ref.trainer.resume`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import torch
from accelerate import Accelerator  # type: ignore[import-untyped, unused-ignore]
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

import ppo_ref
from ppo_ref import (
    AdaptiveKLController,
    FixedKLController,
    explained_variance,
    kl_penalty,
    masked_mean,
    masked_var,
    masked_whiten,
    token_rewards,
)
from ppo_ref.trainer import resume as resuming
from ppo_ref.trainer.checkpoint import remove_stale_temporaries
from ppo_ref.trainer.config import TrainerConfig
from ppo_ref.trainer.data import EvalResult, Rollout, ScoredBatch, SequenceBatch
from ppo_ref.trainer.distributed import DataParallel, default_accelerator
from ppo_ref.trainer.estimators import advantage_estimator
from ppo_ref.trainer.generation import generate, left_pad
from ppo_ref.trainer.interrupt import StopRequest
from ppo_ref.trainer.metrics import AuditLog, MetricsLogger, ProgressBar, plot_metrics, write_summary
from ppo_ref.trainer.models import (
    ActorCritic,
    ResponseOutputs,
    ScalarHeadCritic,
    disable_dropout,
    frozen_copy,
    parameter_dtype,
    parameter_fingerprint,
    response_logprobs,
)
from ppo_ref.trainer.rollout import gather_rollout
from ppo_ref.trainer.scoring import (
    FunctionScorer,
    RewardModelScorer,
    Scorer,
    apply_missing_eos_rule,
    check_scores,
)
from ppo_ref.trainer.seeding import Stream, sampling_uniforms, stream_rng
from ppo_ref.trainer.update import UpdateStats, ppo_update

__all__ = [
    "EvalResult",
    "PPOTrainer",
    "ReferenceModelChangedError",
    "Rollout",
    "TrainingSetup",
    "reward_provenance",
]


_T = TypeVar("_T")


class ReferenceModelChangedError(RuntimeError):
    """The frozen reference policy's parameters changed during training."""


@dataclass(frozen=True)
class TrainingSetup:
    """What a run trains: built from a task, or from local checkpoints and a prompts file.

    Attributes:
        tokenizer: the policy's tokenizer (``pad_token_id`` and ``eos_token_id`` set; may be equal).
        policy: the causal LM to train (trained in place).
        train_prompts, eval_prompts: prompt texts; evaluation uses only ``eval_prompts``.
        reward_function: ``(prompts, responses) -> scores``, or None.
        reward_model: a one-label sequence classifier, or None (one of the two must be set; with
            both, the reward model scores training).
        eval_reward_function: the true score for evaluation when training optimises a proxy (a
            learned reward model); None: evaluation uses the training reward.
        reward_tokenizer: the reward model's tokenizer when its vocabulary differs from the
            policy's (texts are then re-encoded), else None.
        well_formed: ``(prompt, response) -> bool`` for tasks with a format, else None.
        reference: the frozen KL reference (same vocabulary as the policy); None = a frozen copy
            of the initial policy.
        name: a label for the summary (task name or checkpoint path).
        task: the built-in task this setup was built from (recorded as ``config.task`` in
            summary.json), or None (the default: the config's ``task`` is then recorded as null).
        reward_name: what scores the responses, for summary.json's ``reward`` (None: described
            from ``reward_model`` or the function's module and name).
    """

    tokenizer: PreTrainedTokenizerBase
    policy: PreTrainedModel
    train_prompts: Sequence[str]
    eval_prompts: Sequence[str]
    reward_function: Callable[[Sequence[str], Sequence[str]], Sequence[float]] | None = None
    reward_model: PreTrainedModel | None = None
    eval_reward_function: Callable[[Sequence[str], Sequence[str]], Sequence[float]] | None = None
    reward_tokenizer: PreTrainedTokenizerBase | None = None
    well_formed: Callable[[str, str], bool] | None = None
    reference: PreTrainedModel | None = None
    name: str = "custom"
    task: str | None = None
    reward_name: str | None = None


def _callable_name(function: object) -> str:
    module = getattr(function, "__module__", None) or "?"
    name = getattr(function, "__qualname__", None) or type(function).__qualname__
    return f"{module}:{name}"


def reward_provenance(setup: TrainingSetup) -> dict[str, str | None]:
    """What scored training and evaluation, for summary.json: ``{"training": ..., "evaluation": ...}``."""
    if setup.reward_model is not None:
        model = setup.reward_model
        default = f"reward model {getattr(model, 'name_or_path', '') or type(model).__name__}"
    else:
        default = f"function {_callable_name(setup.reward_function)}"
    training = setup.reward_name or default
    evaluation = (
        training
        if setup.eval_reward_function is None
        else f"function {_callable_name(setup.eval_reward_function)}"
    )
    return {"training": training, "evaluation": evaluation}


class PPOTrainer:
    """PPO-RLHF on transformers models; see the module docstring for the stages.

    ``accelerator`` defaults to :func:`~ppo_ref.trainer.distributed.default_accelerator`; under
    ``torchrun`` or ``accelerate launch`` its processes split every batch (see
    :mod:`ppo_ref.trainer.distributed`).
    ``resume`` is a checkpoint directory, or a run directory whose newest checkpoint is taken:
    the models, optimizer, KL coefficient, counters, RNG states and metrics history are loaded,
    and :meth:`train` continues with the next iteration (``config`` must match the checkpoint's
    except for :data:`~ppo_ref.trainer.config.RESUME_MUTABLE_FIELDS`).
    """

    def __init__(
        self,
        config: TrainerConfig,
        setup: TrainingSetup,
        accelerator: Accelerator | None = None,
        resume: str | Path | None = None,
    ) -> None:
        self.config = config
        self.setup = setup
        self.accelerator = accelerator or default_accelerator()
        self.parallel = DataParallel(self.accelerator)
        self._check_process_count()
        self.device = self.accelerator.device
        use_bf16 = config.mixed_precision == "bf16" or (
            config.mixed_precision == "auto" and self.device.type == "cuda" and torch.cuda.is_bf16_supported()
        )
        self.autocast_dtype = torch.bfloat16 if use_bf16 else None
        self.logprob_tolerance = config.logprob_check_tolerance or (0.25 if use_bf16 else 1e-3)
        self.tokenizer = setup.tokenizer
        self.eos_id, self.pad_id = _special_ids(setup.tokenizer)
        self.train_prompt_ids = self._encode_prompts(setup.train_prompts, "train_prompts")
        self.eval_prompt_ids = self._encode_prompts(setup.eval_prompts, "eval_prompts")
        if resume is not None and self.parallel.backend == "deepspeed":
            raise ValueError(
                "resume: resuming under DeepSpeed is not supported (its optimizer state is not saved)"
            )
        checkpoint = resuming.open_checkpoint(resume, config) if resume is not None else None
        self._build_models()
        self.kl_controller: FixedKLController = (
            AdaptiveKLController(config.kl_coef, config.kl_target, config.kl_horizon)
            if config.adaptive_kl
            else FixedKLController(config.kl_coef)
        )
        self.nonfinite_steps = 0
        self.skipped_samples = 0
        self.start_iteration = 0
        self.history: list[dict[str, Any]] = []
        self.eval_initial: EvalResult | None = None
        self.resumed_from: Path | None = None
        self.last_checkpoint: Path | None = None
        if checkpoint is not None:
            resuming.load_models(checkpoint, self.actor_critic, self.reference, self.setup.reward_model)
        for frozen in (self.reference, self.setup.reward_model):
            if frozen is not None:  # the same frozen weights on every process
                self.parallel.broadcast_parameters(frozen)
        self.reference_fingerprint = parameter_fingerprint(self.reference)
        self._prepare()
        if checkpoint is not None:
            resuming.load_optimizer(checkpoint, self.actor_critic, self.optimizer)
            self.load_state_dict(resuming.trainer_state(checkpoint))
            resuming.restore_rng(checkpoint, self.parallel)

    def state_dict(self) -> dict[str, Any]:
        """The trainer's own state beyond models and optimizer (what a checkpoint saves with them):
        the KL coefficient, counters, completed iterations, metrics history and initial evaluation."""
        return {
            "kl_coef": self.kl_controller.value,
            "nonfinite_steps": self.nonfinite_steps,
            "skipped_samples": self.skipped_samples,
            "iteration": len(self.history),
            "history": list(self.history),
            "eval_initial": self.eval_initial,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (a :meth:`state_dict`, or :func:`~ppo_ref.trainer.resume.trainer_state`
        of a checkpoint, which adds ``resumed_from``): :meth:`train` starts after its iteration."""
        self.kl_controller.value = float(state["kl_coef"])
        self.nonfinite_steps = int(state["nonfinite_steps"])
        self.skipped_samples = int(state["skipped_samples"])
        self.start_iteration = int(state["iteration"])
        self.history = list(state["history"])
        if state["eval_initial"] is not None:
            self.eval_initial = state["eval_initial"]
        if state.get("resumed_from") is not None:
            self.resumed_from = Path(state["resumed_from"])

    # -- set-up ------------------------------------------------------------------------------------

    def _check_process_count(self) -> None:
        """Every batch must split evenly over the processes (checked before any work)."""
        config, world = self.config, self.parallel.world_size
        if world == 1:
            return
        for name, rows in (
            ("rollout_batch_size", config.rollout_batch_size),
            ("rollout_batch_size / num_minibatches", config.minibatch_size),
            ("eval_samples", config.eval_samples),
        ):
            if rows % world != 0:
                raise ValueError(
                    f"config: {name} = {rows} cannot be split evenly over {world} processes; "
                    f"use a multiple of {world}"
                )

    def _encode_prompts(self, prompts: Sequence[str], name: str) -> list[list[int]]:
        if len(prompts) == 0:
            raise ValueError(f"{name}: expected at least one prompt")
        encoded = [list(ids) for ids in self.tokenizer(list(prompts))["input_ids"]]
        limit = getattr(self.setup.policy.config, "max_position_embeddings", None)
        for index, ids in enumerate(encoded):
            if not ids:
                raise ValueError(f"{name}: prompt {index} ({prompts[index]!r}) encodes to no tokens")
            if isinstance(limit, int) and len(ids) + self.config.max_new_tokens > limit:
                preview = prompts[index] if len(prompts[index]) <= 60 else prompts[index][:57] + "..."
                raise ValueError(
                    f"{name}: prompt {index} ({preview!r}) has {len(ids)} tokens; with max_new_tokens="
                    f"{self.config.max_new_tokens} it exceeds the model's context of {limit} positions "
                    "(shorten the prompt or lower max_new_tokens; prompts are never truncated silently)"
                )
        return encoded

    def _build_models(self) -> None:
        """Policy, frozen reference, critic, reward scorer, optimizer (dropout off everywhere)."""
        config, setup = self.config, self.setup
        policy = disable_dropout(setup.policy).to(self.device)
        if setup.reference is not None and getattr(setup.reference.config, "vocab_size", None) != getattr(
            policy.config, "vocab_size", None
        ):
            raise ValueError("reference: expected a causal LM with the policy's vocabulary size")
        self.reference = frozen_copy(policy if setup.reference is None else setup.reference.to(self.device))
        if config.critic == "value-head":
            head = nn.Linear(int(policy.config.hidden_size), 1, dtype=parameter_dtype(policy))
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
            self.actor_critic = ActorCritic(policy, value_head=head.to(self.device))
        elif config.critic == "reward":
            if setup.reward_model is None or setup.reward_tokenizer is not None:
                raise ValueError(
                    "config field 'critic': 'reward' needs a reward model sharing the policy's vocabulary"
                )
            critic = ScalarHeadCritic.from_reward_model(setup.reward_model).to(self.device)
            self.actor_critic = ActorCritic(policy, critic=critic)
        else:
            self.actor_critic = ActorCritic(
                policy, critic=ScalarHeadCritic.from_policy(policy).to(self.device)
            )
        self.train_scorer = self._make_scorer()
        self.eval_scorer: Scorer = (
            self.train_scorer
            if setup.eval_reward_function is None
            else FunctionScorer(setup.eval_reward_function)
        )
        groups = [{"params": self.actor_critic.policy_parameters(), "lr": config.learning_rate}]
        critic_lr = config.critic_learning_rate or config.learning_rate
        groups.append({"params": self.actor_critic.critic_parameters(), "lr": critic_lr})
        lr, eps, decay = config.learning_rate, config.adam_eps, config.weight_decay
        self.optimizer: torch.optim.Optimizer
        try:  # the fused kernel (CPU and CUDA) does the same update as the loop, several times faster
            self.optimizer = torch.optim.AdamW(groups, lr=lr, eps=eps, weight_decay=decay, fused=True)
        except (RuntimeError, ValueError):
            self.optimizer = torch.optim.AdamW(groups, lr=lr, eps=eps, weight_decay=decay)
        # A model handed over with gradients left in .grad (the built-in tasks' warm-up leaves its
        # last step's) would add them to the first PPO step, and would stop torch's optimizer-state
        # loader from initialising the state it fills on resume. Start from no gradient.
        self.optimizer.zero_grad(set_to_none=True)

    def _prepare(self) -> None:
        """Hand the trained models and the optimizer to the data-parallel backend (several processes,
        or an FSDP/DeepSpeed accelerate config); with one plain process nothing is wrapped."""
        parallel, config = self.parallel, self.config
        if not parallel.wraps_models:
            return
        if parallel.backend == "deepspeed":
            rows = config.minibatch_size // parallel.world_size
            if config.micro_batch_size is not None and config.micro_batch_size < rows:
                raise ValueError(
                    f"config field 'micro_batch_size': under DeepSpeed the engine steps after every "
                    f"backward, so a process's share of a minibatch ({rows} rows) must be one micro-batch "
                    "(set micro_batch_size to none)"
                )
            parallel.configure_deepspeed(rows, config.max_grad_norm)
        runner, self.optimizer = parallel.prepare(self.actor_critic.module, self.optimizer)
        self.actor_critic.train_runner = runner
        # Inference needs no gradient synchronisation: the plain module, unless parameters are sharded.
        self.actor_critic.inference_runner = (
            runner if parallel.sharded_parameters else self.accelerator.unwrap_model(runner)
        )

    def _make_scorer(self) -> Scorer:
        setup = self.setup
        if setup.reward_model is not None:
            return RewardModelScorer(
                setup.reward_model.to(self.device),
                self.autocast,
                self.config.forward_batch_size,
                setup.reward_tokenizer,
            )
        if setup.reward_function is None:
            raise ValueError("setup: expected a reward_function or a reward_model")
        return FunctionScorer(setup.reward_function)

    def autocast(self) -> AbstractContextManager[object]:
        """bf16 autocast for model forwards when mixed precision is on, else a no-op."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    @property
    def policy(self) -> nn.Module:
        """The policy being trained."""
        return self.actor_critic.policy

    # -- stages 1-6 --------------------------------------------------------------------------------

    def collect_rollout(self, iteration: int, timings: dict[str, float] | None = None) -> Rollout:
        """Stages 1-6: sample prompts, generate, score, forward, token rewards, advantages."""
        config = self.config
        clock = _Clock(self.device, timings)

        # 1. Sample prompts (keyed by seed and iteration; without replacement when there are enough).
        #    Every process draws the same batch and takes its block of rows, left-padded to the
        #    width of the whole batch.
        count = config.rollout_batch_size
        chosen = stream_rng(config.seed, Stream.PROMPTS, iteration).choice(
            len(self.train_prompt_ids), size=count, replace=len(self.train_prompt_ids) < count
        )
        sample_index, prompts, prompt_ids, prompt_mask = self._my_prompts(
            chosen, self.setup.train_prompts, self.train_prompt_ids, "rollout_batch_size"
        )
        clock.lap("seconds_prompts")

        # 2. Generate responses (per-sample noise; stop at the first EOS; mask from the first EOS).
        uniforms = sampling_uniforms(
            config.seed, Stream.SAMPLING, iteration, sample_index, config.max_new_tokens
        )
        sequences, ended, responses = self._generate(prompt_ids, prompt_mask, uniforms, config.temperature)
        clock.lap("seconds_generate")

        # 3. Score (reward model at the last real token, or a rule), check every score, then the
        #    missing-EOS rule. A bad score stops the run, or (on_bad_score = "skip") its sample
        #    becomes invalid: no action token, so it trains nothing and enters no statistic.
        scored, valid = self._score(self.train_scorer, prompts, responses, sequences, ended, sample_index)
        clock.lap("seconds_score")

        # 4. Old log-probs and values (policy in eval mode, logits / temperature), reference log-probs.
        outputs = self._forward_no_grad(sequences, config.temperature)
        ref_logprobs = self._reference_logprobs(sequences, config.temperature)
        assert (
            outputs.values is not None
            and outputs.bootstrap_values is not None
            and outputs.entropy is not None
        )
        clock.lap("seconds_forward")

        # 5. Token rewards: -kl_coef * KL on every action token, the score on the last one.
        mask = sequences.response_mask & valid.to(self.device).unsqueeze(1)
        scores = scored.scores.to(self.device)
        kl_coef = self.kl_controller.value
        kl = kl_penalty(outputs.logprobs, ref_logprobs, config.kl_estimator, mask=sequences.response_mask)
        rewards = token_rewards(scores, outputs.logprobs, ref_logprobs, mask, kl_coef, config.kl_estimator)

        local = Rollout(
            iteration=iteration,
            sample_index=sample_index,
            prompts=prompts,
            responses=responses,
            sequences=sequences,
            ended=ended,
            valid=valid.to(self.device),
            scored=scored,
            old_logprobs=outputs.logprobs,
            ref_logprobs=ref_logprobs,
            values=outputs.values,
            bootstrap_values=outputs.bootstrap_values,
            entropy=outputs.entropy,
            kl_coef=kl_coef,
            kl=kl,
            rewards=rewards,
            raw_advantages=torch.zeros_like(rewards),  # filled by stage 6 below
            returns=torch.zeros_like(rewards),
            advantages=torch.zeros_like(rewards),
        )
        # 6a. Advantages and returns by the run's estimator (ppo_ref.trainer.estimators; "gae":
        #     terminal, or bootstrapped from the critic for responses cut at max length). Rows are
        #     independent here, so each process computes its own.
        raw_advantages, returns = advantage_estimator(config)(local, config)
        local = replace(local, raw_advantages=raw_advantages, returns=returns, advantages=raw_advantages)
        # From here on every process holds the whole batch.
        rollout = gather_rollout(self.parallel, local, self.pad_id)

        # 5b. The KL controller sees the mean per-sequence summed KL of the batch (kl is 0 off the mask).
        self.kl_controller.update(float(rollout.kl.sum(dim=1).mean()), n_steps=count)

        # 6b. Advantages whitened over all action tokens of the batch; returns stay raw.
        if int(rollout.mask.sum()) < 2:
            raise ValueError(
                f"iteration {iteration}: fewer than 2 action tokens left to whiten "
                f"({int((~rollout.valid).sum())} of {count} samples skipped for bad scores)"
            )
        advantages = masked_whiten(rollout.raw_advantages, rollout.mask)
        clock.lap("seconds_advantages")
        return replace(rollout, advantages=advantages)

    def _score(
        self,
        scorer: Scorer,
        prompts: Sequence[str],
        responses: Sequence[str],
        sequences: SequenceBatch,
        ended: Tensor,
        sample_index: Tensor,
    ) -> tuple[ScoredBatch, Tensor]:
        """Stage 3 for this process's rows: ``(scored, valid)``; scores are 0 where not valid."""
        config = self.config
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
        self, prompt_ids: Tensor, prompt_mask: Tensor, uniforms: Tensor, temperature: float, top: bool = True
    ) -> tuple[SequenceBatch, Tensor, list[str]]:
        """Stage 2 for a batch: ``(sequences, ended, response texts without EOS)``."""
        config = self.config
        uniforms = uniforms.to(self.device)
        # With several processes, each keeps sampling until every process's rows have ended.
        all_ended = self.parallel.all_true if self.parallel.world_size > 1 else None
        pieces = self._in_chunks(
            prompt_ids.shape[0],
            lambda rows: generate(
                self.actor_critic.policy_caller(),
                prompt_ids[rows],
                prompt_mask[rows],
                uniforms[rows],
                eos_id=self.eos_id,
                pad_id=self.pad_id,
                temperature=temperature,
                top_k=config.top_k if top else 0,
                top_p=config.top_p if top else 1.0,
                all_ended=all_ended,
            ),
        )
        width = max(p.response_ids.shape[1] for p in pieces)
        response_ids = torch.cat([_pad_right(p.response_ids, width, self.pad_id) for p in pieces])
        response_mask = torch.cat([_pad_right(p.response_mask, width, False) for p in pieces])
        ended = torch.cat([p.ended for p in pieces])
        sequences = SequenceBatch.build(prompt_ids, prompt_mask, response_ids, response_mask)
        lengths = response_mask.sum(dim=1) - ended.long()  # tokens before the EOS
        rows_without_eos = [row[:n] for row, n in zip(response_ids.tolist(), lengths.tolist(), strict=True)]
        return sequences, ended, self.tokenizer.batch_decode(rows_without_eos)

    @torch.no_grad()
    def _forward_no_grad(
        self, sequences: SequenceBatch, temperature: float, with_critic: bool = True
    ) -> ResponseOutputs:
        """Stage 4 for the policy (and critic, entropies), in chunks of ``forward_batch_size`` rows."""
        parts = self._in_chunks(
            sequences.input_ids.shape[0],
            lambda rows: self.actor_critic.response_outputs(
                sequences.rows(rows), temperature, need_values=with_critic, need_entropy=with_critic
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
        )

    @torch.no_grad()
    def _reference_logprobs(self, sequences: SequenceBatch, temperature: float) -> Tensor:
        parts = self._in_chunks(
            sequences.input_ids.shape[0],
            lambda rows: response_logprobs(self.reference, sequences.rows(rows), temperature),
        )
        return torch.cat(parts)

    def _in_chunks(self, count: int, run: Callable[[slice], _T]) -> list[_T]:
        """``run`` on consecutive blocks of ``forward_batch_size`` of ``count`` rows (None: all at
        once), each under autocast: the one chunking loop of generation and the no-grad forwards."""
        step = self.config.forward_batch_size or count
        parts = []
        for start in range(0, count, step):
            with self.autocast():
                parts.append(run(slice(start, start + step)))
        return parts

    def _my_prompts(
        self, chosen: Any, texts: Sequence[str], encoded: Sequence[list[int]], what: str
    ) -> tuple[Tensor, list[str], Tensor, Tensor]:
        """Stage 1's layout, for training and evaluation: this process's block of the ``chosen``
        prompts as ``(sample_index, texts, prompt_ids, prompt_mask)``, left-padded to the width of
        the whole batch (every process draws the same batch and takes its block of rows)."""
        count = len(chosen)
        mine = self.parallel.rows(count, what)
        sample_index = torch.arange(count)[mine]
        prompts = [texts[i] for i in chosen[mine]]
        width = max(len(encoded[i]) for i in chosen)
        prompt_ids, prompt_mask = left_pad(
            [encoded[i] for i in chosen[mine]], self.pad_id, self.device, width
        )
        return sample_index, prompts, prompt_ids, prompt_mask

    # -- stage 7 -----------------------------------------------------------------------------------

    def update(self, rollout: Rollout) -> UpdateStats:
        """Stage 7: the PPO epochs on this rollout (raises on a failed step-0 check)."""
        stats = ppo_update(
            self.actor_critic,
            self.optimizer,
            rollout.training_batch(),
            self.config,
            rollout.iteration,
            autocast=self.autocast,
            backward=self.accelerator.backward,
            clip_grad_norm=self._clip_grad_norm,
            logprob_tolerance=self.logprob_tolerance,
            nonfinite_steps_so_far=self.nonfinite_steps,
            collectives=self.parallel,
        )
        self.nonfinite_steps += stats.skipped_steps
        return stats

    def _clip_grad_norm(self, parameters: list[nn.Parameter], max_norm: float) -> Tensor:
        norm = self.accelerator.clip_grad_norm_(parameters, max_norm)
        if norm is None and self.parallel.backend == "deepspeed":
            # DeepSpeed clips inside its step and may report no norm: nothing to check here.
            return torch.tensor(0.0)
        return norm if isinstance(norm, Tensor) else torch.tensor(float("nan") if norm is None else norm)

    # -- stage 8 -----------------------------------------------------------------------------------

    def check_reference_unchanged(self) -> None:
        """Raise if the frozen reference's parameters differ from their initial fingerprint."""
        if not torch.equal(parameter_fingerprint(self.reference), self.reference_fingerprint):
            raise ReferenceModelChangedError(
                "the reference model's parameters changed during training; "
                "it must stay the frozen initial policy"
            )

    def iteration_metrics(
        self, rollout: Rollout, stats: UpdateStats, timings: dict[str, float]
    ) -> dict[str, Any]:
        """Stage 8: the metrics.jsonl record of an iteration.

        Score statistics cover the valid samples (a skipped sample has no usable score);
        generation statistics (length, EOS rate, KL to the reference) cover every sample.
        """
        mask, valid = rollout.mask, rollout.valid.cpu()
        scores = rollout.scored.scores[valid]
        lengths = rollout.sequences.response_mask.sum(dim=1).float()
        skipped = int((~valid).sum())
        record: dict[str, Any] = {
            "iteration": rollout.iteration,
            "score_mean": float(scores.mean()) if scores.numel() else math.nan,
            "score_std": float(scores.std()) if scores.numel() > 1 else 0.0,
            "reward_mean": float(rollout.rewards.sum(dim=1)[rollout.valid].mean()),
            "kl_ref": float(rollout.kl.sum(dim=1).mean()),
            "kl_coef": rollout.kl_coef,
            "entropy": float(masked_mean(rollout.entropy, mask)),
            "response_length": float(lengths.mean()),
            "eos_rate": float(rollout.ended.float().mean()),
            "clipfrac": stats.clipfrac,
            "ratio_outside_frac": stats.ratio_outside_frac,
            "approx_kl": stats.approx_kl,
            "ratio_mean": stats.ratio_mean,
            "ratio_max": stats.ratio_max,
            "policy_loss": stats.policy_loss,
            "value_loss": stats.value_loss,
            "explained_variance": float(explained_variance(rollout.values, rollout.returns, mask)),
            "advantage_mean": float(masked_mean(rollout.raw_advantages, mask)),
            "advantage_std": math.sqrt(float(masked_var(rollout.raw_advantages, mask))),
            "value_mean": float(masked_mean(rollout.values, mask)),
            "logprob_check_max_abs_diff": stats.logprob_check_max_abs_diff,
            "nonfinite_steps": self.nonfinite_steps,
            "optimizer_steps": stats.optimizer_steps,
            "grad_norm_policy": stats.grad_norm_policy,
            "grad_norm_critic": stats.grad_norm_critic,
            "well_formed_rate": self._well_formed_rate(rollout.prompts, rollout.responses, rollout.ended),
            "skipped_samples": skipped,
        }
        record.update(timings)
        return record

    def audit_records(self, rollout: Rollout, count: int) -> list[dict[str, Any]]:
        """The first ``count`` samples of a rollout in full (rollouts.jsonl); off-mask entries are null."""
        records = []
        mask = rollout.sequences.response_mask.cpu()
        columns = {
            "old_logprobs": rollout.old_logprobs,
            "ref_logprobs": rollout.ref_logprobs,
            "values": rollout.values,
            "token_rewards": rollout.rewards,
            "advantages": rollout.advantages,
        }
        for row in range(min(count, mask.shape[0])):
            keep = mask[row].tolist()
            record: dict[str, Any] = {
                "iteration": rollout.iteration,
                "sample_index": int(rollout.sample_index[row]),
                "prompt": rollout.prompts[row],
                "response": rollout.responses[row],
                "response_ids": rollout.sequences.response_ids[row].tolist(),
                "action_mask": [int(k) for k in keep],
                "stop_reason": "eos" if bool(rollout.ended[row]) else "length",
                "skipped": not bool(rollout.valid[row]),
                "score": float(rollout.scored.scores[row]) if bool(rollout.valid[row]) else None,
                "score_components": {
                    "raw": float(rollout.scored.raw[row]),
                    "missing_eos_adjustment": float(rollout.scored.adjustment[row]),
                },
            }
            for name, tensor in columns.items():
                values = tensor[row].tolist()
                record[name] = [v if k else None for v, k in zip(values, keep, strict=True)]
            record["bootstrap_value"] = float(rollout.bootstrap_values[row])
            records.append(record)
        return records

    def _well_formed_rate(
        self, prompts: Sequence[str], responses: Sequence[str], ended: Tensor
    ) -> float | None:
        check = self.setup.well_formed
        if check is None:
            return None
        good = [bool(e) and check(p, r) for p, r, e in zip(prompts, responses, ended.tolist(), strict=True)]
        return sum(good) / len(good)

    # -- evaluation --------------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self) -> EvalResult:
        """Score ``eval_samples`` responses sampled at temperature 1 from the held-out prompts.

        Prompt i is ``eval_prompts[i % len]``; its noise is keyed by the evaluation stream, never
        the training one, so the initial and final evaluations see the same prompts and noise.
        With several processes each evaluates its block of the samples.
        """
        config = self.config
        count = config.eval_samples
        chosen = [i % len(self.eval_prompt_ids) for i in range(count)]
        sample_index, prompts, prompt_ids, prompt_mask = self._my_prompts(
            chosen, self.setup.eval_prompts, self.eval_prompt_ids, "eval_samples"
        )
        uniforms = sampling_uniforms(
            config.seed, Stream.EVAL_SAMPLING, 0, sample_index, config.max_new_tokens
        )
        sequences, ended, responses = self._generate(prompt_ids, prompt_mask, uniforms, 1.0, top=False)
        scored, valid = self._score(self.eval_scorer, prompts, responses, sequences, ended, sample_index)
        logprobs = self._forward_no_grad(sequences, 1.0, with_critic=False).logprobs
        ref_logprobs = self._reference_logprobs(sequences, 1.0)
        kl = kl_penalty(logprobs, ref_logprobs, config.kl_estimator, mask=sequences.response_mask)
        rows = self.parallel.gather_rows
        scores, valid, ended = rows(scored.scores), rows(valid), rows(ended.cpu())
        kl_sums = rows(kl.sum(dim=1).cpu())
        prompts, responses = self.parallel.gather_list(prompts), self.parallel.gather_list(responses)
        return EvalResult(
            score=float(scores[valid].mean()) if bool(valid.any()) else math.nan,
            kl_ref=float(kl_sums.mean()),
            well_formed_rate=self._well_formed_rate(prompts, responses, ended),
            eos_rate=float(ended.float().mean()),
            samples=count,
            skipped_samples=int((~valid).sum()),
        )

    # -- the run -----------------------------------------------------------------------------------

    def train(
        self, started_at: float | None = None, status: Callable[[str], None] | None = None
    ) -> dict[str, Any]:
        """Evaluate, run the iterations up to ``config.iterations``, evaluate again; write every output.

        Checkpoints go to OUT/checkpoints every ``save_every`` iterations and after the last one.
        SIGINT or SIGTERM stops the run cleanly after the current iteration, with a checkpoint and
        a summary (``interrupted``; no final evaluation). A resumed trainer starts after its
        checkpoint's iteration. Returns the summary (also OUT/summary.json; files are written by
        the main process only). ``started_at`` is the ``time.perf_counter()`` of the run's start
        (e.g. before building the task) for ``wall_seconds``. ``status`` receives a line before each
        long step (the evaluations, the iterations, the plots); the command line prints them.
        """
        config, main = self.config, self.parallel.is_main
        say = status if status is not None and main else (lambda message: None)
        started_at = time.perf_counter() if started_at is None else started_at
        start = self.start_iteration
        out_dir = Path(config.out)
        if main:
            out_dir.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(out_dir)
        if self.eval_initial is None:
            say(f"initial evaluation: {config.eval_samples} responses to held-out prompts")
        initial = self.eval_initial if self.eval_initial is not None else self.evaluate()
        if start < config.iterations:
            say(
                f"PPO iterations {start + 1}-{config.iterations} of {config.iterations}, "
                f"{config.rollout_batch_size} responses each; outputs in {out_dir}"
            )
        self.eval_initial = initial
        records = list(self.history)
        interrupted: str | None = None
        audit = AuditLog(out_dir, enabled=main, keep_before=start if self.resumed_from else None)
        progress = ProgressBar(config.iterations, config.progress_bar and main, initial=start)
        ppo_started = time.perf_counter()
        try:
            with StopRequest() as stop, MetricsLogger(out_dir, config.tensorboard, enabled=main) as logger:
                for record in records:  # a resumed run: its earlier iterations, from the checkpoint
                    logger.write(record, tensorboard=False)
                for iteration in range(start, config.iterations):
                    timings: dict[str, float] = {}
                    began = time.perf_counter()
                    rollout = self.collect_rollout(iteration, timings)  # stages 1-6
                    clock = _Clock(self.device, timings)
                    # 7. PPO epochs over reshuffled minibatches.
                    stats = self.update(rollout)
                    clock.lap("seconds_update")
                    # 8. Metrics and checks (the step-0 identity and non-finite steps are checked in 7).
                    self.check_reference_unchanged()
                    self.skipped_samples += int((~rollout.valid).sum())
                    record = self.iteration_metrics(rollout, stats, timings)
                    if config.audit_samples:
                        audit.write(self.audit_records(rollout, config.audit_samples))
                    clock.lap("seconds_metrics")
                    record["seconds_metrics"] = timings["seconds_metrics"]
                    record["seconds_iteration"] = time.perf_counter() - began
                    record["tokens_per_second"] = float(rollout.mask.sum()) / record["seconds_iteration"]
                    logger.write(record)
                    progress.update(record)
                    records.append(record)
                    self.history = records
                    # Checkpoints, and a clean stop on a signal (decided together by all processes).
                    completed = iteration + 1
                    stopping = self.parallel.any_true(stop.requested is not None)
                    periodic = config.save_every > 0 and completed % config.save_every == 0
                    if stopping or periodic or completed == config.iterations:
                        self.last_checkpoint = resuming.save_checkpoint(
                            completed,
                            self.state_dict(),
                            config=config,
                            parallel=self.parallel,
                            actor_critic=self.actor_critic,
                            optimizer=self.optimizer,
                            reference=self.reference,
                            reward_model=self.setup.reward_model,
                        )
                    if stopping:
                        interrupted = stop.requested or "a signal to another process"
                        break
        finally:
            audit.close()
            progress.close()
        ppo_seconds = time.perf_counter() - ppo_started
        if not interrupted:
            say(f"final evaluation: {config.eval_samples} responses to held-out prompts")
        final = None if interrupted else self.evaluate()
        if config.plots and records and main:
            say("writing the plots")
            evaluations = {0: initial.score, len(records): None if final is None else final.score}
            plot_metrics(
                out_dir, records, run=f"{self.setup.name}, seed {config.seed}", evaluations=evaluations
            )
        summary: dict[str, Any] = {
            "task": self.setup.name,
            "reward": reward_provenance(self.setup),
            "seed": config.seed,
            "iterations": config.iterations,
            "iterations_done": len(records),
            "interrupted": interrupted,
            "resumed_from": None if self.resumed_from is None else str(self.resumed_from),
            "last_checkpoint": None if self.last_checkpoint is None else str(self.last_checkpoint),
            "eval_samples": initial.samples,
            "eval_score_initial": initial.score,
            "eval_score_final": None if final is None else final.score,
            "kl_ref_initial": initial.kl_ref,
            "kl_ref_final": None if final is None else final.kl_ref,
            "well_formed_rate_initial": initial.well_formed_rate,
            "well_formed_rate_final": None if final is None else final.well_formed_rate,
            "eos_rate_initial": initial.eos_rate,
            "eos_rate_final": None if final is None else final.eos_rate,
            "nonfinite_steps": self.nonfinite_steps,
            "skipped_samples": self.skipped_samples,
            "ppo_seconds": ppo_seconds,
            "wall_seconds": time.perf_counter() - started_at,
            "device": str(self.device),
            "processes": self.parallel.world_size,
            "data_parallel": self.parallel.backend,
            "mixed_precision": "bf16" if self.autocast_dtype is not None else "no",
            "versions": {"ppo_ref": ppo_ref.__version__, "torch": torch.__version__},
            "config": {**asdict(config), "task": self.setup.task},
        }
        if main:
            write_summary(out_dir, summary)
        return summary


class _Clock:
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


def _special_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, int]:
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    if not isinstance(eos, int):
        raise ValueError("tokenizer: expected eos_token_id to be set")
    return eos, pad if isinstance(pad, int) else eos
