"""One tiny PPO run, in one process or as a rank of ``torchrun --nproc_per_node 2`` (float64).

``python data_parallel_worker.py OUT`` (or under torchrun) trains the tiny task of
tests/trainer/tiny_task.py for two iterations with the adaptive KL controller, gradient
accumulation over micro-batches of one row and every sample audited, then writes this process's
trained parameters to ``OUT/parameters-rank{R}.safetensors``. The models are float64 so that the
only differences between one and two processes (summation order, batch shapes) stay near 1e-16.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))

from tiny_task import tiny_config, tiny_setup

from ppo_ref.trainer import PPOTrainer, TrainerConfig, TrainingSetup
from ppo_ref.trainer.distributed import exit_launched_process

ITERATIONS = 2


def float64_setup() -> TrainingSetup:
    """The tiny task with a float64 policy (the critic, head and reference follow its dtype)."""
    setup = tiny_setup()
    setup.policy.double()
    return setup


def worker_config(out: Path) -> TrainerConfig:
    """Batch 8 in 2 minibatches of 4 (2 rows per process), micro-batches of 1 row, adaptive KL."""
    return tiny_config(
        out,
        iterations=ITERATIONS,
        rollout_batch_size=8,
        num_minibatches=2,
        ppo_epochs=2,
        micro_batch_size=1,
        adaptive_kl=True,
        kl_coef=0.2,
        kl_target=0.01,
        kl_horizon=100.0,
        eval_samples=8,
        audit_samples=8,
        entropy_coef=0.01,
    )


def run(out: Path, accelerator: Accelerator | None = None) -> PPOTrainer:
    """Train and write this process's parameters; returns the trainer."""
    trainer = PPOTrainer(worker_config(out), float64_setup(), accelerator)
    trainer.train()
    state = {f"policy.{k}": v for k, v in trainer.policy.state_dict().items()}
    critic = trainer.actor_critic.critic
    assert critic is not None
    state.update({f"critic.{k}": v for k, v in critic.state_dict().items()})
    unique = {k: v.detach().clone().contiguous() for k, v in state.items() if k != "policy.lm_head.weight"}
    save_file(unique, str(out / f"parameters-rank{trainer.parallel.rank}.safetensors"))
    return trainer


if __name__ == "__main__":
    torch.set_num_threads(1)
    trainer = run(Path(sys.argv[1]), Accelerator(cpu=True, mixed_precision="no"))
    exit_launched_process(trainer.accelerator)  # the trainer still held: no teardown hang or abort
