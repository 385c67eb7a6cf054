"""Stage 7: token-count-normalised gradient accumulation, the frozen reference, non-finite steps."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from tiny_task import tiny_config, tiny_setup

from ppo_ref.trainer import PPOTrainer, ReferenceModelChangedError, TooManyNonFiniteStepsError
from ppo_ref.trainer.update import minibatch_backward


def _gradients(trainer: PPOTrainer) -> list[torch.Tensor]:
    params = trainer.actor_critic.policy_parameters() + trainer.actor_critic.critic_parameters()
    return [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params]


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_give_the_gradient_of_the_whole_minibatch(out_dir: Path, loss_agg: str) -> None:
    config = tiny_config(
        out_dir, rollout_batch_size=8, num_minibatches=1, loss_agg=loss_agg, entropy_coef=0.01
    )
    trainer = PPOTrainer(config, tiny_setup())
    rollout = trainer.collect_rollout(0)
    batch = rollout.training_batch()
    lengths = batch.mask.sum(dim=1)
    assert len(set(lengths.tolist())) > 1, "micro-batches must hold different token counts for this test"
    results, gradients = [], []
    for micro in (None, 1, 3):
        trainer.optimizer.zero_grad(set_to_none=True)
        micro_config = tiny_config(
            out_dir,
            rollout_batch_size=8,
            num_minibatches=1,
            loss_agg=loss_agg,
            entropy_coef=0.01,
            micro_batch_size=micro,
        )
        results.append(
            minibatch_backward(
                trainer.actor_critic, batch, micro_config, trainer.autocast, torch.Tensor.backward
            )
        )
        gradients.append(_gradients(trainer))
    for other in gradients[1:]:
        for full, split in zip(gradients[0], other, strict=True):
            assert torch.allclose(full, split, atol=1e-6, rtol=1e-4)
    for other in results[1:]:
        assert other.policy_loss == pytest.approx(results[0].policy_loss, abs=1e-6)
        assert other.value_loss == pytest.approx(results[0].value_loss, abs=1e-6)
        assert other.clipfrac == pytest.approx(results[0].clipfrac, abs=1e-6)
    assert any(float(g.abs().sum()) > 0 for g in gradients[0])
    if loss_agg == "token-mean":
        # The bug this guards against (E4): the plain mean of per-row token means is another gradient.
        one_row = tiny_config(out_dir, rollout_batch_size=8, num_minibatches=1, entropy_coef=0.01)
        naive = [torch.zeros_like(g) for g in gradients[0]]
        for row in range(batch.size):
            trainer.optimizer.zero_grad(set_to_none=True)
            minibatch_backward(
                trainer.actor_critic,
                batch.rows(slice(row, row + 1)),
                one_row,
                trainer.autocast,
                torch.Tensor.backward,
            )
            naive = [n + g / batch.size for n, g in zip(naive, _gradients(trainer), strict=True)]
        assert not all(
            torch.allclose(n, g, atol=1e-6, rtol=1e-4) for n, g in zip(naive, gradients[0], strict=True)
        )


def test_the_reference_model_never_changes(out_dir: Path) -> None:
    setup = tiny_setup()
    initial = copy.deepcopy(setup.policy.state_dict())
    trainer = PPOTrainer(tiny_config(out_dir, iterations=2), setup)
    summary = trainer.train()
    reference = trainer.reference.state_dict()
    assert all(torch.equal(reference[name], initial[name]) for name in initial)
    trained = trainer.policy.state_dict()
    assert any(not torch.equal(trained[name], initial[name]) for name in initial)
    assert summary["kl_ref_initial"] == pytest.approx(0.0, abs=1e-6)  # policy == reference at the start
    assert not any(p.requires_grad for p in trainer.reference.parameters())
    # The per-iteration check notices a change.
    with torch.no_grad():
        next(trainer.reference.parameters()).add_(1e-3)
    with pytest.raises(ReferenceModelChangedError):
        trainer.check_reference_unchanged()


def test_non_finite_steps_are_skipped_counted_and_stop_the_run(out_dir: Path) -> None:
    trainer = PPOTrainer(tiny_config(out_dir, max_nonfinite_steps=10), tiny_setup())
    rollout = trainer.collect_rollout(0)
    critic = trainer.actor_critic.critic
    assert critic is not None
    with torch.no_grad():
        critic.head.weight.fill_(float("nan"))  # every value forward is now NaN
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    stats = trainer.update(rollout)
    assert stats.skipped_steps == 4 and stats.optimizer_steps == 0
    assert trainer.nonfinite_steps == 4
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters(), strict=True))
    strict = PPOTrainer(tiny_config(out_dir, max_nonfinite_steps=1), tiny_setup())
    rollout = strict.collect_rollout(0)
    assert strict.actor_critic.critic is not None
    with torch.no_grad():
        strict.actor_critic.critic.head.weight.fill_(float("nan"))
    with pytest.raises(TooManyNonFiniteStepsError, match="max_nonfinite_steps=1"):
        strict.update(rollout)


def test_early_stop_at_the_target_approx_kl(out_dir: Path) -> None:
    config = tiny_config(out_dir, target_approx_kl=1e-6, learning_rate=1e-2, ppo_epochs=4)
    trainer = PPOTrainer(config, tiny_setup())
    stats = trainer.update(trainer.collect_rollout(0))
    assert stats.early_stopped
    assert stats.optimizer_steps < config.ppo_epochs * config.num_minibatches
    assert stats.minibatches[-1].approx_kl > 1e-6
    assert all(m.approx_kl <= 1e-6 for m in stats.minibatches[:-1])


@pytest.mark.parametrize("critic", ["value-head", "reward"])
def test_each_critic_kind_trains(out_dir: Path, critic: str) -> None:
    trainer = PPOTrainer(tiny_config(out_dir, critic=critic), tiny_setup(reward_model=True))
    rollout = trainer.collect_rollout(0)
    if critic == "reward":  # the critic starts from the reward model: its values are not all 0
        assert float(rollout.values[rollout.mask].abs().max()) > 0
    head = trainer.actor_critic.value_head if critic == "value-head" else trainer.actor_critic.critic
    assert head is not None
    before = [p.detach().clone() for p in head.parameters()]
    stats = trainer.update(rollout)
    assert stats.optimizer_steps == 4 and stats.logprob_check_max_abs_diff < 1e-5
    assert any(not torch.equal(a, b) for a, b in zip(before, head.parameters(), strict=True))


def test_bf16_autocast_keeps_the_ppo_math_in_float32(out_dir: Path) -> None:
    trainer = PPOTrainer(tiny_config(out_dir, mixed_precision="bf16"), tiny_setup())
    assert trainer.autocast_dtype == torch.bfloat16 and trainer.logprob_tolerance == 0.25
    rollout = trainer.collect_rollout(0)
    for tensor in (rollout.old_logprobs, rollout.ref_logprobs, rollout.values, rollout.advantages):
        assert tensor.dtype == torch.float32
    stats = trainer.update(rollout)
    assert stats.optimizer_steps == 4 and stats.logprob_check_max_abs_diff <= 0.25
    assert next(trainer.policy.parameters()).dtype == torch.float32  # weights stay float32


@pytest.mark.parametrize("critic", ["separate", "head"])
def test_the_wrapped_modules_outputs_are_not_views(critic: str) -> None:
    """FSDP2 registers its pre-backward hook on the wrapped module's outputs and warns when one is a
    view (an in-place op on it would drop the hook): ``mode="outputs"`` returns tensors of their own,
    with the same values as :meth:`response_outputs`."""
    from tiny_task import tiny_policy, tiny_tokenizer

    from ppo_ref.trainer.models import ActorCriticModule, ScalarHeadCritic

    policy = tiny_policy(tiny_tokenizer())
    if critic == "separate":
        module = ActorCriticModule(policy, critic=ScalarHeadCritic.from_policy(copy.deepcopy(policy)))
    else:
        module = ActorCriticModule(policy, value_head=torch.nn.Linear(policy.config.n_embd, 1))
    ids = torch.tensor([[3, 4, 5, 6, 7], [3, 4, 5, 6, 7]])
    kwargs = dict(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        position_ids=torch.arange(5).expand(2, 5),
        prompt_width=2,
        temperature=1.0,
        need_values=True,
        need_entropy=True,
    )
    plain = module.response_outputs(**kwargs)  # type: ignore[arg-type]
    assert plain.values is not None and plain.values._is_view()  # what made FSDP2 warn
    returned = module(mode="outputs", **kwargs)
    for name in ("logprobs", "values", "bootstrap_values", "entropy"):
        tensor = getattr(returned, name)
        assert not tensor._is_view(), name
        assert torch.equal(tensor, getattr(plain, name)), name
