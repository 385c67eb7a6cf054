"""Stages 1-6: the step-0 identity, padding invariance, pad == EOS, truncation and missing-EOS rules."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from tiny_task import tiny_config, tiny_policy, tiny_reward_model, tiny_setup, tiny_tokenizer

from ppo_ref.trainer import LogprobMismatchError, PPOTrainer
from ppo_ref.trainer.generation import SequenceBatch, left_pad
from ppo_ref.trainer.models import ActorCritic, ScalarHeadCritic, disable_dropout
from ppo_ref.trainer.scoring import RewardModelScorer


def _randomise_critic_head(trainer: PPOTrainer) -> None:
    """The policy-copy critic starts at 0 everywhere; give it non-zero values for the tests."""
    critic = trainer.actor_critic.critic
    assert critic is not None
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        critic.head.weight.normal_(std=0.5)
        critic.head.bias.fill_(0.3)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_first_minibatch_recomputes_the_old_logprobs(out_dir: Path, temperature: float) -> None:
    trainer = PPOTrainer(tiny_config(out_dir, temperature=temperature), tiny_setup())
    rollout = trainer.collect_rollout(0)
    # The same forward with gradients on reproduces the rollout's (no-grad, eval-mode) log-probs.
    recomputed = trainer.actor_critic.response_outputs(rollout.sequences, temperature).logprobs
    mask = rollout.mask
    assert torch.allclose(recomputed[mask], rollout.old_logprobs[mask], atol=1e-6, rtol=0)
    stats = trainer.update(rollout)
    assert stats.logprob_check_max_abs_diff < 1e-5
    first = stats.minibatches[0]
    assert first.ratio_mean == pytest.approx(1.0, abs=1e-6)
    assert first.approx_kl == pytest.approx(0.0, abs=1e-7)
    assert first.clipfrac == 0.0
    # The policy did train: later minibatches see ratios away from 1.
    assert max(m.max_abs_log_ratio for m in stats.minibatches[1:]) > 1e-4


def test_a_wrong_temperature_in_the_old_logprobs_stops_the_run(out_dir: Path) -> None:
    trainer = PPOTrainer(tiny_config(out_dir, temperature=0.7), tiny_setup())
    rollout = trainer.collect_rollout(0)
    at_temperature_one = trainer.actor_critic.response_outputs(rollout.sequences, 1.0).logprobs.detach()
    broken = dataclasses.replace(rollout, old_logprobs=at_temperature_one)
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    with pytest.raises(LogprobMismatchError, match="dropout") as error:
        trainer.update(broken)
    for cause in ("temperature", "position ids", "padding"):
        assert cause in str(error.value)
    # The check runs before the first optimizer step: nothing was updated.
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters(), strict=True))


def test_dropout_is_off_in_every_model(out_dir: Path) -> None:
    setup = tiny_setup(reward_model=True)
    assert setup.policy.config.resid_pdrop > 0  # the fixture's models do have dropout layers
    trainer = PPOTrainer(tiny_config(out_dir, critic="reward"), setup)
    models = [trainer.policy, trainer.reference, trainer.actor_critic.critic, setup.reward_model]
    for model in models:
        assert model is not None and not model.training
        dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
        assert dropouts and all(m.p == 0.0 for m in dropouts)


def test_left_padding_changes_no_logprob_value_or_score() -> None:
    tokenizer = tiny_tokenizer()
    policy = disable_dropout(tiny_policy(tokenizer))
    reward_model = tiny_reward_model(tokenizer)
    scorer = RewardModelScorer(reward_model, torch.autograd.grad_mode.no_grad)
    prompt, response = [3, 4, 5, 6], torch.tensor([[7, 8, 1, 0]])  # EOS (1) then a pad column
    response_mask = torch.tensor([[True, True, True, False]])
    critic = ScalarHeadCritic.from_reward_model(reward_model)
    with torch.no_grad():
        value_head = torch.nn.Linear(policy.config.hidden_size, 1)
    results = []
    for pads in (0, 5):
        ids, mask = left_pad([prompt], tokenizer.pad_token_id)
        ids = torch.cat([torch.full((1, pads), tokenizer.pad_token_id), ids], dim=1)
        mask = torch.cat([torch.zeros(1, pads, dtype=torch.long), mask], dim=1)
        batch = SequenceBatch.build(ids, mask, response, response_mask)
        with torch.no_grad():
            separate = ActorCritic(policy, critic=critic).response_outputs(batch, 0.8)
            shared = ActorCritic(policy, value_head=value_head).response_outputs(batch, 0.8)
            score = scorer.score_tokens(batch.input_ids, batch.attention_mask)
        assert separate.values is not None and shared.values is not None
        results.append((separate.logprobs, separate.values, shared.values, score))
    keep = response_mask
    for unpadded, padded in zip(results[0], results[1], strict=True):
        if unpadded.dim() == 2:
            unpadded, padded = unpadded[keep], padded[keep]
        assert torch.allclose(unpadded, padded, atol=1e-5, rtol=0)
    # The reward model is read at the EOS: dropping the EOS changes the score.
    without_eos = scorer.score_tokens(torch.tensor([[3, 4, 5, 6, 7, 8]]), torch.ones(1, 6, dtype=torch.long))
    assert not torch.allclose(without_eos, results[0][3])


def test_pad_equal_to_eos_trains_with_the_eos_in_the_response_mask(out_dir: Path) -> None:
    setup = tiny_setup(pad_equals_eos=True)
    assert setup.tokenizer.pad_token_id == setup.tokenizer.eos_token_id
    config = tiny_config(out_dir, max_new_tokens=10, rollout_batch_size=16, missing_eos="none")
    trainer = PPOTrainer(config, setup)
    rollout = trainer.collect_rollout(0)
    eos = setup.tokenizer.eos_token_id
    ids, mask = rollout.sequences.response_ids, rollout.mask
    ended_rows = rollout.ended.nonzero().squeeze(-1).tolist()
    assert ended_rows, "the tiny policy should end some responses with EOS"
    for row in ended_rows:
        first_eos = int((ids[row] == eos).nonzero()[0])
        assert mask[row].tolist() == [t <= first_eos for t in range(mask.shape[1])]
        # The score lands on the EOS token (the last action token); everything after it is inert.
        kl_part = -rollout.kl_coef * rollout.kl[row, first_eos]
        assert float(rollout.rewards[row, first_eos] - kl_part) == pytest.approx(
            float(rollout.scored.scores[row]), abs=1e-6
        )
        assert float(rollout.old_logprobs[row, first_eos]) < 0  # the EOS was scored as an action
    stats = trainer.update(rollout)
    assert stats.logprob_check_max_abs_diff < 1e-5 and stats.optimizer_steps == 4


@pytest.mark.parametrize("rule", ["terminal", "bootstrap"])
def test_responses_cut_at_max_length_follow_the_truncation_rule(out_dir: Path, rule: str) -> None:
    config = tiny_config(out_dir, truncation=rule, max_new_tokens=4, rollout_batch_size=16, lam=0.9)
    trainer = PPOTrainer(config, tiny_setup())
    _randomise_critic_head(trainer)
    rollout = trainer.collect_rollout(0)
    cut = (~rollout.ended).nonzero().squeeze(-1).tolist()
    ended = rollout.ended.nonzero().squeeze(-1).tolist()
    assert cut and ended, "expected both cut and ended responses at max_new_tokens=4"
    for row in cut:
        last = int(rollout.mask[row].sum()) - 1
        assert last == rollout.sequences.response_width - 1
        bootstrap = float(rollout.bootstrap_values[row])
        assert abs(bootstrap) > 1e-3  # the randomised critic gives a value that matters
        expected_next = config.gamma * bootstrap if rule == "bootstrap" else 0.0
        # At the last token, A = r + gamma * V_next - V and the return R = A + V = r + gamma * V_next.
        assert float(rollout.returns[row, last]) == pytest.approx(
            float(rollout.rewards[row, last]) + expected_next, abs=1e-5
        )
    for row in ended:  # a response that ended with EOS is terminal under both rules
        last = int(rollout.mask[row].sum()) - 1
        assert float(rollout.returns[row, last]) == pytest.approx(float(rollout.rewards[row, last]), abs=1e-6)


@pytest.mark.parametrize(
    ("rule", "expected"),
    [("none", lambda raw: raw), ("penalty", lambda raw: raw - 0.5), ("replace", lambda raw: -2.0 + 0 * raw)],
)
def test_missing_eos_rule(out_dir: Path, rule: str, expected: object) -> None:
    config = tiny_config(
        out_dir, missing_eos=rule, missing_eos_penalty=0.5, missing_eos_score=-2.0, rollout_batch_size=16
    )
    rollout = PPOTrainer(config, tiny_setup()).collect_rollout(0)
    scored = rollout.scored
    cut = ~rollout.ended
    assert cut.any() and rollout.ended.any()
    assert torch.equal(scored.scores[rollout.ended], scored.raw[rollout.ended])
    assert torch.allclose(scored.scores[cut], expected(scored.raw[cut]))  # type: ignore[operator]
    assert torch.allclose(scored.raw + scored.adjustment, scored.scores)


def test_rollouts_are_reproducible_from_the_seed(out_dir: Path) -> None:
    first = PPOTrainer(tiny_config(out_dir), tiny_setup()).collect_rollout(3)
    second = PPOTrainer(tiny_config(out_dir), tiny_setup()).collect_rollout(3)
    other_seed = PPOTrainer(tiny_config(out_dir, seed=1), tiny_setup()).collect_rollout(3)
    assert torch.equal(first.sequences.input_ids, second.sequences.input_ids)
    assert torch.equal(first.advantages, second.advantages)
    assert not torch.equal(first.sequences.input_ids, other_seed.sequences.input_ids)
