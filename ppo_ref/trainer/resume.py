"""A trainer's state into a checkpoint and back (the file format is :mod:`ppo_ref.trainer.checkpoint`).

Saved: the policy, the critic (separate model or value head), the frozen reference, the reward
model when the run has one, the optimizer state (AdamW moments and step counts, keyed by parameter
name), the KL coefficient, the counters (non-finite steps, skipped samples), the initial evaluation,
the number of completed iterations, the config, the metrics history and every process's global RNG
states. There is no learning-rate scheduler to save.

Why a resumed run is exact: nothing else carries over between iterations. Every random draw of
the trainer is a function of (seed, stream, iteration, sample index or epoch), never of a global
generator (prompt choice, sampling noise, minibatch shuffles, evaluation noise: see
:mod:`ppo_ref.trainer.seeding`), dropout is off in every model, and every model stays in eval mode.
So iteration N of a resumed run draws what iteration N of the straight run drew, from the same
weights and optimizer state. The optimizer state is keyed by parameter name and the rollout is
global, so a checkpoint written by W processes resumes on any number of processes (DeepSpeed
excepted: its optimizer state is not saved, and resuming under it is refused).
"""

from __future__ import annotations

import math
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

import ppo_ref
from ppo_ref.trainer.checkpoint import (
    CHECKPOINTS,
    Checkpoint,
    capture_rng_state,
    checkpoint_name,
    load_checkpoint,
    restore_rng_state,
    write_checkpoint,
)
from ppo_ref.trainer.config import RESUME_MUTABLE_FIELDS, TrainerConfig
from ppo_ref.trainer.data import EvalResult
from ppo_ref.trainer.distributed import DataParallel
from ppo_ref.trainer.models import ActorCritic

__all__ = [
    "check_resume_config",
    "load_models",
    "load_optimizer",
    "open_checkpoint",
    "restore_rng",
    "resumed_config",
    "save_checkpoint",
    "trainer_state",
]

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def check_resume_config(config: TrainerConfig, checkpoint: Checkpoint) -> None:
    """Raise ``ValueError`` if ``config`` changes a field that determines the run's math, or asks
    for fewer iterations than the checkpoint has done."""
    try:
        saved = TrainerConfig(**checkpoint.config)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"resume: the config saved in {checkpoint.path} is not valid here ({error})"
        ) from None
    for f in fields(TrainerConfig):
        if f.name in RESUME_MUTABLE_FIELDS:
            continue
        ours, theirs = getattr(config, f.name), getattr(saved, f.name)
        if ours != theirs:
            raise ValueError(
                f"resume: config field {f.name!r} is {ours!r} but {theirs!r} in {checkpoint.path}; a resumed "
                f"run keeps the settings that determine its math (it may change only "
                f"{', '.join(sorted(RESUME_MUTABLE_FIELDS))})"
            )
    if config.iterations < checkpoint.iteration:
        raise ValueError(
            f"resume: iterations={config.iterations} is fewer than the {checkpoint.iteration} iterations "
            f"already done in {checkpoint.path} (--iterations is the run's total)"
        )


def open_checkpoint(path: str | Path, config: TrainerConfig) -> Checkpoint:
    """The checkpoint ``path`` means (a run directory or one checkpoint), checked against ``config``."""
    checkpoint = load_checkpoint(path)
    check_resume_config(config, checkpoint)
    return checkpoint


def resumed_config(checkpoint: Checkpoint, user_values: dict[str, Any]) -> TrainerConfig:
    """The config of a resumed run: the checkpoint's, with the fields the user set on top.

    ``out`` defaults to the run directory the checkpoint belongs to. A user value that changes a
    field outside :data:`~ppo_ref.trainer.config.RESUME_MUTABLE_FIELDS` is a ``ValueError``.
    """
    values = dict(checkpoint.config)
    if "out" not in user_values:
        values["out"] = str(checkpoint.path.parent.parent)
    values.update(user_values)
    config = TrainerConfig(**values)
    check_resume_config(config, checkpoint)
    return config


# -- saving -------------------------------------------------------------------------------------------


def _inner_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    inner: torch.optim.Optimizer = getattr(optimizer, "optimizer", optimizer)
    return inner


def _trained_state_dict(parallel: DataParallel, actor_critic: ActorCritic) -> dict[str, Tensor]:
    """The full state dict of the policy + critic module (a collective under FSDP or DeepSpeed)."""
    backend, runner = parallel.backend, actor_critic.train_runner
    if backend == "deepspeed":
        state: dict[str, Tensor] = parallel.accelerator.get_state_dict(runner)
        return state
    if backend == "fsdp":
        full: dict[str, Tensor] = get_model_state_dict(actor_critic.module, options=_FULL)  # type: ignore[assignment]
        return full
    return actor_critic.module.state_dict()


def _split(state: dict[str, Tensor]) -> dict[str, dict[str, Tensor]]:
    """``policy.*`` -> policy, ``critic.*`` and ``value_head.*`` -> critic (absent in a critic-free run)."""
    parts: dict[str, dict[str, Tensor]] = {"policy": {}}
    for key, tensor in state.items():
        head, _, rest = key.partition(".")
        parts.setdefault("policy" if head == "policy" else "critic", {})[rest] = tensor
    return parts


def save_checkpoint(
    completed: int,
    trainer_state: dict[str, Any],
    *,
    config: TrainerConfig,
    parallel: DataParallel,
    actor_critic: ActorCritic,
    optimizer: Any,
    reference: nn.Module,
    reward_model: nn.Module | None,
) -> Path:
    """Write a run's state after ``completed`` iterations; every process must call this.

    ``trainer_state`` is the trainer's ``state_dict()`` (KL coefficient, counters, initial
    evaluation, metrics history). Under FSDP and DeepSpeed gathering the state is a collective; the
    main process writes. Returns the checkpoint's path (the same on every process).
    """
    trained = _split(_trained_state_dict(parallel, actor_critic))
    optimizer_state = None
    if parallel.backend != "deepspeed":
        optimizer_state = get_optimizer_state_dict(
            actor_critic.module, _inner_optimizer(optimizer), options=_FULL
        )
    rng_states = parallel.gather_list([capture_rng_state()])
    path = Path(config.out) / CHECKPOINTS / checkpoint_name(completed)
    if parallel.is_main:
        models: dict[str, dict[str, Tensor]] = {**trained, "reference": reference.state_dict()}
        if reward_model is not None:
            models["reward_model"] = reward_model.state_dict()
        initial = trainer_state["eval_initial"]
        state = {
            "config": asdict(config),
            "kl_coef": trainer_state["kl_coef"],
            "nonfinite_steps": trainer_state["nonfinite_steps"],
            "skipped_samples": trainer_state["skipped_samples"],
            "eval_initial": None if initial is None else asdict(initial),
            "processes": parallel.world_size,
            "data_parallel": parallel.backend,
            "scheduler": None,
            "versions": {"ppo_ref": ppo_ref.__version__, "torch": torch.__version__},
        }
        path = write_checkpoint(
            config.out,
            completed,
            models=models,
            optimizer_state=optimizer_state,
            rng_states=rng_states,
            state=state,
            metrics_records=trainer_state["history"][:completed],
        )
    parallel.barrier()
    return path


# -- loading ------------------------------------------------------------------------------------------


def _load(module: nn.Module, state: dict[str, Tensor], what: str, checkpoint: Checkpoint) -> None:
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise ValueError(
            f"resume: the {what} in {checkpoint.path} does not fit this run's model: {error}"
        ) from None


def load_models(
    checkpoint: Checkpoint, actor_critic: ActorCritic, reference: nn.Module, reward_model: nn.Module | None
) -> None:
    """Load the weights of every model (before the models are handed to the data-parallel backend)."""
    _load(actor_critic.policy, checkpoint.state_dict("policy"), "policy", checkpoint)
    critic = actor_critic.critic_model()
    if (critic is not None) != checkpoint.has("critic"):
        raise ValueError(f"resume: {checkpoint.path} and this run disagree on having a critic")
    if critic is not None:
        _load(critic, checkpoint.state_dict("critic"), "critic", checkpoint)
    _load(reference, checkpoint.state_dict("reference"), "reference", checkpoint)
    if (reward_model is not None) != checkpoint.has("reward_model"):
        raise ValueError(f"resume: {checkpoint.path} and this run disagree on having a reward model")
    if reward_model is not None:
        _load(reward_model, checkpoint.state_dict("reward_model"), "reward model", checkpoint)


def _eval_result(saved: dict[str, Any]) -> EvalResult:
    """An :class:`EvalResult` from its JSON (which wrote NaN as null)."""

    def number(key: str) -> float:
        value = saved.get(key)
        return math.nan if value is None else float(value)

    well_formed = saved.get("well_formed_rate")
    return EvalResult(
        score=number("score"),
        kl_ref=number("kl_ref"),
        well_formed_rate=None if well_formed is None else float(well_formed),
        eos_rate=number("eos_rate"),
        samples=int(saved["samples"]),
        skipped_samples=int(saved.get("skipped_samples", 0)),
    )


def load_optimizer(checkpoint: Checkpoint, actor_critic: ActorCritic, optimizer: Any) -> None:
    """Load the optimizer state (after the models are handed to the data-parallel backend)."""
    optimizer_state = checkpoint.optimizer_state()
    if optimizer_state is None:
        raise ValueError(f"resume: {checkpoint.path} holds no optimizer state (written under DeepSpeed)")
    set_optimizer_state_dict(
        actor_critic.module,
        _inner_optimizer(optimizer),
        optimizer_state,
        options=StateDictOptions(full_state_dict=True),
    )


def trainer_state(checkpoint: Checkpoint) -> dict[str, Any]:
    """The trainer's ``load_state_dict()`` input saved in ``checkpoint``: the KL coefficient, the
    counters, the completed iterations, the metrics history, the initial evaluation and the path."""
    state = checkpoint.state
    initial = state.get("eval_initial")
    return {
        "kl_coef": float(state["kl_coef"]),
        "nonfinite_steps": int(state["nonfinite_steps"]),
        "skipped_samples": int(state["skipped_samples"]),
        "iteration": checkpoint.iteration,
        "history": checkpoint.metrics_records()[: checkpoint.iteration],
        "eval_initial": None if initial is None else _eval_result(initial),
        "resumed_from": checkpoint.path,
    }


def restore_rng(checkpoint: Checkpoint, parallel: DataParallel) -> None:
    """Restore this process's global RNG states (when the process count is the checkpoint's)."""
    rng_states = checkpoint.rng_states()
    if len(rng_states) == parallel.world_size:
        restore_rng_state(rng_states[parallel.rank])
