"""The advantage estimators of the PPO family in the trainer (issue 12, part 2).

Each estimator runs from the command line; a critic-free one builds no value model and never asks
for a value; nonsense combinations stop before any work with an error naming the field; the
group estimators group rows by prompt on the whole (gathered) batch and give what
``ppo_ref.group_advantages`` gives on that batch.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_task import config_choices, tiny_cli_argv, tiny_config, tiny_policy, tiny_setup, tiny_tokenizer

from ppo_ref import cli, gae, group_advantages, masked_whiten
from ppo_ref.trainer import PPOTrainer, TrainerConfig
from ppo_ref.trainer.config import (
    CRITIC_FIELDS,
    CRITIC_FREE_ESTIMATORS,
    GROUP_ESTIMATORS,
    SEQUENCE_LEVEL_ESTIMATORS,
)
from ppo_ref.trainer.data import Rollout, ScoredBatch
from ppo_ref.trainer.estimators import ADVANTAGE_ESTIMATORS, group_ids, sequence_returns
from ppo_ref.trainer.models import ActorCriticModule, ScalarHeadCritic

ESTIMATORS = ("gae", "grpo", "dr_grpo", "rloo", "reinforce++", "reinforce++-baseline")


def test_the_table_the_config_and_the_flag_name_the_same_estimators() -> None:
    choices = config_choices("advantage_estimator")
    assert choices == set(ADVANTAGE_ESTIMATORS) == set(ESTIMATORS)
    assert set(CRITIC_FREE_ESTIMATORS) == choices - {"gae"}
    assert set(GROUP_ESTIMATORS) < set(CRITIC_FREE_ESTIMATORS)
    assert {name for name, entry in ADVANTAGE_ESTIMATORS.items() if not entry.whiten} == {
        "grpo",
        "dr_grpo",
        "rloo",
    }
    # The config's sets are derived from the entries' properties (one table); stated by hand here.
    assert GROUP_ESTIMATORS == ("grpo", "dr_grpo", "rloo", "reinforce++-baseline")
    assert SEQUENCE_LEVEL_ESTIMATORS == GROUP_ESTIMATORS
    assert CRITIC_FREE_ESTIMATORS == ("grpo", "dr_grpo", "rloo", "reinforce++", "reinforce++-baseline")
    assert TrainerConfig().uses_critic and TrainerConfig().advantage_estimator == "gae"
    for name in CRITIC_FREE_ESTIMATORS:
        assert not TrainerConfig(advantage_estimator=name, group_size=2).uses_critic


# -- from the command line ------------------------------------------------------------------------


@pytest.fixture
def local_run(tmp_path: Path) -> list[str]:
    """argv of a tiny run on a saved tiny policy, a prompts file and a Python reward function."""
    return tiny_cli_argv(tmp_path, "--ppo-epochs", "1", "--audit-samples", "8")


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_each_estimator_trains_from_the_command_line(
    tmp_path: Path, local_run: list[str], estimator: str
) -> None:
    out = tmp_path / "out"
    group_size = 4 if estimator in GROUP_ESTIMATORS else 1
    argv = [*local_run, "--out", str(out), "--advantage-estimator", estimator]
    assert cli.main([*argv, "--group-size", str(group_size)]) == 0

    summary = json.loads((out / "summary.json").read_text())
    critic_free = estimator in CRITIC_FREE_ESTIMATORS
    assert summary["advantage_estimator"] == estimator == summary["config"]["advantage_estimator"]
    assert summary["critic"] == ("none" if critic_free else "policy")
    assert isinstance(summary["eval_score_final"], float)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1]
    for record in records:
        assert record["optimizer_steps"] == 2 and isinstance(record["policy_loss"], float)
        for key in ("value_loss", "explained_variance", "value_mean", "grad_norm_critic"):
            assert (record[key] is None) == critic_free, key
    checkpoint = next((out / "checkpoints").iterdir())
    assert (checkpoint / "critic.safetensors").exists() != critic_free

    # Every prompt was sampled group_size times; the advantages are what the estimator says.
    audit = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    for iteration in (0, 1):
        rows = [a for a in audit if a["iteration"] == iteration]
        assert len(rows) == 8
        prompts = [a["prompt"] for a in rows]
        assert all(prompts.count(p) % group_size == 0 for p in prompts)
        if critic_free:
            assert all(v is None for a in rows for v in a["values"]) and rows[0]["bootstrap_value"] is None
        if estimator in ("grpo", "dr_grpo", "rloo"):  # one advantage per row; each group sums to 0
            per_row = []
            for a in rows:
                kept = [v for v in a["advantages"] if v is not None]
                assert kept and max(kept) == min(kept)
                per_row.append(kept[0])
            for prompt in set(prompts):
                group = [v for v, p in zip(per_row, prompts, strict=True) if p == prompt]
                assert abs(sum(group)) < 1e-5


# -- errors before any work -----------------------------------------------------------------------


GRPO = ["--advantage-estimator", "grpo", "--group-size", "8"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--advantage-estimator", "grpo"],
            "config field 'group_size': expected an int >= 2 with advantage_estimator='grpo'",
        ),
        (
            ["--advantage-estimator", "reinforce++-baseline", "--group-size", "1"],
            "config field 'group_size': expected an int >= 2 with advantage_estimator='reinforce++-baseline'",
        ),
        (["--group-size", "3"], "config field 'group_size': expected a divisor of rollout_batch_size=64"),
        (["--group-size", "0"], "config field 'group_size': expected an int >= 1"),
        ([*GRPO, "--vf-coef", "0.5"], "config field 'vf_coef': advantage_estimator='grpo' does not use it"),
        (
            [*GRPO, "--critic", "value-head"],
            "config field 'critic': advantage_estimator='grpo' does not use it",
        ),
        ([*GRPO, "--value-clip-eps", "none"], "config field 'value_clip_eps': advantage_estimator='grpo'"),
        ([*GRPO, "--critic-learning-rate", "1e-5"], "config field 'critic_learning_rate': advantage_esti"),
        ([*GRPO, "--truncation", "bootstrap"], "config field 'truncation': advantage_estimator='grpo'"),
        ([*GRPO, "--lam", "1"], "config field 'lam': advantage_estimator='grpo' does not use it"),
        ([*GRPO, "--gamma", "0.9"], "config field 'gamma': advantage_estimator='grpo' does not use it"),
        (
            ["--advantage-estimator", "reinforce++", "--truncation", "bootstrap"],
            "config field 'truncation': advantage_estimator='reinforce++' does not use it",
        ),
        (
            ["--advantage-estimator", "dr_grpo", "--group-size", "4", "--vf-coef", "0"],
            "config field 'vf_coef': advantage_estimator='dr_grpo' does not use it (it has no value loss); "
            "leave it at its default 0.1",
        ),
    ],
)
def test_nonsense_combinations_stop_before_any_work(
    capsys: pytest.CaptureFixture[str], no_work: None, argv: list[str], message: str
) -> None:
    assert cli.main(["train", *argv]) == 2
    assert message in capsys.readouterr().err


def test_what_a_critic_free_estimator_accepts(tmp_path: Path) -> None:
    """A critic field at its default passes (it cannot be told from an unset one); reinforce++
    discounts, so it takes gamma; gae takes group_size > 1 (a batch layout, nothing more)."""
    for name in CRITIC_FREE_ESTIMATORS:
        defaults = {f.name: f.default for f in fields(TrainerConfig) if f.name in CRITIC_FIELDS}
        TrainerConfig(advantage_estimator=name, group_size=2, **defaults)
    assert TrainerConfig(advantage_estimator="reinforce++", gamma=0.9).gamma == 0.9
    assert TrainerConfig(group_size=8).uses_critic
    toml = tmp_path / "grpo.toml"
    toml.write_text('advantage_estimator = "grpo"\ngroup_size = 8\nvf_coef = 0.5\n')
    with pytest.raises(ValueError, match="config field 'vf_coef': advantage_estimator='grpo'"):
        cli.resolve_config(cli.build_parser().parse_args(["train", "--config", str(toml)]))


# -- no critic at all -----------------------------------------------------------------------------


def test_a_critic_free_run_has_no_critic_and_never_asks_for_a_value(
    out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[bool] = []
    original = ActorCriticModule.response_outputs

    def spy(self: ActorCriticModule, **kwargs: Any) -> Any:
        asked.append(bool(kwargs["need_values"]))
        return original(self, **kwargs)

    def no_critic(*args: object, **kwargs: object) -> None:
        raise AssertionError("a critic was built or run")

    monkeypatch.setattr(ActorCriticModule, "response_outputs", spy)
    monkeypatch.setattr(ScalarHeadCritic, "forward", no_critic)
    monkeypatch.setattr(ScalarHeadCritic, "from_policy", no_critic)
    setup = tiny_setup()
    trainer = PPOTrainer(tiny_config(out_dir, advantage_estimator="rloo", group_size=4), setup)
    actor_critic = trainer.actor_critic
    assert actor_critic.critic is None and actor_critic.value_head is None and not actor_critic.has_critic
    assert actor_critic.critic_parameters() == []
    module_parameters = {id(p) for p in actor_critic.module.parameters()}
    assert module_parameters == {id(p) for p in setup.policy.parameters()}
    optimized = [id(p) for group in trainer.optimizer.param_groups for p in group["params"]]
    assert sorted(optimized) == sorted(id(p) for p in actor_critic.policy_parameters())
    assert all(key.startswith("policy.") for key in actor_critic.module.state_dict())
    with pytest.raises(ValueError, match="need_values: this run has no critic"):
        actor_critic.module.response_outputs(
            input_ids=torch.ones(1, 3, dtype=torch.long),
            attention_mask=torch.ones(1, 3, dtype=torch.long),
            position_ids=torch.arange(3).unsqueeze(0),
            prompt_width=1,
            temperature=1.0,
            need_values=True,
            need_entropy=False,
        )
    asked.clear()
    summary = trainer.train()
    assert asked and not any(asked)  # rollouts, updates and evaluations: never a value
    assert summary["critic"] == "none"
    # And the same task with GAE does build and run one (so the spy would have seen it).
    monkeypatch.undo()
    with_critic = PPOTrainer(tiny_config(out_dir.with_name("gae")), tiny_setup())
    assert with_critic.actor_critic.critic_parameters() and len(with_critic.optimizer.param_groups) == 2


# -- groups on the whole batch --------------------------------------------------------------------


def _rows(rollout: Rollout, index: torch.Tensor) -> Rollout:
    """The rollout's rows ``index`` (what one process of several would hold)."""
    picked = index.tolist()
    scored = rollout.scored
    tensors = ("sample_index", "ended", "valid", "old_logprobs", "ref_logprobs", "values")
    tensors += ("bootstrap_values", "entropy", "kl", "rewards", "raw_advantages", "returns", "advantages")
    return replace(
        rollout,
        prompts=[rollout.prompts[i] for i in picked],
        responses=[rollout.responses[i] for i in picked],
        sequences=rollout.sequences.rows(index),
        scored=ScoredBatch(scored.raw[index], scored.adjustment[index], scored.scores[index]),
        **{name: getattr(rollout, name)[index] for name in tensors},
    )


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "reinforce++-baseline"])
def test_group_advantages_are_those_of_the_whole_batch_keyed_by_prompt(out_dir: Path, estimator: str) -> None:
    """12 rows in groups of 4: what stage 6 computed equals ``group_advantages`` on the whole batch
    (whitened for reinforce++-baseline); permuting the rows permutes the result (groups are keyed
    by prompt, not by position); the two halves that two processes hold would give other numbers."""
    config = tiny_config(
        out_dir,
        advantage_estimator=estimator,
        group_size=4,
        rollout_batch_size=12,
        num_minibatches=2,
        kl_coef=0.5,
    )
    # A reference other than the initial policy: the returns carry a KL term, so no two are equal.
    setup = replace(tiny_setup(), reference=tiny_policy(tiny_tokenizer(), seed=5))
    rollout = PPOTrainer(config, setup).collect_rollout(0)
    assert len(set(sequence_returns(rollout).tolist())) == 12
    prompts = rollout.prompts
    assert all(prompts[4 * g : 4 * g + 4] == [prompts[4 * g]] * 4 for g in range(3))
    mask = rollout.mask
    returns = torch.where(mask, rollout.rewards, 0.0).sum(dim=1)
    assert torch.equal(sequence_returns(rollout), returns)
    ids = torch.tensor([prompts.index(p) for p in prompts])
    assert torch.equal(group_ids(prompts), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]))
    method = "dr_grpo" if estimator == "reinforce++-baseline" else estimator
    per_row = group_advantages(returns, ids, method)
    assert float(per_row.abs().max()) > 0  # the groups are not constant: the checks below can fail
    expected = torch.where(mask, per_row.unsqueeze(1), 0.0)
    if estimator == "reinforce++-baseline":
        expected = masked_whiten(expected, mask)
    torch.testing.assert_close(rollout.advantages, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(rollout.raw_advantages, torch.where(mask, per_row.unsqueeze(1), 0.0))

    entry = ADVANTAGE_ESTIMATORS[estimator]
    order = torch.randperm(12, generator=torch.Generator().manual_seed(1))
    shuffled, _ = entry(_rows(rollout, order), config)
    torch.testing.assert_close(shuffled, rollout.raw_advantages[order], rtol=0, atol=1e-6)
    # Two processes' halves (rows 0-5 and 6-11 split the middle group): computed per half, the
    # middle group's baseline would be wrong.
    halves = [entry(_rows(rollout, torch.arange(6 * r, 6 * r + 6)), config)[0] for r in (0, 1)]
    assert not torch.allclose(torch.cat(halves), rollout.raw_advantages, atol=1e-4)


def test_reinforce_pp_is_whitened_discounted_returns(out_dir: Path) -> None:
    config = tiny_config(out_dir, advantage_estimator="reinforce++", gamma=0.9, kl_coef=0.3)
    trainer = PPOTrainer(config, tiny_setup())
    rollout = trainer.collect_rollout(0)
    returns, _ = gae(rollout.rewards, torch.zeros_like(rollout.rewards), rollout.mask, 0.9, 1.0)
    torch.testing.assert_close(rollout.raw_advantages, returns)
    torch.testing.assert_close(rollout.advantages, masked_whiten(returns, rollout.mask))
    assert float(rollout.advantages[rollout.mask].std()) == pytest.approx(1.0, abs=1e-4)


def test_a_skipped_sample_enters_no_group(out_dir: Path) -> None:
    """With on_bad_score = skip, a sample whose score is NaN has no action token and no advantage,
    and the rest of its group is compared among itself."""
    setup = tiny_setup()

    def reward(prompts: Any, responses: Any) -> list[float]:
        return [float("nan") if i == 1 else r.count("a") / max(len(r), 1) for i, r in enumerate(responses)]

    setup = replace(setup, reward_function=reward)
    config = tiny_config(out_dir, advantage_estimator="grpo", group_size=4, on_bad_score="skip")
    rollout = PPOTrainer(config, setup).collect_rollout(0)
    assert not bool(rollout.valid[1]) and bool(rollout.valid[[0, 2, 3]].all())
    assert float(rollout.advantages[1].abs().sum()) == 0
    returns = sequence_returns(rollout)
    expected = group_advantages(returns[[0, 2, 3]], torch.zeros(3, dtype=torch.long))
    kept = torch.stack([rollout.advantages[i][rollout.mask[i]][0] for i in (0, 2, 3)])
    torch.testing.assert_close(kept, expected)


def test_a_critic_free_run_resumes_like_an_uninterrupted_one(tmp_path: Path) -> None:
    """Two iterations, then a resume to three, give the parameters of three in one go (the
    checkpoint holds no critic, and a run with a critic refuses it)."""
    settings: dict[str, Any] = {"advantage_estimator": "grpo", "group_size": 4}
    PPOTrainer(tiny_config(tmp_path / "a", **settings), tiny_setup()).train()
    assert not (tmp_path / "a" / "checkpoints" / "iter-000002" / "critic.safetensors").exists()
    resumed = PPOTrainer(
        tiny_config(tmp_path / "a", iterations=3, **settings), tiny_setup(), resume=tmp_path / "a"
    )
    resumed.train()
    straight = PPOTrainer(tiny_config(tmp_path / "b", iterations=3, **settings), tiny_setup())
    straight.train()
    for mine, theirs in zip(resumed.policy.parameters(), straight.policy.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    with pytest.raises(ValueError, match="advantage_estimator"):
        PPOTrainer(tiny_config(tmp_path / "a", iterations=4), tiny_setup(), resume=tmp_path / "a")
