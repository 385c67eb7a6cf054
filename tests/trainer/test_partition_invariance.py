"""The split of a minibatch never changes the update (issue 12): 1 x 64, 4 x 16 and 2 processes x 2 x 16.

Every reference loss the update calls gets the *whole* minibatch's counts (``token_count`` /
``row_count``, spec AGG-2), so micro-batches (gradient accumulation) and processes (data
parallelism) only change the summation order. Checked in float64 for every ``loss_agg`` mode and
every policy loss, with the value loss (a critic), the KL loss (``kl_in = "loss"``), the entropy
bonus, the dual clip, clip-higher and the rollout correction spread over the cases.

The optimizer here is plain SGD without gradient clipping, so that the parameters show the
gradient itself: AdamW's first steps and norm clipping are blind to a gradient's scale (a split
that doubled the gradient would pass with them). Two epochs over the one minibatch: the second
starts away from the rollout policy, so the clipped branches are reached.

Run as a script (``torchrun --nproc_per_node 2 test_partition_invariance.py OUT``) this file is
the worker of the two-process test: it writes each case's parameters to ``OUT``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_task import tiny_config, tiny_setup

from ppo_ref.trainer import PPOTrainer, TrainingSetup
from ppo_ref.trainer.data import Rollout
from ppo_ref.trainer.distributed import exit_launched_process
from ppo_ref.trainer.update import UpdateStats, minibatch_backward

ROWS = 64
MICRO = 16
LEARNING_RATE = 2.0

BASE: dict[str, Any] = {
    "rollout_batch_size": ROWS,
    "num_minibatches": 1,
    "ppo_epochs": 2,
    "max_new_tokens": 6,
    "max_grad_norm": None,
    "entropy_coef": 0.01,
    "iterations": 1,
}

CASES: dict[str, dict[str, Any]] = {
    "ppo-token-mean": {"clip_eps_high": 0.28, "dual_clip": 1.5, "kl_in": "loss", "kl_coef": 0.1},
    "ppo-seq-mean-token-mean": {"loss_agg": "seq-mean-token-mean"},
    "ppo-seq-mean-token-sum": {"loss_agg": "seq-mean-token-sum", "kl_in": "loss", "kl_loss_estimator": "k2"},
    "ppo-seq-mean-token-sum-norm": {
        "loss_agg": "seq-mean-token-sum-norm",
        "rollout_correction": "sequence-truncate",
        "rollout_temperature": 1.3,
    },
    "cispo-token-mean": {  # with top-p, the correction's kept counts go through the wrapped forward
        "policy_loss": "cispo",
        "clip_eps_high": 0.28,
        "rollout_correction": "token-mask",
        "top_p": 0.9,
    },
    "cispo-seq-mean-token-mean": {"policy_loss": "cispo", "loss_agg": "seq-mean-token-mean"},
    "cispo-seq-mean-token-sum": {"policy_loss": "cispo", "loss_agg": "seq-mean-token-sum"},
    "cispo-seq-mean-token-sum-norm": {
        "policy_loss": "cispo",
        "loss_agg": "seq-mean-token-sum-norm",
        "norm_constant": 4.0,
        "kl_in": "loss",
        "kl_loss_estimator": "k3+",
    },
    "gspo-seq-mean-token-mean": {
        "policy_loss": "gspo",
        "advantage_estimator": "grpo",
        "group_size": 8,
        "loss_agg": "seq-mean-token-mean",
        "rollout_correction": "geometric-mask",
        "rollout_correction_low": 0.8,
        "rollout_correction_high": 1.25,
        "rollout_temperature": 1.3,
    },
}
"""Case name -> config overrides: each policy loss with each of its aggregations."""


def float64_setup() -> TrainingSetup:
    """The tiny task with a float64 policy (critic and reference follow its dtype)."""
    setup = tiny_setup()
    setup.policy.double()
    return setup


def case_trainer(name: str, out: Path, micro_batch_size: int | None, accelerator: Any = None) -> PPOTrainer:
    config = tiny_config(out, **BASE, **CASES[name], micro_batch_size=micro_batch_size)
    return PPOTrainer(config, float64_setup(), accelerator)


def trained(trainer: PPOTrainer, rollout: Rollout) -> tuple[dict[str, torch.Tensor], UpdateStats]:
    """Stage 7 on ``rollout`` with SGD (no clipping); the trained module's parameters and the stats."""
    parameters = trainer.actor_critic.policy_parameters() + trainer.actor_critic.critic_parameters()
    trainer.optimizer = torch.optim.SGD(parameters, lr=LEARNING_RATE)
    stats = trainer.update(rollout)
    module = trainer.accelerator.unwrap_model(trainer.actor_critic.train_runner)
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    return state, stats


def _largest_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    assert first.keys() == second.keys()
    return max(float((first[k] - second[k]).abs().max()) for k in first)


@pytest.mark.parametrize("name", sorted(CASES))
def test_micro_batches_give_the_parameters_of_the_whole_minibatch(out_dir: Path, name: str) -> None:
    """1 x 64 and 4 x 16 (gradient accumulation) give the same parameters after two SGD steps."""
    results = []
    for micro in (None, MICRO):
        trainer = case_trainer(name, out_dir, micro)
        initial = {k: v.detach().clone() for k, v in trainer.actor_critic.module.state_dict().items()}
        results.append((trained(trainer, trainer.collect_rollout(0)), initial))
    (whole, stats), initial = results[0]
    (split, _), _ = results[1]
    assert stats.optimizer_steps == 2
    moved = _largest_difference(whole, initial)
    difference = _largest_difference(whole, split)
    assert moved > 1e-3, moved  # the update did something, far more than the splits differ
    assert difference < 1e-10, difference
    if name == "ppo-token-mean":  # the second epoch reaches the clipped branches
        assert stats.clipfrac > 0 and stats.dual_clip_frac is not None and stats.dual_clip_frac > 0
        assert stats.kl_loss is not None and stats.kl_loss > 0


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_process_share_is_its_part_of_the_gradient(out_dir: Path, name: str) -> None:
    """Away from the rollout policy (so every branch of the losses is live), the gradient of the
    whole minibatch equals the sum of two processes' shares of it, each in micro-batches of 16."""
    # imported here: this file also runs as a torchrun worker, where tests/ is not importable
    from tests.model_fixtures import TwoProcessesInOne

    trainer = case_trainer(name, out_dir, MICRO)
    batch = trainer.collect_rollout(0).training_batch()
    with torch.no_grad():  # move the policy off the rollout's: ratios away from 1
        generator = torch.Generator().manual_seed(0)
        for parameter in trainer.actor_critic.policy_parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))
    parameters = trainer.actor_critic.policy_parameters() + trainer.actor_critic.critic_parameters()
    kl_coef = trainer.kl_controller.value
    whole_config = tiny_config(out_dir, **BASE, **CASES[name])

    def gradient(config: Any, **shard: Any) -> list[torch.Tensor]:
        for rank_shard in shard.get("ranks", [{}]):
            minibatch_backward(
                trainer.actor_critic,
                batch,
                config,
                trainer.autocast,
                torch.Tensor.backward,
                kl_coef=kl_coef,
                **rank_shard,
            )
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in parameters]
        trainer.optimizer.zero_grad(set_to_none=True)
        return grads

    trainer.optimizer.zero_grad(set_to_none=True)
    whole = gradient(whole_config)
    ranks = [{"rows": slice(32 * r, 32 * r + 32), "collectives": TwoProcessesInOne(r)} for r in (0, 1)]
    shared = gradient(trainer.config, ranks=ranks)
    size = max(float(g.abs().max()) for g in whole)
    worst = max(float((a - b).abs().max()) for a, b in zip(whole, shared, strict=True))
    assert size > 1e-4 and worst < 1e-12 * max(size, 1.0), (size, worst)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_give_the_parameters_of_one(tmp_path: Path) -> None:
    """2 processes (torchrun, gloo) x 2 micro-batches x 16 rows give the parameters of 1 x 64, per case."""
    from safetensors.torch import load_file

    # imported here: this file also runs as a torchrun worker, where tests/ is not importable
    from tests.model_fixtures import torchrun

    torchrun(__file__, str(tmp_path / "two"), timeout=900)
    for name in sorted(CASES):
        trainer = case_trainer(name, tmp_path / name, None)
        initial = {k: v.detach().clone() for k, v in trainer.actor_critic.module.state_dict().items()}
        one, _ = trained(trainer, trainer.collect_rollout(0))
        ranks = [load_file(str(tmp_path / "two" / f"{name}-rank{r}.safetensors")) for r in (0, 1)]
        assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0]), name  # DDP kept them equal
        two = {k: ranks[0][k] for k in one if k in ranks[0]}
        assert len(two) >= len(one) - 1, name  # (a tied lm_head is saved once)
        one = {k: one[k] for k in two}
        assert _largest_difference(one, {k: v.detach() for k, v in initial.items() if k in two}) > 1e-3
        assert _largest_difference(one, two) < 1e-10, (name, _largest_difference(one, two))


def _worker(out: Path) -> None:
    """Each case's update as one rank of two (micro-batches of 16); writes its parameters."""
    from accelerate import Accelerator
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True, mixed_precision="no")
    out.mkdir(parents=True, exist_ok=True)
    for name in sorted(CASES):
        trainer = case_trainer(name, out / f"run-{name}-{accelerator.process_index}", MICRO, accelerator)
        state, _ = trained(trainer, trainer.collect_rollout(0))
        unique = {k: v.contiguous() for k, v in state.items() if k != "policy.lm_head.weight"}
        save_file(unique, str(out / f"{name}-rank{accelerator.process_index}.safetensors"))
    exit_launched_process(accelerator)  # the last trainer still held: no teardown hang or abort


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
