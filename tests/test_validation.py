"""Bad input gives a clear ValueError naming the argument (spec IN-2).

For every public function: wrong shapes and ranks of each tensor argument, non-tensor arguments,
integer tensors where floats are needed, non-binary masks, NaN/inf on a masked-in entry, fewer than
2 entries for a variance, bad scalars (out of range, NaN, a bool passed as a number, unknown
names), out-of-range token ids and NaN/+inf logits. Each case first checks that the untouched
arguments are accepted, so the error comes from the one bad argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

import ppo_ref

B, T, V = 2, 4, 5


def _logp(seed: int) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return -torch.rand(B, T, generator=generator) * 3


def _mask() -> Tensor:
    mask = torch.ones(B, T)
    mask[1, 3] = 0  # right padding in row 1
    return mask


def _logits(length: int) -> Tensor:
    return torch.randn(B, length, V, generator=torch.Generator().manual_seed(0))


Call = tuple[Callable[..., Any], Callable[[], dict[str, Any]]]

# name -> (function, factory of valid keyword arguments)
FUNCTIONS: dict[str, Call] = {
    "token_logprobs": (
        ppo_ref.token_logprobs,
        lambda: {"logits": _logits(T + 1), "input_ids": torch.arange(B * (T + 1)).reshape(B, T + 1) % V,
                 "temperature": 1.0},
    ),
    "entropy": (ppo_ref.entropy, lambda: {"logits": _logits(T)}),
    "masked_mean": (ppo_ref.masked_mean, lambda: {"x": _logp(0), "mask": _mask()}),
    "masked_var": (ppo_ref.masked_var, lambda: {"x": _logp(0), "mask": _mask(), "unbiased": True}),
    "masked_whiten": (ppo_ref.masked_whiten, lambda: {"x": _logp(0), "mask": _mask(), "shift_mean": True}),
    "kl_penalty": (
        ppo_ref.kl_penalty,
        lambda: {"logp": _logp(0), "ref_logp": _logp(1), "estimator": "k3", "mask": _mask()},
    ),
    "token_rewards": (
        ppo_ref.token_rewards,
        lambda: {"scores": torch.tensor([1.0, -1.0]), "logp": _logp(0), "ref_logp": _logp(1), "mask": _mask(),
                 "kl_coef": 0.1, "estimator": "k1"},
    ),
    "gae": (
        ppo_ref.gae,
        lambda: {"rewards": _logp(0), "values": _logp(1), "mask": _mask(), "gamma": 1.0, "lam": 0.95,
                 "last_values": torch.tensor([0.5, 0.0])},
    ),
    "policy_loss": (
        ppo_ref.policy_loss,
        lambda: {"logp": _logp(0), "old_logp": _logp(1), "advantages": _logp(2), "mask": _mask(),
                 "clip_eps": 0.2, "loss_agg": "token-mean"},
    ),
    "aggregate_loss": (
        ppo_ref.aggregate_loss,
        lambda: {"per_token": _logp(0), "mask": _mask(), "loss_agg": "seq-mean-token-sum"},
    ),
    "value_loss": (
        ppo_ref.value_loss,
        lambda: {"values": _logp(0), "old_values": _logp(1), "returns": _logp(2), "mask": _mask(),
                 "clip_eps": 0.2},
    ),
    "ppo_penalty_loss": (
        ppo_ref.ppo_penalty_loss,
        lambda: {"logp": _logp(0), "old_logp": _logp(1), "advantages": _logp(2), "mask": _mask(),
                 "beta": 0.1},
    ),
    "explained_variance": (
        ppo_ref.explained_variance,
        lambda: {"values": _logp(0), "returns": _logp(1), "mask": _mask()},
    ),
}  # fmt: skip


def _expect_error(function: str, argument: str, **changes: Any) -> None:
    """Call ``function`` with valid arguments (which must work) and then with ``changes``:
    a ValueError whose message names ``argument`` as a whole word."""
    call, make = FUNCTIONS[function]
    call(**make())
    kwargs = {**make(), **changes}
    with pytest.raises(ValueError, match=rf"(?<![\w]){argument}(?![\w])"):
        call(**kwargs)


def _tensor_arguments(kind: str) -> list[tuple[str, str]]:
    """(function, argument) pairs for the tensor arguments: ``float`` ones, ``mask`` or ``any``."""
    pairs = []
    for function, (_, make) in FUNCTIONS.items():
        for argument, value in make().items():
            if not isinstance(value, Tensor):
                continue
            if (
                kind == "any"
                or (kind == "mask" and argument == "mask")
                or (kind == "float" and argument != "mask" and value.is_floating_point())
            ):
                pairs.append((function, argument))
    return pairs


FLOAT_ARGUMENTS = _tensor_arguments("float")
MASK_FUNCTIONS = [f for f, _ in _tensor_arguments("mask")]
TENSOR_ARGUMENTS = _tensor_arguments("any")


def test_valid_arguments_are_accepted() -> None:
    for call, make in FUNCTIONS.values():
        call(**make())
    assert len(FLOAT_ARGUMENTS) >= 25 and len(MASK_FUNCTIONS) == 11


# --- shapes and types ---------------------------------------------------------------------------


def _wrong_shapes(argument: str, value: Tensor) -> list[Tensor]:
    """Tensors like ``value`` with one more position on axis 1 (on axis 0 for a (B,) vector), one
    axis fewer and one axis more."""
    axis = 1 if value.dim() > 1 else 0
    longer = torch.cat([value, value.narrow(axis, 0, 1)], dim=axis)
    if argument == "logits":
        # A wider vocabulary is valid, and entropy takes any number of positions.
        return (
            [longer, value[..., 0], value[..., None]]
            if value.shape[1] == T + 1
            else [value[..., 0], value[..., None]]
        )
    return [longer, value.reshape(-1) if value.dim() > 1 else value[None, None], value[None]]


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize(("function", "argument"), TENSOR_ARGUMENTS)
def test_wrong_shape_names_the_argument(function: str, argument: str) -> None:
    value = FUNCTIONS[function][1]()[argument]
    for bad in _wrong_shapes(argument, value):
        _expect_error(function, argument, **{argument: bad})


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
    for dtype in (torch.int64, torch.int32, torch.bool):
        _expect_error(function, argument, **{argument: value.to(dtype)})


# --- masks --------------------------------------------------------------------------------------


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize("function", MASK_FUNCTIONS)
@pytest.mark.parametrize("bad", [2.0, 0.5, -1.0, math.nan])
def test_non_binary_mask(function: str, bad: float) -> None:
    mask = _mask()
    mask[0, 1] = bad
    _expect_error(function, "mask", mask=mask)
    if math.isfinite(bad) and bad == int(bad):
        _expect_error(function, "mask", mask=mask.to(torch.int64))


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize(("function", "argument"), FLOAT_ARGUMENTS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_or_inf_on_a_masked_in_entry(function: str, argument: str, bad: float) -> None:
    value = FUNCTIONS[function][1]()[argument].clone()
    if argument == "logits" and bad == -math.inf:
        value[0, 0, :] = bad  # a single -inf logit is a banned token; a whole row of them is not
    else:
        value.view(-1)[1] = bad  # index 1 is masked in (the mask's only 0 is the last entry of row 1)
    _expect_error(function, argument, **{argument: value})


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize("function", ["masked_var", "masked_whiten", "explained_variance"])
@pytest.mark.parametrize("tokens", [0, 1])
def test_fewer_than_two_entries(function: str, tokens: int) -> None:
    mask = torch.zeros(B, T)
    mask[1, :tokens] = 1
    _expect_error(function, "mask", mask=mask)


# --- scalars ------------------------------------------------------------------------------------

NOT_A_NUMBER = [True, "1", None, torch.ones(2)]

BAD_SCALARS: list[tuple[str, str, list[Any]]] = [
    ("gae", "gamma", [-0.1, 1.1, math.nan, math.inf, *NOT_A_NUMBER]),
    ("gae", "lam", [-0.1, 1.1, math.nan, *NOT_A_NUMBER]),
    ("policy_loss", "clip_eps", [0.0, -0.2, math.nan, math.inf, *NOT_A_NUMBER]),
    ("value_loss", "clip_eps", [0.0, -1.0, math.nan, True, "0.2"]),
    ("value_loss", "clip_form", ["min", "clipped", None, 1]),
    ("token_logprobs", "temperature", [0.0, -1.0, math.nan, math.inf, *NOT_A_NUMBER]),
    ("token_rewards", "kl_coef", [-0.1, math.nan, math.inf, *NOT_A_NUMBER]),
    ("token_rewards", "estimator", ["k4", "K1", None, 1]),
    ("kl_penalty", "estimator", ["k4", "kl", None]),
    ("policy_loss", "loss_agg", ["mean", "token_mean", None]),
    ("aggregate_loss", "loss_agg", ["sum", None]),
    ("ppo_penalty_loss", "beta", [-1.0, math.nan, *NOT_A_NUMBER]),
    ("masked_var", "unbiased", [1, "yes", None]),
    ("masked_whiten", "shift_mean", [0, "no", None]),
    ("masked_whiten", "unbiased", [1, "yes", None]),
    ("masked_mean", "dim", [2, -3, 5]),
]


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize(("function", "argument", "values"), BAD_SCALARS)
def test_bad_scalar_names_the_argument(function: str, argument: str, values: list[Any]) -> None:
    for bad in values:
        _expect_error(function, argument, **{argument: bad})


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize("bad", [1.5, "0", True])
def test_masked_mean_non_integer_dim(bad: object) -> None:
    _expect_error("masked_mean", "dim", dim=bad)


CONTROLLER_CASES: list[tuple[Callable[[], Any], str]] = [
    (lambda: ppo_ref.AdaptiveKLController(-0.1, 6.0, 10000), "init_kl_coef"),
    (lambda: ppo_ref.AdaptiveKLController(math.nan, 6.0, 10000), "init_kl_coef"),
    (lambda: ppo_ref.AdaptiveKLController(True, 6.0, 10000), "init_kl_coef"),
    (lambda: ppo_ref.AdaptiveKLController(0.1, 0.0, 10000), "target"),
    (lambda: ppo_ref.AdaptiveKLController(0.1, -1.0, 10000), "target"),
    (lambda: ppo_ref.AdaptiveKLController(0.1, 6.0, 0), "horizon"),
    (lambda: ppo_ref.AdaptiveKLController(0.1, 6.0, math.nan), "horizon"),
    (lambda: ppo_ref.AdaptiveKLController(0.1, 6.0, 10000).update(math.nan, 8), "kl"),
    (lambda: ppo_ref.AdaptiveKLController(0.1, 6.0, 10000).update(math.inf, 8), "kl"),
    (lambda: ppo_ref.AdaptiveKLController(0.1, 6.0, 10000).update("1", 8), "kl"),
    (lambda: ppo_ref.AdaptiveKLController(0.1, 6.0, 10000).update(1.0, 0), "n_steps"),
    (lambda: ppo_ref.AdaptiveKLController(0.1, 6.0, 10000).update(1.0, 1.5), "n_steps"),
    (lambda: ppo_ref.AdaptiveKLController(0.1, 6.0, 10000).update(1.0, True), "n_steps"),
    (lambda: ppo_ref.FixedKLController(-0.1), "kl_coef"),
    (lambda: ppo_ref.FixedKLController(math.nan), "kl_coef"),
    (lambda: ppo_ref.FixedKLController(True), "kl_coef"),
    (lambda: ppo_ref.FixedKLController(0.1).update(math.nan, 8), "kl"),
    (lambda: ppo_ref.FixedKLController(0.1).update(1.0, -1), "n_steps"),
    (lambda: ppo_ref.update_penalty_beta(-1.0, 0.01, 0.01), "beta"),
    (lambda: ppo_ref.update_penalty_beta(True, 0.01, 0.01), "beta"),
    (lambda: ppo_ref.update_penalty_beta(1.0, math.nan, 0.01), "kl"),
    (lambda: ppo_ref.update_penalty_beta(1.0, 0.01, 0.0), "target_kl"),
    (lambda: ppo_ref.update_penalty_beta(1.0, 0.01, -0.01), "target_kl"),
]


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize(("call", "argument"), CONTROLLER_CASES)
def test_bad_controller_and_beta_arguments(call: Callable[[], Any], argument: str) -> None:
    with pytest.raises(ValueError, match=rf"(?<![\w]){argument}(?![\w])"):
        call()


def test_valid_controllers_are_accepted() -> None:
    assert ppo_ref.AdaptiveKLController(0.1, 6.0, 10000).update(6.0, 8) == 0.1
    assert ppo_ref.FixedKLController(0.1).update(100.0, 8) == 0.1
    assert ppo_ref.update_penalty_beta(1.0, 0.01, 0.01) == 1.0


# --- token ids and logits -----------------------------------------------------------------------


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize("bad", [-1, V, V + 100])
def test_token_ids_out_of_range(bad: int) -> None:
    ids = FUNCTIONS["token_logprobs"][1]()["input_ids"].clone()
    ids[1, 2] = bad
    _expect_error("token_logprobs", "input_ids", input_ids=ids)


@pytest.mark.clause("IN-2")
def test_token_ids_must_be_integers() -> None:
    ids = FUNCTIONS["token_logprobs"][1]()["input_ids"]
    _expect_error("token_logprobs", "input_ids", input_ids=ids.float())


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.uint8])
def test_token_ids_of_a_narrow_integer_dtype_are_accepted(dtype: torch.dtype) -> None:
    arguments = FUNCTIONS["token_logprobs"][1]()
    expected = ppo_ref.token_logprobs(**arguments)
    narrow = dict(arguments, input_ids=arguments["input_ids"].to(dtype))
    assert torch.equal(ppo_ref.token_logprobs(**narrow), expected)


@pytest.mark.clause("IN-2")
def test_token_ids_of_dtype_bool_are_rejected() -> None:
    ids = FUNCTIONS["token_logprobs"][1]()["input_ids"] % 2
    _expect_error("token_logprobs", "input_ids", input_ids=ids.bool())


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize("function", ["token_logprobs", "entropy"])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_logits_with_nan_or_plus_inf(function: str, bad: float) -> None:
    logits = FUNCTIONS[function][1]()["logits"].clone()
    logits[1, 0, 3] = bad
    _expect_error(function, "logits", logits=logits)


@pytest.mark.clause("IN-2")
@pytest.mark.parametrize("function", ["token_logprobs", "entropy"])
def test_banned_tokens_are_accepted(function: str) -> None:
    call, make = FUNCTIONS[function]
    kwargs = make()
    kwargs["logits"][:, :, 0] = -math.inf  # id 0 is never scored: input_ids[:, 1:] skips it
    kwargs.pop("input_ids", None)
    if function == "token_logprobs":
        kwargs["input_ids"] = torch.ones(B, T + 1, dtype=torch.long)
    assert bool(torch.isfinite(call(**kwargs)).all())


@pytest.mark.clause("IN-2")
def test_scores_and_last_values_must_be_finite() -> None:
    _expect_error("token_rewards", "scores", scores=torch.tensor([1.0, math.nan]))
    _expect_error("gae", "last_values", last_values=torch.tensor([math.inf, 0.0]))


def test_numpy_is_not_silently_accepted_as_a_mask() -> None:
    _expect_error("gae", "mask", mask=np.ones((B, T)))
