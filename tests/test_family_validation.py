"""Bad input to the PPO-family functions gives a ValueError naming the argument (spec IN-2).

Every argument of ``group_advantages``, ``aggregate_loss`` (its new mode and count keywords),
``policy_loss``'s and ``value_loss``'s new keywords, ``gspo_loss``, ``cispo_loss``, ``kl_loss`` and
``rollout_correction``: wrong shapes, non-tensors, integer tensors where floats are needed,
non-binary masks, NaN/inf on a masked-in entry, out-of-range or wrongly typed scalars, unknown
names, and keywords given to a mode that does not use them. Each case first checks that the
untouched arguments are accepted, so the error comes from the one bad argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

import ppo_ref

B, T = 3, 4


def _logp(seed: int) -> Tensor:
    return -torch.rand(B, T, generator=torch.Generator().manual_seed(seed)) * 3


def _mask() -> Tensor:
    mask = torch.ones(B, T)
    mask[1, 3] = 0  # right padding in row 1
    mask[2, 1] = 0  # a hole in row 2
    return mask


Call = tuple[Callable[..., Any], Callable[[], dict[str, Any]]]

FUNCTIONS: dict[str, Call] = {
    "group_advantages": (
        ppo_ref.group_advantages,
        lambda: {"scores": torch.tensor([1.0, 0.0, 0.5]), "group_ids": torch.tensor([4, 4, 9]),
                 "method": "grpo", "std_scope": "group", "eps": 1e-6, "singleton": "zero"},
    ),
    "aggregate_loss": (
        ppo_ref.aggregate_loss,
        lambda: {"per_token": _logp(0), "mask": _mask(), "loss_agg": "seq-mean-token-sum-norm",
                 "norm_constant": 8.0, "row_count": 5},
    ),
    "policy_loss": (
        ppo_ref.policy_loss,
        lambda: {"logp": _logp(0), "old_logp": _logp(1), "advantages": _logp(2), "mask": _mask(),
                 "clip_eps": 0.2, "loss_agg": "token-mean", "clip_eps_high": 0.28, "dual_clip": 3.0,
                 "token_count": 20},
    ),
    "value_loss": (
        ppo_ref.value_loss,
        lambda: {"values": _logp(0), "old_values": _logp(1), "returns": _logp(2), "mask": _mask(),
                 "clip_eps": 0.2, "loss_agg": "seq-mean-token-mean", "row_count": 4},
    ),
    "gspo_loss": (
        ppo_ref.gspo_loss,
        lambda: {"logp": _logp(0), "old_logp": _logp(1), "advantages": torch.tensor([1.0, -1.0, 0.5]),
                 "mask": _mask(), "clip_eps": 3e-4, "clip_eps_high": 4e-4, "row_count": 6},
    ),
    "cispo_loss": (
        ppo_ref.cispo_loss,
        lambda: {"logp": _logp(0), "old_logp": _logp(1), "advantages": _logp(2), "mask": _mask(),
                 "clip_low": 1.0, "clip_high": 4.0, "loss_agg": "token-mean", "token_count": 12},
    ),
    "kl_loss": (
        ppo_ref.kl_loss,
        lambda: {"logp": _logp(0), "ref_logp": _logp(1), "mask": _mask(), "estimator": "k3+",
                 "loss_agg": "seq-mean-token-sum", "row_count": 3},
    ),
    "rollout_correction": (
        ppo_ref.rollout_correction,
        lambda: {"logp": _logp(0), "rollout_logp": _logp(1), "mask": _mask(), "level": "sequence",
                 "mode": "mask", "high": 2.0, "low": 0.5},
    ),
}  # fmt: skip


def _expect_error(function: str, argument: str, **changes: Any) -> None:
    """Valid arguments work; with ``changes`` a ValueError names ``argument`` as a whole word."""
    call, make = FUNCTIONS[function]
    call(**make())
    kwargs = {k: v for k, v in {**make(), **changes}.items() if v is not _DROP}
    with pytest.raises(ValueError, match=rf"(?<![\w]){argument}(?![\w])"):
        call(**kwargs)


_DROP = object()
"""A change that removes the keyword (to test a keyword that is required in some mode)."""

TENSOR_ARGUMENTS = [
    (function, argument)
    for function, (_, make) in FUNCTIONS.items()
    for argument, value in make().items()
    if isinstance(value, Tensor)
]
FLOAT_ARGUMENTS = [
    (f, a)
    for f, a in TENSOR_ARGUMENTS
    if a not in ("mask", "group_ids") and FUNCTIONS[f][1]()[a].is_floating_point()
]
MASK_FUNCTIONS = [f for f, a in TENSOR_ARGUMENTS if a == "mask"]


def test_valid_arguments_are_accepted() -> None:
    for call, make in FUNCTIONS.values():
        call(**make())
    assert len(TENSOR_ARGUMENTS) == 26 and len(MASK_FUNCTIONS) == 7


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize(("function", "argument"), TENSOR_ARGUMENTS)
def test_wrong_shape_names_the_argument(function: str, argument: str) -> None:
    value = FUNCTIONS[function][1]()[argument]
    axis = 1 if value.dim() > 1 else 0
    longer = torch.cat([value, value.narrow(axis, 0, 1)], dim=axis)
    for bad in (longer, value.reshape(-1) if value.dim() > 1 else value[None, None], value[None]):
        # scores sets B: one score more is reported as the group_ids that no longer match it
        named = "group_ids" if (argument, bad.dim()) == ("scores", 1) else argument
        _expect_error(function, named, **{argument: bad})


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize(("function", "argument"), TENSOR_ARGUMENTS)
def test_non_tensor_names_the_argument(function: str, argument: str) -> None:
    value = FUNCTIONS[function][1]()[argument]
    for bad in (value.tolist(), value.numpy(), 1.0):
        _expect_error(function, argument, **{argument: bad})


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize(("function", "argument"), FLOAT_ARGUMENTS)
def test_integer_tensor_where_floats_are_needed(function: str, argument: str) -> None:
    value = FUNCTIONS[function][1]()[argument]
    for dtype in (torch.int64, torch.bool):
        _expect_error(function, argument, **{argument: value.to(dtype)})


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize(("function", "argument"), FLOAT_ARGUMENTS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_or_inf_on_a_masked_in_entry(function: str, argument: str, bad: float) -> None:
    value = FUNCTIONS[function][1]()[argument].clone()
    value.view(-1)[0] = bad  # entry 0 is masked in (and is row 0's score / advantage for a (B,) input)
    _expect_error(function, argument, **{argument: value})


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize("function", MASK_FUNCTIONS)
@pytest.mark.parametrize("bad", [2.0, 0.5, -1.0, math.nan])
def test_non_binary_mask(function: str, bad: float) -> None:
    mask = _mask()
    mask[0, 1] = bad
    _expect_error(function, "mask", mask=mask)


# --- group_advantages -------------------------------------------------------------------------------


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize(
    ("argument", "bad"),
    [
        ("group_ids", torch.tensor([4.0, 4.0, 9.0])),
        ("group_ids", torch.tensor([True, True, False])),
        ("group_ids", [4, 4, 9]),
        ("group_ids", torch.tensor([4, 4])),
        ("group_ids", torch.tensor([[4, 4, 9]])),
        ("method", "ppo"),
        ("method", None),
        ("std_scope", "row"),
        ("eps", -1e-6),
        ("eps", math.nan),
        ("eps", True),
        ("eps", "1e-6"),
        ("singleton", "drop"),
    ],
)
def test_group_advantages_bad_scalars(argument: str, bad: object) -> None:
    _expect_error("group_advantages", argument, **{argument: bad})


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize("method", ["dr_grpo", "rloo"])
@pytest.mark.parametrize("scope", ["batch", "none"])
def test_std_scope_is_for_grpo_only(method: str, scope: str) -> None:
    _expect_error("group_advantages", "std_scope", method=method, std_scope=scope)


@pytest.mark.clause("IN-2")
def test_singleton_error_names_the_group_ids() -> None:
    """GRP-3: ``singleton='error'`` refuses a group of one (group 9 here)."""
    _expect_error("group_advantages", "group_ids", singleton="error")
    ppo_ref.group_advantages(torch.tensor([1.0, 0.0]), torch.tensor([4, 4]), singleton="error")


# --- aggregation keywords (AGG-3), shared by every loss ---------------------------------------------

AGGREGATING = ["aggregate_loss", "policy_loss", "value_loss", "cispo_loss", "kl_loss"]


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize("function", AGGREGATING)
def test_unknown_loss_agg(function: str) -> None:
    _expect_error(function, "loss_agg", loss_agg="token-sum", token_count=None, row_count=None)


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize("function", AGGREGATING)
def test_norm_constant_is_required_by_the_norm_mode_and_only_there(function: str) -> None:
    norm = {"loss_agg": "seq-mean-token-sum-norm", "token_count": None, "row_count": None}
    _expect_error(function, "norm_constant", **norm, norm_constant=_DROP)
    for bad in (0.0, -2.0, math.nan, math.inf, True):
        _expect_error(function, "norm_constant", **norm, norm_constant=bad)
    _expect_error(
        function, "norm_constant", loss_agg="token-mean", token_count=None, row_count=None, norm_constant=8.0
    )


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize("function", AGGREGATING)
def test_token_count_is_for_token_mean_only_and_a_whole_batch_count(function: str) -> None:
    token = {"loss_agg": "token-mean", "row_count": None, "norm_constant": None}
    own = int(_mask().sum())
    for bad in (own - 1, 0, -3, 2.5, math.nan, torch.tensor([own - 1]), "12"):
        _expect_error(function, "token_count", **token, token_count=bad)
    ppo_ref.aggregate_loss(_logp(0), _mask(), token_count=torch.tensor(own))
    _expect_error(
        function,
        "token_count",
        loss_agg="seq-mean-token-mean",
        token_count=own,
        row_count=None,
        norm_constant=None,
    )


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize("function", AGGREGATING)
def test_row_count_is_not_for_token_mean_and_is_a_whole_batch_count(function: str) -> None:
    seq = {"loss_agg": "seq-mean-token-mean", "token_count": None, "norm_constant": None}
    for bad in (2, 0, 1.5, -1, math.inf):
        _expect_error(function, "row_count", **seq, row_count=bad)
    norm = {"loss_agg": "seq-mean-token-sum-norm", "token_count": None, "norm_constant": 4.0}
    _expect_error(function, "row_count", **norm, row_count=2)  # B = 3 rows passed, empty ones count too
    _expect_error(
        function, "row_count", loss_agg="token-mean", token_count=None, norm_constant=None, row_count=3
    )


@pytest.mark.clause("IN-2")
def test_gspo_row_count() -> None:
    for bad in (2, 0, 2.5, math.nan):
        _expect_error("gspo_loss", "row_count", row_count=bad)


# --- clip options, CISPO bounds, estimators, corrections ------------------------------------------


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize(
    ("function", "argument", "bad"),
    [
        *[("policy_loss", "clip_eps_high", bad) for bad in (0.0, -0.1, math.nan, math.inf, True, "0.28")],
        *[("policy_loss", "dual_clip", bad) for bad in (1.0, 0.5, -3.0, math.nan, math.inf, True)],
        *[("gspo_loss", "clip_eps", bad) for bad in (0.0, -1e-4, math.nan, None)],
        *[("gspo_loss", "clip_eps_high", bad) for bad in (0.0, -1e-4, math.nan, True)],
        *[("cispo_loss", "clip_low", bad) for bad in (-0.1, math.nan, math.inf, None, True)],
        *[("cispo_loss", "clip_high", bad) for bad in (-0.1, math.nan, math.inf, None, True)],
        *[("kl_loss", "estimator", bad) for bad in ("k4", "K3", "k3 ", None, "low_var_kl")],
        *[("rollout_correction", "level", bad) for bad in ("seq", "geometric", None)],
        *[("rollout_correction", "mode", bad) for bad in ("clip", "tis", None)],
        *[("rollout_correction", "high", bad) for bad in (0.0, -2.0, math.nan, None, True)],
        *[("rollout_correction", "low", bad) for bad in (0.0, -0.5, 3.0, math.nan, True)],
        ("value_loss", "clip_eps", -0.2),
    ],
)
def test_bad_scalar_names_the_argument(function: str, argument: str, bad: object) -> None:
    _expect_error(function, argument, **{argument: bad})


@pytest.mark.clause("IN-2")
def test_rollout_correction_high_is_required() -> None:
    call, make = FUNCTIONS["rollout_correction"]
    kwargs = make()
    del kwargs["high"]
    with pytest.raises(TypeError, match="high"):
        call(**kwargs)
