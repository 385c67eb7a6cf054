"""The PPO-family adapters of verl, OpenRLHF and skyrl (issue 14) in ppo-ref's own environment.

Without the libraries: the family modules import nothing of theirs, declare valid conventions each
with a source, and their argument conversions do what their docstrings say, checked against
stand-ins for the library functions that record how they are called. With the libraries
(``.envs/NAME``, ``thirdparty`` marker): the family conformance tests that pass today still pass.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

from ppo_ref.adapters import convention_problems
from ppo_ref.adapters.base import OP_NAMES
from ppo_ref.adapters.thirdparty import openrlhf_family, skyrl_family, trl_family, verl_family
from tests.thirdparty_env import thirdparty_python

ROOT = Path(__file__).resolve().parents[1]
FAMILY = {"verl": verl_family, "openrlhf": openrlhf_family, "skyrl": skyrl_family}
FAMILY_OPS = set(OP_NAMES[-6:])


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_family_conventions_are_valid_and_each_has_a_source(name: str) -> None:
    module = FAMILY[name]
    assert convention_problems(module.FAMILY_CONVENTIONS) == []
    assert set(module.FAMILY_CONVENTION_SOURCES) == set(module.FAMILY_CONVENTIONS)
    assert all(".py" in source for source in module.FAMILY_CONVENTION_SOURCES.values())
    assert set(module.FAMILY_NOT_PROVIDED) <= FAMILY_OPS


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_the_adapter_declares_the_family_conventions(name: str) -> None:
    """Each adapter's CONVENTIONS holds its family module's declarations unchanged."""
    adapter = importlib.import_module(f"ppo_ref.adapters.thirdparty.{name}")
    for key, value in FAMILY[name].FAMILY_CONVENTIONS.items():
        assert adapter.CONVENTIONS[key] == value, key
        assert adapter.CONVENTION_SOURCES[key] == FAMILY[name].FAMILY_CONVENTION_SOURCES[key], key


def test_count_keywords_map_to_each_library_s_batch_info() -> None:
    assert verl_family.batch_info(4.0, 10, 3) == {
        "batch_num_tokens": 10,
        "global_batch_size": 3,
        "loss_scale_factor": 4.0,
    }
    assert openrlhf_family.loss_batch_info(10, 3) == {"batch_num_tokens": 10, "global_batch_size": 3}


@pytest.mark.parametrize(
    ("loss_agg", "norm", "expected"),
    [
        ("token-mean", None, {"loss_reduction": "token_mean", "max_seq_len": None}),
        ("seq-mean-token-mean", None, {"loss_reduction": "sequence_mean", "max_seq_len": None}),
        ("seq-mean-token-sum", None, {"loss_reduction": "seq_mean_token_sum_norm", "max_seq_len": 1.0}),
        ("seq-mean-token-sum-norm", 7.0, {"loss_reduction": "seq_mean_token_sum_norm", "max_seq_len": 7.0}),
    ],
)
def test_skyrl_reduction_config(loss_agg: str, norm: float | None, expected: dict[str, Any]) -> None:
    assert skyrl_family.reduction_config(loss_agg, norm) == expected


@pytest.mark.parametrize(
    ("loss_agg", "norm", "argument"),
    [
        ("token-sum", None, "loss_agg"),
        ("seq-mean-token-sum-norm", None, "norm_constant"),
        ("token-mean", 3.0, "norm_constant"),
    ],
)
def test_skyrl_reduction_config_rejects_what_skyrl_cannot_do(
    loss_agg: str, norm: float | None, argument: str
) -> None:
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        skyrl_family.reduction_config(loss_agg, norm)


# --- argument conversions, against stand-ins that record the call ---------------------------------


class _Recorder:
    """A stand-in library function: records its keyword arguments, returns ``result(**kwargs)``."""

    def __init__(self, result: Any) -> None:
        self.calls: list[dict[str, Any]] = []
        self._result = result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append({"args": args, **kwargs})
        return self._result(*args, **kwargs)


def _verl_ops() -> tuple[verl_family.VerlFamilyOps, SimpleNamespace]:
    def advantages(**kwargs: Any) -> tuple[Tensor, Tensor]:
        return kwargs["token_level_rewards"] * 2, kwargs["token_level_rewards"]

    core = SimpleNamespace(
        compute_grpo_outcome_advantage=_Recorder(advantages),
        compute_rloo_outcome_advantage=_Recorder(advantages),
    )
    ops = verl_family.VerlFamilyOps()
    ops._core = core  # type: ignore[assignment]
    return ops, core


@pytest.mark.parametrize(
    ("method", "std_scope", "function", "by_std"),
    [
        ("grpo", "group", "compute_grpo_outcome_advantage", True),
        ("grpo", "none", "compute_grpo_outcome_advantage", False),
        ("dr_grpo", "group", "compute_grpo_outcome_advantage", False),
        ("rloo", "group", "compute_rloo_outcome_advantage", None),
    ],
)
def test_verl_group_advantages_call_the_trainer_s_estimator(
    method: str, std_scope: str, function: str, by_std: bool | None
) -> None:
    """One-column token_level_rewards and response_mask, the group ids as a numpy index, Dr. GRPO as
    norm_adv_by_std_in_grpo=False, and never an epsilon (the trainer passes none)."""
    ops, core = _verl_ops()
    scores, ids = torch.tensor([1.0, 2.0, 4.0]), torch.tensor([5, 5, 9])
    out = ops.group_advantages(scores, ids, method, std_scope=std_scope, eps=0.25)
    (call,) = getattr(core, function).calls
    assert torch.equal(call["token_level_rewards"], scores.unsqueeze(-1))
    assert torch.equal(call["response_mask"], torch.ones(3, 1))
    assert isinstance(call["index"], np.ndarray) and call["index"].tolist() == [5, 5, 9]
    assert call.get("norm_adv_by_std_in_grpo") is by_std
    assert "epsilon" not in call
    assert torch.equal(out, scores * 2)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [({"std_scope": "batch"}, "std_scope"), ({"singleton": "error"}, "singleton")],
)
def test_verl_group_advantages_reject_what_verl_has_not(kwargs: dict[str, Any], argument: str) -> None:
    ops, _ = _verl_ops()
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        ops.group_advantages(torch.ones(2), torch.zeros(2, dtype=torch.long), "grpo", **kwargs)


def test_verl_rollout_correction_thresholds() -> None:
    """TIS is a float threshold (no floor), IcePop the 'low_high' string; the other combinations
    are ValueErrors naming the argument (declared correction_bounds = [])."""
    recorder = _Recorder(lambda **kwargs: (torch.ones_like(kwargs["log_ratio"]), {}))
    ops = verl_family.VerlFamilyOps()
    ops._correction = SimpleNamespace(compute_rollout_correction_weights=recorder)  # type: ignore[assignment]
    logp, rollout, mask = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -2.0]]), torch.ones(1, 2)
    ops.rollout_correction(logp, rollout, mask, high=3.0)
    ops.rollout_correction(logp, rollout, mask, level="sequence", mode="mask", low=0.5, high=2.0)
    first, second = recorder.calls
    assert first["rollout_is_threshold"] == 3.0 and first["rollout_is"] == "token"
    assert torch.equal(first["log_ratio"], logp - rollout)
    assert second["rollout_is_threshold"] == "0.5_2.0" and second["rollout_is"] == "sequence"
    with pytest.raises(ValueError, match=r"^low:"):
        ops.rollout_correction(logp, rollout, mask, high=3.0, low=0.5)
    with pytest.raises(ValueError, match=r"^low:"):
        ops.rollout_correction(logp, rollout, mask, mode="mask", high=3.0)
    with pytest.raises(ValueError, match=r"^level:"):
        ops.rollout_correction(logp, rollout, mask, level="sequence-geometric", high=3.0)


class _Block:
    """Stand-in for OpenRLHF's pinned baseline lines: records each (estimator, n, rewards) it runs
    and returns ``rewards * 10 + n`` (a value that tells where each row went)."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, int, Tensor]] = []

    def run(self, **bindings: Any) -> dict[str, Any]:
        args, rewards = bindings["args"], bindings["rewards"]
        n = args.rollout.n_samples_per_prompt
        self.runs.append((args.algo.advantage.estimator, n, rewards.clone()))
        return {"rewards": rewards * 10 + n}


@pytest.mark.parametrize(
    ("method", "std_scope", "estimator"),
    [
        ("grpo", "group", "group_norm"),
        ("grpo", "none", "dr_grpo"),
        ("dr_grpo", "group", "dr_grpo"),
        ("rloo", "group", "rloo"),
    ],
)
def test_openrlhf_groups_are_laid_out_per_size_as_the_experience_maker_does(
    method: str, std_scope: str, estimator: str
) -> None:
    """Groups of one size become the rows of a (prompts, n) matrix, one run per size, and every
    result goes back to its own row."""
    ops = openrlhf_family.OpenRLHFFamilyOps()
    block = _Block()
    ops._baseline = block  # type: ignore[assignment]
    scores = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], dtype=torch.float64)
    ids = torch.tensor([0, 1, 0, 1, 2, 2, 3])  # sizes: 2, 2, 2 (ids 0, 1, 2) and 1 (id 3)
    out = ops.group_advantages(scores, ids, method, std_scope=std_scope)
    assert sorted((e, n) for e, n, _ in block.runs) == [(estimator, 1), (estimator, 2)]
    layouts = {n: rewards for _, n, rewards in block.runs}
    assert layouts[2].tolist() == [[1.0, 3.0], [2.0, 4.0], [5.0, 6.0]]
    assert layouts[1].tolist() == [[7.0]]
    assert out.tolist() == [12.0, 22.0, 32.0, 42.0, 52.0, 62.0, 71.0]


def test_openrlhf_rollout_correction_reads_the_weights_as_the_gradient() -> None:
    """The loss stand-in multiplies its per-token loss -A by known weights, as PolicyLoss.forward
    does; the op returns those weights (0 off the mask), and the PolicyLoss was built with the
    clip mode, token level and [0, high] when low is not given."""
    built: list[dict[str, Any]] = []
    weights = torch.tensor([[0.5, 2.0, 3.0]])

    class PolicyLoss:
        def __init__(self, **kwargs: Any) -> None:
            built.append(kwargs)

        def __call__(self, logp: Tensor, old: Tensor, adv: Tensor, **kwargs: Any) -> tuple[Any, ...]:
            loss = (weights * -adv * kwargs["action_mask"]).sum() / kwargs["batch_num_tokens"]
            return loss, loss, loss, None, None

    ops = openrlhf_family.OpenRLHFFamilyOps()
    ops._loss = SimpleNamespace(PolicyLoss=PolicyLoss)  # type: ignore[assignment]
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = ops.rollout_correction(torch.zeros(1, 3), torch.zeros(1, 3), mask, high=4.0)
    assert out.tolist() == [[0.5, 2.0, 0.0]]
    assert built == [
        {
            "is_correction_level": "token",
            "is_correction_mode": "clip",
            "is_correction_gating": "ratio",
            "is_correction_threshold": [0.0, 4.0],
        }
    ]


def test_skyrl_rollout_correction_reads_the_weights_off_a_sum() -> None:
    """skyrl 0.4.0's policy loss is a masked sum (the reduction is folded into the advantages), so
    the TIS weights are minus its gradient in the advantages, at the level asked for."""
    weights = torch.tensor([[0.5, 2.0, 3.0], [1.0, 1.5, 9.0]])
    seen: list[Any] = []

    def regular(logp: Tensor, old: Tensor, adv: Tensor, config: Any, **kwargs: Any) -> tuple[Tensor, Any]:
        seen.append(config.off_policy_correction)
        return (weights * -adv * kwargs["loss_mask"]).sum(), {"clip_ratio": 0.0}

    ops = skyrl_family.SkyRLFamilyOps()
    ops._ppo = SimpleNamespace(PolicyLossRegistry=SimpleNamespace(get=lambda name: regular))  # type: ignore[assignment]
    ops._config = SimpleNamespace(  # type: ignore[assignment]
        AlgorithmConfig=lambda **fields: SimpleNamespace(**fields),
        OffPolicyCorrectionConfig=lambda **fields: SimpleNamespace(**fields),
    )
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    for level in ("token", "sequence"):
        out = ops.rollout_correction(torch.zeros(2, 3), torch.zeros(2, 3), mask, level=level, high=4.0)
        torch.testing.assert_close(out, weights * mask)
        assert seen[-1].tis_ratio_type == level
        assert seen[-1].token_tis_ratio_clip_high == seen[-1].sequence_tis_ratio_clip_high == 4.0
    with pytest.raises(ValueError, match=r"^low:"):
        ops.rollout_correction(torch.zeros(2, 3), torch.zeros(2, 3), mask, high=4.0, low=0.5)
    with pytest.raises(ValueError, match=r"^level, mode:"):
        ops.rollout_correction(torch.zeros(2, 3), torch.zeros(2, 3), mask, mode="mask", high=4.0)


def test_trl116_conventions_are_valid_and_each_has_a_source() -> None:
    assert convention_problems(trl_family.CONVENTIONS) == []
    assert set(trl_family.CONVENTION_SOURCES) == set(trl_family.CONVENTIONS)
    assert all(".py" in source for source in trl_family.CONVENTION_SOURCES.values())
    assert set(trl_family.NOT_PROVIDED) <= set(OP_NAMES)


def test_trl116_groups_become_rows_of_num_generations_filled_with_nan() -> None:
    """Each group is one row of width num_generations = the largest group, the missing members NaN
    (TRL's unscorable completions), one run for the whole batch, results read back per sample."""
    seen: list[tuple[Tensor, int, str]] = []

    class Block:
        def run(block, /, **bindings: Any) -> dict[str, Any]:  # self is one of the bindings
            if "rewards" in bindings:
                seen.append(
                    (bindings["rewards"].clone(), bindings["num_generations"], bindings["self"].scale_rewards)
                )
                return {"advantages": torch.nan_to_num(bindings["rewards"], nan=-1.0) * 10}
            return {"advantages": bindings["advantages"]}

    adapter = trl_family.TrlFamilyAdapter.__new__(trl_family.TrlFamilyAdapter)
    adapter._located = {"grpo_advantages": Block(), "grpo_unscorable": Block()}  # type: ignore[dict-item]
    scores = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    out = adapter.group_advantages(scores, torch.tensor([7, 3, 7, 7, 3]), "dr_grpo")
    ((rewards, width, scale),) = seen
    assert width == 3 and scale == "none"
    assert torch.equal(rewards.isnan(), torch.tensor([False, False, True, False, False, False]))
    assert rewards[~rewards.isnan()].tolist() == [2.0, 5.0, 1.0, 3.0, 4.0]  # group 3's row, then group 7's
    assert out.tolist() == [10.0, 20.0, 30.0, 40.0, 50.0]


def test_skyrl_losses_refuse_whole_batch_counts() -> None:
    """skyrl 0.4.0 reads the counts off each mini-batch: the counts are a ValueError naming them."""
    ops = skyrl_family.SkyRLFamilyOps()
    with pytest.raises(ValueError, match=r"^token_count, row_count:"):
        ops.aggregate_loss(torch.ones(1, 2), torch.ones(1, 2), token_count=2)


# --- with the libraries ----------------------------------------------------------------------------

PASSING = {
    "verl": "test_group_advantages_match_the_reference or test_rloo_is_n_over_n_minus_one or "
    "test_aggregate_loss_matches_the_reference and token-mean or test_gspo_loss_matches",
    "openrlhf": "test_group_advantages_match_the_reference or test_rloo_is_n_over_n_minus_one or "
    "test_aggregate_loss_matches_the_reference or test_micro_batches_with_whole_batch_counts",
    "skyrl": "test_group_advantages_match_the_reference and grpo or test_cispo_weight_lies_in",
    "trl116": "test_group_advantages_match_the_reference or test_weights_match_the_reference",
}
"""Per library, family tests that pass (2026-12-01, Hypothesis seed 0; docs/findings-family.md lists
the failures)."""


@pytest.mark.thirdparty
@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PASSING))
def test_family_rows_that_pass_keep_passing(name: str) -> None:
    python = thirdparty_python(name)  # skips where .envs/NAME is missing; fails under PPO_REF_REQUIRE_ENVS=1
    command = [str(python), "-m", "pytest", "conformance/", f"--impl={name}", "-q", "-p", "no:cacheprovider",
               "--hypothesis-seed=0"]  # fmt: skip
    result = subprocess.run(
        [*command, "-k", f"family and ({PASSING[name]})"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    tail = (result.stdout + result.stderr)[-3000:]
    assert result.returncode == 0, tail
    assert " passed" in result.stdout, tail


def test_module_docstrings_name_each_family_op() -> None:
    for module in FAMILY.values():
        text = module.__doc__ or ""
        for op in ("group_advantages", "aggregate_loss", "gspo_loss", "kl_loss", "rollout_correction"):
            assert op in text, (module.__name__, op)
    assert sys.modules["ppo_ref.adapters.thirdparty.verl_family"] is verl_family
