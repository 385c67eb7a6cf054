"""The PPO-RLHF run, top to bottom: :meth:`PPOTrainer.train` is the spine of the algorithm.

Each iteration: 1. sample prompts, 2. generate, 3. score, 4. forward (old, reference log-probs and
values), 5. token rewards, 6. advantages (:mod:`ppo_ref.trainer.stages`, with the estimator table
of :mod:`ppo_ref.trainer.estimators`), 7. the PPO update epochs (:mod:`ppo_ref.trainer.update`),
8. checks, metrics (:mod:`ppo_ref.trainer.metrics`) and checkpoints (:mod:`ppo_ref.trainer.resume`).
What a run is built from (models, optimizer, scorers): :mod:`ppo_ref.trainer.build`; the data the
stages hand on: :mod:`ppo_ref.trainer.data`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator  # type: ignore[import-untyped, unused-ignore]

import ppo_ref
from ppo_ref.trainer import resume as resuming
from ppo_ref.trainer import stages
from ppo_ref.trainer.build import TrainerState, TrainingSetup, reward_provenance
from ppo_ref.trainer.checkpoint import remove_stale_temporaries
from ppo_ref.trainer.config import TrainerConfig
from ppo_ref.trainer.data import EvalResult, Rollout
from ppo_ref.trainer.interrupt import StopRequest
from ppo_ref.trainer.metrics import (
    AuditLog,
    IdenticalScoreWatch,
    MetricsLogger,
    ProgressBar,
    audit_records,
    iteration_metrics,
    plot_metrics,
    write_summary,
)
from ppo_ref.trainer.stages import ReferenceModelChangedError
from ppo_ref.trainer.update import UpdateStats

__all__ = [
    "EvalResult",
    "PPOTrainer",
    "ReferenceModelChangedError",
    "Rollout",
    "TrainingSetup",
    "reward_provenance",
]


class PPOTrainer(TrainerState):
    """PPO-RLHF on transformers models: a :class:`~ppo_ref.trainer.build.TrainerState` that runs.

    ``accelerator``: see :class:`~ppo_ref.trainer.build.TrainerState`. ``resume`` is a checkpoint
    directory, or a run directory whose newest checkpoint is taken: the models, optimizer, KL
    coefficient, counters, RNG states and metrics history are loaded, and :meth:`train` continues
    with the next iteration (``config`` must match the checkpoint's except for
    :data:`~ppo_ref.trainer.config.RESUME_MUTABLE_FIELDS`).
    """

    def __init__(
        self,
        config: TrainerConfig,
        setup: TrainingSetup,
        accelerator: Accelerator | None = None,
        resume: str | Path | None = None,
    ) -> None:
        super().__init__(config, setup, accelerator, resume)
        self.nonfinite_steps = 0
        self.skipped_samples = 0
        self.start_iteration = 0
        self.history: list[dict[str, Any]] = []
        self.eval_initial: EvalResult | None = None
        self.resumed_from: Path | None = None
        self.last_checkpoint: Path | None = None
        if self.checkpoint is not None:
            resuming.load_optimizer(self.checkpoint, self.actor_critic, self.optimizer)
            self.load_state_dict(resuming.trainer_state(self.checkpoint))
            resuming.restore_rng(self.checkpoint, self.parallel)

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

    # -- the stages, as methods ------------------------------------------------------------------

    def collect_rollout(self, iteration: int, timings: dict[str, float] | None = None) -> Rollout:
        """Stages 1-6 (:func:`ppo_ref.trainer.stages.collect_rollout`)."""
        return stages.collect_rollout(self, iteration, timings)

    def update(self, rollout: Rollout) -> UpdateStats:
        """Stage 7 (:func:`ppo_ref.trainer.stages.update`); counts the skipped non-finite steps."""
        stats = stages.update(self, rollout, self.nonfinite_steps)
        self.nonfinite_steps += stats.skipped_steps
        return stats

    def check_reference_unchanged(self) -> None:
        """Raise if the frozen reference's parameters differ from their initial fingerprint."""
        stages.check_reference_unchanged(self)

    def evaluate(self) -> EvalResult:
        """The held-out evaluation (:func:`ppo_ref.trainer.stages.evaluate`)."""
        return stages.evaluate(self)

    def iteration_metrics(
        self, rollout: Rollout, stats: UpdateStats, timings: dict[str, float]
    ) -> dict[str, Any]:
        """Stage 8: the metrics.jsonl record (:func:`ppo_ref.trainer.metrics.iteration_metrics`)."""
        critic, well_formed = self.config.uses_critic, self.setup.well_formed
        return iteration_metrics(rollout, stats, timings, self.nonfinite_steps, well_formed, critic=critic)

    def audit_records(self, rollout: Rollout, count: int) -> list[dict[str, Any]]:
        """The first ``count`` samples in full (:func:`ppo_ref.trainer.metrics.audit_records`)."""
        return audit_records(rollout, count, critic=self.config.uses_critic)

    def run_title(self) -> str:
        """The plots' title: the task (or policy) and seed, and the reward when ``--reward`` set it.

        Example: ``"positive-review, seed 0"``; with ``reward = "my_rewards:vowels"``:
        ``"reward my_rewards:vowels (policy positive-review), seed 0"``.
        """
        if self.config.reward is None:
            return f"{self.setup.name}, seed {self.config.seed}"
        return f"reward {self.config.reward} (policy {self.setup.name}), seed {self.config.seed}"

    @staticmethod
    def _warn(message: str, status: Callable[[str], None] | None, progress: ProgressBar) -> None:
        """A warning on the command's status lines, or as a Python ``RuntimeWarning`` without them."""
        if status is None:
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        else:
            progress.write(lambda: status(f"warning: {message}"))

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
        identical_scores = IdenticalScoreWatch()
        ppo_started = time.perf_counter()
        try:
            with StopRequest() as stop, MetricsLogger(out_dir, config.tensorboard, enabled=main) as logger:
                for record in records:  # a resumed run: its earlier iterations, from the checkpoint
                    logger.write(record, tensorboard=False)
                for iteration in range(start, config.iterations):
                    timings: dict[str, float] = {}
                    began = time.perf_counter()
                    # 1-6. Sample prompts, generate, score, forward, token rewards, advantages.
                    rollout = self.collect_rollout(iteration, timings)
                    clock = stages.Clock(self.device, timings)
                    # 7. PPO epochs over reshuffled minibatches.
                    stats = self.update(rollout)
                    clock.lap("seconds_update")
                    # 8. Checks (the step-0 identity and non-finite steps are checked in 7), metrics.
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
                    warning = identical_scores.observe(rollout)
                    if warning is not None and main:
                        self._warn(warning, status, progress)
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
            plot_metrics(out_dir, records, run=self.run_title(), evaluations=evaluations)
        summary: dict[str, Any] = {
            "task": self.setup.name,
            "reward": reward_provenance(self.setup),
            "seed": config.seed,
            "advantage_estimator": config.advantage_estimator,
            "critic": config.critic if config.uses_critic else "none",
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
