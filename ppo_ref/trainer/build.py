"""Building a run: its models, optimizer, scorers and prompts, in one place (:class:`TrainerState`).

:class:`TrainingSetup` is what a run trains (from a task, or from local checkpoints and a prompts
file); :class:`TrainerState` builds from it everything the stages use (:mod:`ppo_ref.trainer.stages`):
the policy and critic (:class:`~ppo_ref.trainer.models.ActorCritic`), the frozen reference, the
training and evaluation scorers, the optimizer, the KL controller, the encoded prompts, the device
and mixed precision, and hands the trained models to the data-parallel backend. A resumed run
loads its models' weights here, before that hand-over (:mod:`ppo_ref.trainer.resume`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from accelerate import Accelerator  # type: ignore[import-untyped, unused-ignore]
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ppo_ref import AdaptiveKLController, FixedKLController
from ppo_ref.trainer import resume as resuming
from ppo_ref.trainer.checkpoint import Checkpoint
from ppo_ref.trainer.config import TrainerConfig
from ppo_ref.trainer.distributed import DataParallel, default_accelerator
from ppo_ref.trainer.models import (
    ActorCritic,
    ScalarHeadCritic,
    disable_dropout,
    frozen_copy,
    parameter_dtype,
    parameter_fingerprint,
)
from ppo_ref.trainer.scoring import FunctionScorer, RewardModelScorer, Scorer

__all__ = ["TrainerState", "TrainingSetup", "reward_provenance"]

_T = TypeVar("_T")


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


class TrainerState:
    """Everything the stages of a run read: built from a config and a :class:`TrainingSetup`.

    ``accelerator`` defaults to :func:`~ppo_ref.trainer.distributed.default_accelerator`; under
    ``torchrun`` or ``accelerate launch`` its processes split every batch (see
    :mod:`ppo_ref.trainer.distributed`). ``resume``: a checkpoint (or run directory) whose model
    weights are loaded before the models are handed to the data-parallel backend; it stays in
    :attr:`checkpoint` for the rest of the trainer's state.
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
        self.checkpoint: Checkpoint | None = checkpoint
        self._build_models()
        self.kl_controller: FixedKLController = (
            AdaptiveKLController(config.kl_coef, config.kl_target, config.kl_horizon)
            if config.adaptive_kl
            else FixedKLController(config.kl_coef)
        )
        if checkpoint is not None:
            resuming.load_models(checkpoint, self.actor_critic, self.reference, self.setup.reward_model)
        for frozen in (self.reference, self.setup.reward_model):
            if frozen is not None:  # the same frozen weights on every process
                self.parallel.broadcast_parameters(frozen)
        self.reference_fingerprint = parameter_fingerprint(self.reference)
        self._prepare()

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
        if not config.uses_critic:  # a critic-free estimator: no value model at all
            self.actor_critic = ActorCritic(policy)
        elif config.critic == "value-head":
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
        if self.actor_critic.has_critic:
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

    def in_chunks(self, count: int, run: Callable[[slice], _T]) -> list[_T]:
        """``run`` on consecutive blocks of ``forward_batch_size`` of ``count`` rows (None: all at
        once), each under autocast: the one chunking loop of generation and the no-grad forwards."""
        step = self.config.forward_batch_size or count
        parts = []
        for start in range(0, count, step):
            with self.autocast():
                parts.append(run(slice(start, start + step)))
        return parts

    def clip_grad_norm(self, parameters: list[nn.Parameter], max_norm: float) -> Tensor:
        """Clip through the accelerator; the norm before clipping (0 where DeepSpeed reports none)."""
        norm = self.accelerator.clip_grad_norm_(parameters, max_norm)
        if norm is None and self.parallel.backend == "deepspeed":
            # DeepSpeed clips inside its step and may report no norm: nothing to check here.
            return torch.tensor(0.0)
        return norm if isinstance(norm, Tensor) else torch.tensor(float("nan") if norm is None else norm)


def _special_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, int]:
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    if not isinstance(eos, int):
        raise ValueError("tokenizer: expected eos_token_id to be set")
    return eos, pad if isinstance(pad, int) else eos
