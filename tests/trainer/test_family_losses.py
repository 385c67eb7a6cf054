"""The loss side of the PPO family in the trainer (issue 12, part 2).

Each policy loss and aggregation runs from the command line; nonsense combinations stop before
any work with an error naming the field; the losses stage 7 computes are the reference
functions' (called with the whole minibatch's counts); ``kl_in = "loss"`` moves the KL from the
rewards into the loss; the new statistics reach metrics.jsonl only in runs that use them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_task import config_choices, tiny_cli_argv, tiny_config, tiny_setup

from ppo_ref import cispo_loss, cli, gspo_loss, kl_loss, policy_loss, token_rewards
from ppo_ref.aggregation import LOSS_AGGREGATIONS
from ppo_ref.kl_loss import KL_LOSS_ESTIMATORS
from ppo_ref.trainer import PPOTrainer, TrainerConfig
from ppo_ref.trainer.config import SEQUENCE_LEVEL_ESTIMATORS
from ppo_ref.trainer.estimators import POLICY_LOSSES, WholeMinibatch, trainer_policy_loss
from ppo_ref.trainer.update import corrected_advantages, minibatch_backward


def test_the_config_offers_every_mode_of_the_reference() -> None:
    assert config_choices("policy_loss") == set(POLICY_LOSSES) == {"ppo", "gspo", "cispo"}
    assert config_choices("loss_agg") == set(LOSS_AGGREGATIONS)
    assert config_choices("kl_loss_estimator") == set(KL_LOSS_ESTIMATORS)
    assert config_choices("kl_in") == {"reward", "loss"}
    levels = {"token", "sequence", "geometric"}
    assert config_choices("rollout_correction") == {"none"} | {
        f"{lv}-{m}" for lv in levels for m in ("truncate", "mask")
    }
    default = TrainerConfig()
    assert (default.policy_loss, default.loss_agg, default.kl_in, default.rollout_correction) == (
        "ppo",
        "token-mean",
        "reward",
        "none",
    )
    assert default.clip_eps_high is None and default.dual_clip is None and default.kl_loss_estimator is None


def test_norm_constant_defaults_to_max_new_tokens() -> None:
    assert TrainerConfig(loss_agg="seq-mean-token-sum-norm", max_new_tokens=24).loss_norm_constant == 24.0
    assert TrainerConfig(loss_agg="seq-mean-token-sum-norm", norm_constant=7).loss_norm_constant == 7.0
    assert TrainerConfig().loss_norm_constant is None
    assert TrainerConfig(rollout_temperature=1.5).sampling_temperature == 1.5
    assert TrainerConfig(temperature=0.7).sampling_temperature == 0.7


# -- errors before any work -----------------------------------------------------------------------


GSPO = ["--policy-loss", "gspo", "--loss-agg", "seq-mean-token-mean"]
GRPO = ["--advantage-estimator", "grpo", "--group-size", "8"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            GSPO,
            "config field 'advantage_estimator': expected one of ('grpo', 'dr_grpo', 'rloo', 'reinforce++-",
        ),
        (
            [*GSPO, "--advantage-estimator", "reinforce++"],
            "with policy_loss='gspo' (GSPO weighs one advantage per sequence; 'reinforce++' gives one per",
        ),
        (
            ["--policy-loss", "gspo", *GRPO],
            "config field 'loss_agg': expected 'seq-mean-token-mean' with policy_loss='gspo'",
        ),
        (
            [*GSPO, *GRPO, "--rollout-correction", "token-truncate"],
            "config field 'rollout_correction': expected a sequence or geometric level with policy_loss='gsp",
        ),
        (["--dual-clip", "1"], "config field 'dual_clip': expected a number > 1 or None"),
        (["--dual-clip", "0.5"], "config field 'dual_clip': expected a number > 1 or None"),
        (["--clip-eps-high", "0.1"], "config field 'clip_eps_high': expected >= clip_eps=0.2 or None"),
        (
            ["--policy-loss", "cispo", "--dual-clip", "3"],
            "config field 'dual_clip': expected None with policy_loss='cispo'",
        ),
        (
            [*GSPO, *GRPO, "--dual-clip", "3"],
            "config field 'dual_clip': expected None with policy_loss='gspo'",
        ),
        (
            ["--norm-constant", "32"],
            "config field 'norm_constant': expected None with loss_agg='token-mean' (only seq-mean-token-",
        ),
        (
            ["--loss-agg", "seq-mean-token-sum-norm", "--norm-constant", "0"],
            "config field 'norm_constant': expected a number > 0 or None",
        ),
        (
            ["--kl-loss-estimator", "k3"],
            "config field 'kl_loss_estimator': expected None with kl_in='reward'",
        ),
        (
            ["--rollout-correction-high", "3"],
            "config field 'rollout_correction_high': expected its default 2.0 with rollout_correction='none'",
        ),
        (
            ["--rollout-correction-low", "0.5"],
            "config field 'rollout_correction_low': expected its default None with rollout_correction='none'",
        ),
        (
            ["--rollout-correction", "token-mask", "--rollout-correction-low", "3"],
            "config field 'rollout_correction_low': expected <= rollout_correction_high=2.0 or None",
        ),
        (
            ["--rollout-correction", "token-mask", "--rollout-correction-high", "0"],
            "config field 'rollout_correction_high': expected a number > 0",
        ),
        (["--rollout-temperature", "0"], "config field 'rollout_temperature': expected a number > 0 or None"),
    ],
)
def test_nonsense_combinations_stop_before_any_work(
    capsys: pytest.CaptureFixture[str], no_work: None, argv: list[str], message: str
) -> None:
    assert cli.main(["train", *argv]) == 2
    assert message in capsys.readouterr().err


def test_every_sequence_level_estimator_runs_gspo() -> None:
    for estimator in SEQUENCE_LEVEL_ESTIMATORS:
        config = TrainerConfig(
            policy_loss="gspo", advantage_estimator=estimator, group_size=4, loss_agg="seq-mean-token-mean"
        )
        assert trainer_policy_loss(config) is POLICY_LOSSES["gspo"]


# -- from the command line ------------------------------------------------------------------------


@pytest.fixture
def local_run(tmp_path: Path) -> list[str]:
    """argv of a tiny run on a saved tiny policy, a prompts file and a Python reward function."""
    return tiny_cli_argv(tmp_path, "--ppo-epochs", "2")


RUNS: dict[str, tuple[list[str], set[str]]] = {
    # name: (flags, metrics that must appear beyond the default record's)
    "ppo-dapo": (
        ["--clip-eps-high", "0.28", "--dual-clip", "3", "--loss-agg", "token-mean"],
        {"dual_clip_frac"},
    ),
    "cispo-dr": (["--policy-loss", "cispo", "--loss-agg", "seq-mean-token-sum-norm"], set()),
    "gspo-grpo": ([*GSPO, "--advantage-estimator", "grpo", "--group-size", "4"], set()),
    "kl-loss": (
        ["--kl-in", "loss", "--kl-loss-estimator", "k3+", "--loss-agg", "seq-mean-token-sum"],
        {"kl_loss"},
    ),
    "tis": (
        ["--rollout-correction", "sequence-truncate", "--rollout-temperature", "1.2"],
        {"rollout_weight_mean", "rollout_weight_std", "rollout_weight_min", "rollout_weight_max"}
        | {"rollout_weight_zero_frac"},
    ),
}


@pytest.mark.parametrize(
    "name", ["ppo-dapo", *(pytest.param(n, marks=pytest.mark.slow) for n in RUNS if n != "ppo-dapo")]
)
def test_each_loss_trains_from_the_command_line(tmp_path: Path, local_run: list[str], name: str) -> None:
    flags, extra = RUNS[name]
    out = tmp_path / "out"
    assert cli.main([*local_run, "--out", str(out), *flags]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert isinstance(summary["eval_score_final"], float)
    config = summary["config"]
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        recorded = config[flag[2:].replace("-", "_")]
        assert recorded == (value if isinstance(recorded, str) else float(value)), flag
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    optional = {"dual_clip_frac", "kl_loss", "rollout_weight_mean", "rollout_weight_min"}
    optional |= {"rollout_weight_std", "rollout_weight_max", "rollout_weight_zero_frac"}
    for record in records:
        assert record["optimizer_steps"] == 4 and isinstance(record["policy_loss"], float)
        assert optional & set(record) == extra
        for key in extra:
            assert isinstance(record[key], float), key


# -- stage 7 calls the reference ------------------------------------------------------------------


def test_a_default_run_records_no_optional_statistic(out_dir: Path) -> None:
    trainer = PPOTrainer(tiny_config(out_dir, iterations=1), tiny_setup())
    trainer.train()
    record = json.loads((out_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert not {"dual_clip_frac", "kl_loss", "rollout_weight_mean"} & set(record)


def _moved_batch(out_dir: Path, **overrides: Any) -> tuple[PPOTrainer, Any]:
    trainer = PPOTrainer(
        tiny_config(out_dir, rollout_batch_size=8, num_minibatches=1, **overrides), tiny_setup()
    )
    batch = trainer.collect_rollout(0).training_batch()
    with torch.no_grad():  # ratios away from 1: every clip branch is live
        generator = torch.Generator().manual_seed(1)
        for parameter in trainer.actor_critic.policy_parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return trainer, batch


@pytest.mark.parametrize(
    "overrides",
    [
        {"clip_eps_high": 0.28, "dual_clip": 1.5},
        {"policy_loss": "cispo", "loss_agg": "seq-mean-token-sum-norm", "clip_eps_high": 0.3},
        {
            "policy_loss": "gspo",
            "advantage_estimator": "grpo",
            "group_size": 4,
            "loss_agg": "seq-mean-token-mean",
        },
    ],
    ids=["ppo", "cispo", "gspo"],
)
def test_the_policy_loss_is_the_reference_function(out_dir: Path, overrides: dict[str, Any]) -> None:
    """The table entry returns what the reference function returns for the same arguments."""
    trainer, batch = _moved_batch(out_dir, **overrides)
    config = trainer.config
    with torch.no_grad():
        outputs = trainer.actor_critic.response_outputs(
            batch.sequences, config.temperature, need_values=False
        )
        logprobs = outputs.logprobs
    whole = WholeMinibatch.of(batch.mask)
    ours = trainer_policy_loss(config)(
        logprobs, batch.old_logprobs, batch.advantages, batch.mask, config, whole
    )
    mask = batch.mask
    if config.policy_loss == "ppo":
        theirs: Any = policy_loss(
            logprobs, batch.old_logprobs, batch.advantages, mask, 0.2, clip_eps_high=0.28, dual_clip=1.5
        )
        assert float(theirs.dual_clip_frac) > 0 and float(ours.dual_clip_frac) == float(theirs.dual_clip_frac)
    elif config.policy_loss == "cispo":
        theirs = cispo_loss(
            logprobs,
            batch.old_logprobs,
            batch.advantages,
            mask,
            0.2,
            0.3,
            "seq-mean-token-sum-norm",
            norm_constant=6,
        )
    else:
        first = mask.long().argmax(dim=1)
        row_advantages = batch.advantages[torch.arange(mask.shape[0]), first]
        assert torch.equal(
            torch.where(mask, row_advantages.unsqueeze(1), 0.0), torch.where(mask, batch.advantages, 0.0)
        )
        theirs = gspo_loss(logprobs, batch.old_logprobs, row_advantages, mask, 0.2)
    assert float(theirs.clipfrac) > 0
    assert torch.allclose(ours.loss, theirs.loss, rtol=1e-6, atol=1e-7)
    assert float(ours.clipfrac) == float(theirs.clipfrac)


def test_the_rollout_weights_multiply_each_tokens_policy_loss() -> None:
    """Weighting the advantages is weighting each token's clipped (and dual-clipped) objective."""
    generator = torch.Generator().manual_seed(0)
    logp = 0.5 * torch.randn(4, 6, generator=generator, dtype=torch.float64)
    old = torch.zeros(4, 6, dtype=torch.float64)
    advantages = torch.randn(4, 6, generator=generator, dtype=torch.float64)
    mask = torch.rand(4, 6, generator=generator) < 0.8
    weights = torch.where(mask, torch.rand(4, 6, generator=generator, dtype=torch.float64) * 2, 0.0)
    weights[0, 0] = 0.0  # a masked-out (rejected) token
    batch = type("Batch", (), {"advantages": advantages, "correction_weights": weights})()
    weighted = corrected_advantages(batch)  # type: ignore[arg-type]
    ours = policy_loss(logp, old, weighted, mask, 0.2, clip_eps_high=0.3, dual_clip=2.0)
    ratio = logp.exp()
    objective = torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.3) * advantages)
    objective = torch.where(advantages < 0, torch.maximum(objective, 2.0 * advantages), objective)
    by_hand = -(weights * objective)[mask].sum() / mask.sum()
    assert torch.allclose(ours.loss, by_hand, rtol=1e-12)
    plain = type("Batch", (), {"advantages": advantages, "correction_weights": None})()
    assert corrected_advantages(plain) is advantages  # type: ignore[arg-type]


@pytest.mark.parametrize("estimator", ["k2", "k3", "k3+"])
def test_kl_in_loss_moves_the_kl_from_the_rewards_to_the_loss(out_dir: Path, estimator: str) -> None:
    config = tiny_config(out_dir, num_minibatches=1, kl_in="loss", kl_loss_estimator=estimator, kl_coef=0.3)
    trainer = PPOTrainer(config, tiny_setup())
    with torch.no_grad():  # a reference away from the policy: a KL that is not 0
        generator = torch.Generator().manual_seed(2)
        for parameter in trainer.reference.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    trainer.reference_fingerprint = None  # type: ignore[assignment]  # (not checked in this test)
    rollout = trainer.collect_rollout(0)
    assert float(rollout.kl.abs().sum()) > 1e-3
    scores, old, ref, mask = rollout.scored.scores, rollout.old_logprobs, rollout.ref_logprobs, rollout.mask
    assert torch.equal(rollout.rewards, token_rewards(scores, old, ref, mask, 0.0, config.kl_estimator))
    assert not torch.equal(rollout.rewards, token_rewards(scores, old, ref, mask, 0.3, config.kl_estimator))
    moved_ref = rollout.training_batch()
    assert moved_ref.ref_logprobs is not None and torch.equal(moved_ref.ref_logprobs, ref)
    # The loss adds kl_coef * kl_loss: the gradient with kl_coef c minus with 0 is c * grad(kl_loss).
    params = trainer.actor_critic.policy_parameters()

    def gradient(kl_coef: float) -> list[torch.Tensor]:
        trainer.optimizer.zero_grad(set_to_none=True)
        minibatch_backward(
            trainer.actor_critic, moved_ref, config, trainer.autocast, torch.Tensor.backward, kl_coef=kl_coef
        )
        return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]

    with_kl, without = gradient(0.3), gradient(0.0)
    trainer.optimizer.zero_grad(set_to_none=True)
    logprobs = trainer.actor_critic.response_outputs(moved_ref.sequences, config.temperature).logprobs
    (0.3 * kl_loss(logprobs, moved_ref.ref_logprobs, moved_ref.mask, estimator)).backward()
    expected = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]
    assert max(float(e.abs().max()) for e in expected) > 1e-4
    for a, b, e in zip(with_kl, without, expected, strict=True):
        assert torch.allclose(a - b, e, atol=1e-6, rtol=1e-4)
    trainer.optimizer.zero_grad(set_to_none=True)
