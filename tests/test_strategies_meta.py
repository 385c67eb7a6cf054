"""Meta-tests of the suite's strategies (``conformance.strategies``): each draws what its docstring
promises (issue 25; array-api-tests keeps such tests in ``meta_tests/``).

The conformance verdicts are only as good as the draws, so each public strategy is drawn here under
the declared input conventions a suite run can set (:func:`conformance.strategies.declared_inputs`)
and its draws are checked against its docstring: one (B, T) shape across a bundle's tensors, the
dtypes, masks of 0/1 with right padding (a prefix of action tokens when holes are off), at least
one action token per row where promised, the declared ``masked_fill`` in the masked-out slots, no
edge input (hole, empty row, ``-inf`` logit) when it is declared off, the documented ranges, and a
``repr`` that rebuilds an equal bundle after ``from conformance.strategies import *``.

A property that holds of every draw is asserted on each draw; a feature that only *some* draws
have (padding, holes, empty rows, junk in masked-out slots, banned tokens) is asserted to appear
at least once in the run, so a strategy that silently stopped drawing it fails here too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor

from conformance import strategies as cs

EXAMPLES = 25
"""Draws per meta-test: enough for every feature below to appear in the derandomized runs."""

PUBLIC_NAMES = (
    "AggregationBatch", "CISPOBatch", "CORRECTION_LEVELS", "CORRECTION_MODES", "COUNT_AGGREGATIONS",
    "ClipBatch", "CorrectionBatch", "EVBatch", "FLOAT_DTYPES", "GAEBatch", "GROUP_ID_POOL",
    "GROUP_METHODS", "GSPOBatch", "GroupBatch", "HALF_DTYPES", "JUNK_VALUES", "KLBatch",
    "KLControllerCase", "KLLossBatch", "KL_ESTIMATORS", "KL_LOSS_ESTIMATORS", "LOSS_AGGREGATIONS",
    "LogitsBatch", "MASK_DTYPES", "MaskedBatch", "PenaltyBatch", "PolicyBatch", "RewardBatch",
    "STD_SCOPES", "ValueBatch", "aggregation_batches", "append_padding", "batch_shapes",
    "cispo_batches", "clip_batches", "clip_eps", "clip_eps_highs", "correction_batches",
    "declared_inputs", "dual_clips", "ev_batches", "fill_masked", "float_dtypes", "float_tensors",
    "gae_batches", "gammas", "group_batches", "gspo_batches", "hole_positions", "insert_holes",
    "junk_floats", "junk_tensors", "kl_batches", "kl_coefs", "kl_controller_cases", "kl_estimators",
    "kl_loss_batches", "lams", "logits_batches", "loss_aggregations", "masked_batches",
    "masked_fills", "masks", "micro_batches", "norm_constants", "penalty_batches", "policy_batches",
    "register_profiles", "reward_batches", "temperatures", "tensor_code", "token_ids",
    "value_batches", "value_clips", "whole_batch_counts",
)  # fmt: skip
"""``__all__`` of ``conformance/strategies.py`` before it became a package (issue 25), by hand:
the names a pasted reproduction may use after ``from conformance.strategies import *``."""


# --------------------------------------------------------------------------------------------------
# The public names


def test_the_star_import_gives_the_names_of_the_single_module() -> None:
    namespace: dict[str, Any] = {}
    exec("from conformance.strategies import *", namespace)
    assert sorted(cs.__all__) == sorted(PUBLIC_NAMES)
    assert len(cs.__all__) == len(set(cs.__all__))
    assert set(namespace) - {"__builtins__"} == set(PUBLIC_NAMES)
    # Public but outside __all__ (the suite's tests read them as cs.NAME).
    assert (cs.LOGP_MIN, cs.LOG_RATIO_MAX, cs.MAX_ROWS, cs.MAX_STEPS) == (-12.0, 3.0, 6, 12)


def test_each_module_of_the_package_names_its_one_job() -> None:
    for name in ("inputs", "reprs", "primitives", "bundles", "family"):
        module = getattr(cs, name)
        assert module.__doc__ and "One job:" in module.__doc__, name


def test_the_docstring_examples_of_the_strategies_run() -> None:
    import doctest
    import warnings

    from hypothesis.errors import NonInteractiveExampleWarning

    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner()
    for name in ("inputs", "reprs", "primitives", "bundles", "family"):
        module = getattr(cs, name)
        for test in finder.find(module, module.__name__, globs=dict(vars(module))):
            with warnings.catch_warnings():  # the examples are for a shell: .example() is right there
                warnings.simplefilter("ignore", NonInteractiveExampleWarning)
                runner.run(test)
    failed, attempted = runner.summarize(verbose=False)
    assert attempted > 0 and failed == 0


# --------------------------------------------------------------------------------------------------
# Declared input conventions and the drawing harness


@dataclass(frozen=True)
class Declared:
    """One setting of :func:`declared_inputs`; ``name`` is the test id."""

    name: str
    masked_fill: str | float = "any"
    holes: bool = True
    empty_rows: bool = True
    inf_logits: bool = True

    @contextlib.contextmanager
    def block(self) -> Iterator[None]:
        with cs.declared_inputs(self.masked_fill, self.holes, self.empty_rows, self.inf_logits):
            yield


DECLARED = (
    Declared("any"),
    Declared("zero-no-edges", "zero", holes=False, empty_rows=False, inf_logits=False),
    Declared("finite", "finite"),
    Declared("pad-value", -1.5),
)


def draws(strategy: st.SearchStrategy[Any], declared: Declared | None, check: Callable[[Any], None]) -> None:
    """Draw ``EXAMPLES`` values of ``strategy`` inside ``declared``'s block (None: in no block) and
    check each.

    Derandomized whatever the profile: the features required of a run (:meth:`Seen.require`) are
    common but not certain in 25 random draws (under ``thorough``, about one run in six missed one
    somewhere among the meta-tests), so a run is the same on every machine and every profile."""

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        with declared.block() if declared else contextlib.nullcontext():
            value = data.draw(strategy)
        check(value)

    run()


class Seen(set[str]):
    """The features met in a run's draws (``padding``, ``holes``, ``empty``, ``junk``, ...)."""

    def require(self, *features: str) -> None:
        missing = sorted(set(features) - self)
        assert not missing, f"no draw in {EXAMPLES} had {missing}; the strategy stopped drawing them"


# --------------------------------------------------------------------------------------------------
# Checks shared by the bundles


def check_mask(
    mask: Tensor, declared: Declared, seen: Seen, *, empty_rows: bool, min_tokens: int = 1
) -> None:
    """A (B, T) action mask: bool or 0/1, right padding after each row's last action token, holes
    and empty rows only where allowed, at least ``min_tokens`` action tokens."""
    assert mask.ndim == 2 and mask.dtype in cs.MASK_DTYPES, (mask.shape, mask.dtype)
    assert bool(((mask == 0) | (mask == 1)).all()), "a mask holds only 0 and 1"
    keep = (mask != 0).tolist()
    assert sum(map(sum, keep)) >= min_tokens
    steps = mask.shape[1]
    lengths = set()
    for row in keep:
        length = max((column + 1 for column, on in enumerate(row) if on), default=0)
        if 0 < length < steps:
            seen.add("padding")  # after an action token: an empty row is not a padded one
        if sum(row) == 1:
            seen.add("single")
        if length:
            lengths.add(length)
        if not all(row[:length]):
            seen.add("holes")
            assert declared.holes, f"a hole although holes are declared off: {row}"
        if length == 0:
            seen.add("empty")
            assert empty_rows and declared.empty_rows, f"a row without an action token: {keep}"
    if len(lengths) > 1:
        seen.add("unequal")


def check_fill(
    tensors: list[Tensor], mask: Tensor, declared: Declared, junk: bool | None, seen: Seen
) -> None:
    """The (B, T) float tensors: finite on the action tokens; in the masked-out slots what the
    declared ``masked_fill`` puts there, unless junk is written (``junk`` True, or drawn under "any")."""
    keep = mask != 0
    for tensor in tensors:
        assert tensor.shape == mask.shape, (tensor.shape, mask.shape)
        assert bool(torch.isfinite(tensor[keep]).all()), "a non-finite value on an action token"
        off = tensor[~keep]
        if off.numel() and not bool((torch.isfinite(off) & (off.abs() < 1e6)).all()):
            seen.add("junk")
        if junk or (junk is None and declared.masked_fill == "any"):
            continue
        if declared.masked_fill == "zero":
            assert bool((off == 0).all()), f"masked-out slots not zero: {off}"
        elif isinstance(declared.masked_fill, float):
            assert bool((off == declared.masked_fill).all()), f"masked-out slots not the pad value: {off}"
        else:
            assert bool(torch.isfinite(off).all()), f"masked-out slots not finite: {off}"


def within(tensor: Tensor, low: float, high: float, where: Tensor | None = None) -> bool:
    picked = tensor.double() if where is None else tensor.double()[where != 0]
    return bool(((picked >= low) & (picked <= high)).all())


def close_to(a: Tensor, b: Tensor, bound: float, where: Tensor) -> bool:
    """|a - b| <= bound on the action tokens, up to the rounding of the tensors' dtype."""
    on = where != 0
    if not bool(on.any()):
        return True
    slack = bound + 1e-5 * (1 + bound + float(b.double()[on].abs().max()))
    return bool(((a.double() - b.double()).abs()[on] <= slack).all())


NAMESPACE: dict[str, Any] = {"torch": torch}
exec("from conformance.strategies import *", NAMESPACE)


def same_value(a: object, b: object) -> bool:
    """Equal, tensors value for value (dtype, shape, NaN where NaN, the sign of zeros included)."""
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if not a.is_floating_point():
            return bool(torch.equal(a, b))
        x, y = a.double(), b.double()
        nan = torch.isnan(x)
        return bool(
            torch.equal(nan, torch.isnan(y))
            and torch.equal(x[~nan], y[~nan])
            and torch.equal(torch.signbit(x[~nan]), torch.signbit(y[~nan]))
        )
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same_value(u, v) for u, v in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return type(a) is type(b) and a == b


def check_repr(bundle: Any) -> None:
    """``repr`` is code that rebuilds an equal bundle after ``from conformance.strategies import *``."""
    rebuilt = eval(repr(bundle), dict(NAMESPACE))
    assert type(rebuilt) is type(bundle)
    for field in dataclasses.fields(bundle):
        assert same_value(getattr(rebuilt, field.name), getattr(bundle, field.name)), field.name


def float_fields(bundle: Any) -> list[Tensor]:
    tensors = [getattr(bundle, f.name) for f in dataclasses.fields(bundle) if f.name != "mask"]
    return [t for t in tensors if isinstance(t, Tensor) and t.is_floating_point()]


def check_bundle(
    bundle: Any,
    declared: Declared,
    seen: Seen,
    *,
    empty_rows: bool = True,
    junk: bool | None = None,
    min_tokens: int = 1,
    max_rows: int = cs.MAX_ROWS,
    max_steps: int = cs.MAX_STEPS,
    per_row: tuple[str, ...] = (),
) -> tuple[int, int]:
    """What every (B, T) bundle promises; returns its (B, T). ``per_row`` names the (B,) tensors."""
    check_repr(bundle)
    mask = bundle.mask
    check_mask(mask, declared, seen, empty_rows=empty_rows, min_tokens=min_tokens)
    rows, steps = mask.shape
    assert 1 <= rows <= max_rows and 1 <= steps <= max(max_steps, -(-min_tokens // rows)), (rows, steps)
    tensors = float_fields(bundle)
    assert len({t.dtype for t in tensors}) == 1 and tensors[0].dtype in cs.FLOAT_DTYPES, "one float dtype"
    full = [t for t in tensors if t.shape == mask.shape]
    rowwise = [getattr(bundle, name) for name in per_row if getattr(bundle, name) is not None]
    assert len(full) + len(rowwise) == len(tensors), "every float tensor is (B, T) or a named (B,) one"
    for tensor in rowwise:
        assert tensor.shape == (rows,) and bool(torch.isfinite(tensor).all())
    check_fill(full, mask, declared, junk, seen)
    return rows, steps


def required(declared: Declared, *, empty_rows: bool = True, junk: bool | None = None) -> tuple[str, ...]:
    """The features a run of a bundle strategy must show under ``declared``: right padding after an
    action token, single-token rows, rows of unequal length, holes, empty rows and junk where allowed."""
    features = ["padding", "single", "unequal"]
    if declared.holes:
        features.append("holes")
    if declared.empty_rows and empty_rows:
        features.append("empty")
    if junk or (junk is None and declared.masked_fill == "any"):
        features.append("junk")
    return tuple(features)


# --------------------------------------------------------------------------------------------------
# The core bundles


def _log_ratios(logp: Tensor, base: Tensor, mask: Tensor, bound: float, top: float = 0.0) -> None:
    """``base`` in [LOGP_MIN, top], ``logp`` <= 0 and within ``bound`` of it on the action tokens."""
    assert within(base, cs.LOGP_MIN, top, mask) and within(logp, -math.inf, 0.0, mask)
    assert close_to(logp, base, bound, mask)


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_policy_batches(declared: Declared) -> None:
    seen = Seen()

    def check(b: cs.PolicyBatch) -> None:
        check_bundle(b, declared, seen)
        _log_ratios(b.logp, b.old_logp, b.mask, cs.LOG_RATIO_MAX)
        assert within(b.advantages, -5, 5, b.mask) and 0.05 <= b.clip_eps <= 0.5
        assert b.loss_agg in cs.COUNT_AGGREGATIONS

    draws(cs.policy_batches(), declared, check)
    seen.require(*required(declared))


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_penalty_batches(declared: Declared) -> None:
    seen = Seen()

    def check(b: cs.PenaltyBatch) -> None:
        check_bundle(b, declared, seen)
        _log_ratios(b.logp, b.old_logp, b.mask, cs.LOG_RATIO_MAX)
        assert within(b.advantages, -5, 5, b.mask) and 0 <= b.beta <= 10

    draws(cs.penalty_batches(), declared, check)
    seen.require(*required(declared))


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_value_batches(declared: Declared) -> None:
    seen = Seen()

    def check(b: cs.ValueBatch) -> None:
        check_bundle(b, declared, seen)
        assert within(b.old_values, -10, 10, b.mask) and within(b.returns, -10, 10, b.mask)
        assert close_to(b.values, b.old_values, 2.0, b.mask)
        assert b.clip_eps is None or b.clip_eps > 0
        seen.add("clipped" if b.clip_eps is not None else "unclipped")

    draws(cs.value_batches(), declared, check)
    seen.require(*required(declared), "clipped", "unclipped")


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_gae_batches(declared: Declared) -> None:
    seen = Seen()

    def check(b: cs.GAEBatch) -> None:
        check_bundle(b, declared, seen, per_row=("last_values",))
        assert within(b.rewards, -5, 5, b.mask) and within(b.values, -5, 5, b.mask)
        assert 0 <= b.gamma <= 1 and 0 <= b.lam <= 1
        assert b.last_values is None or within(b.last_values, -5, 5)
        seen.add("terminal" if b.last_values is None else "bootstrap")

    draws(cs.gae_batches(), declared, check)
    seen.require(*required(declared), "terminal", "bootstrap")


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_reward_batches(declared: Declared) -> None:
    seen = Seen()

    def check(b: cs.RewardBatch) -> None:
        check_bundle(b, declared, seen, per_row=("scores",))
        assert within(b.scores, -5, 5)
        _log_ratios(b.logp, b.ref_logp, b.mask, cs.LOG_RATIO_MAX)
        assert 0 <= b.kl_coef <= 1 and b.estimator in cs.KL_ESTIMATORS

    draws(cs.reward_batches(), declared, check)
    seen.require(*required(declared))


@pytest.mark.parametrize("with_mask", [True, None])
@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_kl_batches(declared: Declared, with_mask: bool | None) -> None:
    seen = Seen()

    def check(b: cs.KLBatch) -> None:
        check_repr(b)
        assert b.logp.shape == b.ref_logp.shape and b.logp.dtype in cs.FLOAT_DTYPES
        assert b.estimator in cs.KL_ESTIMATORS
        if b.mask is None:  # every entry is then finite
            seen.add("no mask")
            assert bool(torch.isfinite(b.logp).all() and torch.isfinite(b.ref_logp).all())
            _log_ratios(b.logp, b.ref_logp, torch.ones_like(b.logp), cs.LOG_RATIO_MAX)
        else:
            check_bundle(b, declared, seen)
            _log_ratios(b.logp, b.ref_logp, b.mask, cs.LOG_RATIO_MAX)

    draws(cs.kl_batches(with_mask=with_mask), declared, check)
    if with_mask:  # the masks' features; None: half the draws have no mask, so only that is required
        seen.require(*required(declared))
    else:
        seen.require("no mask", "padding")


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_masked_batches(declared: Declared) -> None:
    seen = Seen()

    def check(b: cs.MaskedBatch) -> None:
        check_bundle(b, declared, seen, min_tokens=0)
        assert within(b.x, -100, 100, b.mask)

    draws(cs.masked_batches(), declared, check)
    seen.require(*required(declared))


@pytest.mark.parametrize(("ndims", "min_tokens"), [((0,), 1), ((1, 3), 2)])
def test_masked_batches_of_other_ranks(ndims: tuple[int, ...], min_tokens: int) -> None:
    """Other ranks get an arbitrary 0/1 pattern with at least ``min_tokens`` ones (a 0-d mask holds
    one at most: ``min_tokens`` > 1 with rank 0 is a request the strategy cannot meet)."""
    declared, seen = DECLARED[1], Seen()

    def check(b: cs.MaskedBatch) -> None:
        check_repr(b)
        assert b.x.ndim in ndims and b.x.shape == b.mask.shape and b.mask.dtype in cs.MASK_DTYPES
        assert bool(((b.mask == 0) | (b.mask == 1)).all()) and int((b.mask != 0).sum()) >= min_tokens
        assert within(b.x, -1, 1, b.mask) and bool((b.x[b.mask == 0] == 0).all())  # declared "zero"
        seen.add(f"rank {b.x.ndim}")

    draws(cs.masked_batches(ndims=ndims, min_tokens=min_tokens, low=-1.0, high=1.0), declared, check)
    seen.require(*(f"rank {n}" for n in ndims))


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_ev_batches(declared: Declared) -> None:
    seen = Seen()

    def check(b: cs.EVBatch) -> None:
        check_bundle(b, declared, seen, min_tokens=2)
        assert within(b.values, -10, 10, b.mask) and within(b.returns, -10, 10, b.mask)

    draws(cs.ev_batches(), declared, check)
    seen.require(*required(declared))


def test_ev_batches_with_constant_returns() -> None:
    declared, seen = DECLARED[0], Seen()

    def check(b: cs.EVBatch) -> None:
        check_bundle(b, declared, seen, min_tokens=2)
        on = b.returns[b.mask != 0]
        assert bool((on == on[0]).all()), "constant_returns: one return value on every action token"

    draws(cs.ev_batches(constant_returns=True), declared, check)


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_logits_batches(declared: Declared) -> None:
    seen = Seen()

    def check(b: cs.LogitsBatch) -> None:
        check_repr(b)
        assert b.logits.ndim == 3 and b.logits.dtype in cs.FLOAT_DTYPES + cs.HALF_DTYPES
        rows, length, vocab = b.logits.shape
        assert 1 <= rows <= 4 and 1 <= length <= 8 and 1 <= vocab <= 9
        assert b.input_ids.shape == (rows, length) and b.input_ids.dtype == torch.int64
        assert bool(((b.input_ids >= 0) & (b.input_ids < vocab)).all())
        assert 0.3 <= b.temperature <= 3
        finite = torch.isfinite(b.logits)
        assert bool(finite.any(dim=-1).all()), "a position with every token banned"
        assert bool((finite | (b.logits == -math.inf)).all()) and within(b.logits[finite], -10, 10)
        if not bool(finite.all()):
            seen.add("banned")
            assert declared.inf_logits, "a -inf logit although inf_logits is declared off"

    draws(cs.logits_batches(), declared, check)
    if declared.inf_logits:
        seen.require("banned")


def test_logits_batches_without_banned_tokens() -> None:
    def check(b: cs.LogitsBatch) -> None:
        assert bool(torch.isfinite(b.logits).all())

    draws(cs.logits_batches(banned_tokens=False), DECLARED[0], check)


def test_kl_controller_cases() -> None:
    def check(case: cs.KLControllerCase) -> None:
        check_repr(case)
        assert 1e-3 <= case.init_kl_coef <= 1 and 0.1 <= case.target <= 20 and 100 <= case.horizon <= 1e5
        assert 1 <= len(case.updates) <= 6
        assert all(0 <= kl <= 50 and 1 <= n <= 1024 for kl, n in case.updates)

    draws(cs.kl_controller_cases(), DECLARED[0], check)


# --------------------------------------------------------------------------------------------------
# The family's bundles


def _norm_constant(loss_agg: str, norm_constant: float | None) -> None:
    """``norm_constant`` is set for ``seq-mean-token-sum-norm`` only, in [0.5, 100]."""
    if loss_agg == "seq-mean-token-sum-norm":
        assert norm_constant is not None and 0.5 <= norm_constant <= 100
    else:
        assert norm_constant is None


@pytest.mark.parametrize("singletons", [True, False])
def test_group_batches(singletons: bool) -> None:
    seen = Seen()

    def check(b: cs.GroupBatch) -> None:
        check_repr(b)
        assert b.scores.ndim == 1 and b.scores.dtype in cs.FLOAT_DTYPES and within(b.scores, -5, 5)
        assert b.group_ids.shape == b.scores.shape and b.group_ids.dtype == torch.int64
        ids = b.group_ids.tolist()
        assert set(ids) <= set(cs.GROUP_ID_POOL) and 1 <= len(set(ids)) <= 4
        sizes = [ids.count(i) for i in set(ids)]
        assert max(sizes) <= 5 and (singletons or min(sizes) >= 2)
        if min(sizes) == 1:
            seen.add("singleton")
        if any(ids[k] != ids[k + 1] and ids[k] in ids[k + 2 :] for k in range(len(ids) - 2)):
            seen.add("scattered")  # a group's rows are not contiguous
        assert b.method in cs.GROUP_METHODS and b.eps in (1e-6, 0.0, 1e-4, 0.1)
        assert b.std_scope in cs.STD_SCOPES and (b.method == "grpo" or b.std_scope == "group")

    draws(cs.group_batches(singletons=singletons), DECLARED[0], check)
    seen.require("scattered", *(["singleton"] if singletons else []))


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_aggregation_batches(declared: Declared) -> None:
    seen = Seen()

    def check(b: cs.AggregationBatch) -> None:
        check_bundle(b, declared, seen)
        assert within(b.per_token, -10, 10, b.mask) and b.loss_agg in cs.LOSS_AGGREGATIONS
        _norm_constant(b.loss_agg, b.norm_constant)

    draws(cs.aggregation_batches(), declared, check)
    seen.require(*required(declared))


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_clip_batches(declared: Declared) -> None:
    seen = Seen()

    def check(b: cs.ClipBatch) -> None:
        check_bundle(b, declared, seen)
        _log_ratios(b.logp, b.old_logp, b.mask, cs.LOG_RATIO_MAX)
        assert within(b.advantages, -5, 5, b.mask) and 0.05 <= b.clip_eps <= 0.5
        assert b.clip_eps_high is None or 0.05 <= b.clip_eps_high <= 1
        assert b.dual_clip is None or 1 < b.dual_clip <= 10
        assert b.loss_agg in cs.COUNT_AGGREGATIONS

    draws(cs.clip_batches(), declared, check)
    seen.require(*required(declared))


@pytest.mark.parametrize("forced", [True, False])
def test_clip_batches_forced_options(forced: bool) -> None:
    def check(b: cs.ClipBatch) -> None:
        assert (b.clip_eps_high is not None) == forced and (b.dual_clip is not None) == forced

    draws(cs.clip_batches(high=forced, dual=forced), DECLARED[0], check)


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_gspo_batches(declared: Declared) -> None:
    seen = Seen()

    def check(b: cs.GSPOBatch) -> None:
        check_bundle(b, declared, seen, per_row=("advantages",))
        _log_ratios(b.logp, b.old_logp, b.mask, 1.0, top=-1.0)
        assert within(b.advantages, -5, 5) and 1e-4 <= b.clip_eps <= 0.5
        assert b.clip_eps_high is None or 1e-4 <= b.clip_eps_high <= 0.5

    draws(cs.gspo_batches(), declared, check)
    seen.require(*required(declared))


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_cispo_batches(declared: Declared) -> None:
    seen = Seen()

    def check(b: cs.CISPOBatch) -> None:
        check_bundle(b, declared, seen)
        _log_ratios(b.logp, b.old_logp, b.mask, cs.LOG_RATIO_MAX)
        assert within(b.advantages, -5, 5, b.mask)
        assert 0 <= b.clip_low <= 5 and 0 <= b.clip_high <= 5 and b.loss_agg in cs.LOSS_AGGREGATIONS
        _norm_constant(b.loss_agg, b.norm_constant)

    draws(cs.cispo_batches(), declared, check)
    seen.require(*required(declared))


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_kl_loss_batches(declared: Declared) -> None:
    seen = Seen()

    def check(b: cs.KLLossBatch) -> None:
        check_bundle(b, declared, seen)
        _log_ratios(b.logp, b.ref_logp, b.mask, cs.LOG_RATIO_MAX)
        assert b.estimator in cs.KL_LOSS_ESTIMATORS and b.loss_agg in cs.LOSS_AGGREGATIONS
        _norm_constant(b.loss_agg, b.norm_constant)

    draws(cs.kl_loss_batches(), declared, check)
    seen.require(*required(declared))


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_correction_batches(declared: Declared) -> None:
    seen = Seen()

    def check(b: cs.CorrectionBatch) -> None:
        check_bundle(b, declared, seen)
        _log_ratios(b.logp, b.rollout_logp, b.mask, 1.0, top=-1.0)
        assert b.level in cs.CORRECTION_LEVELS and b.mode in cs.CORRECTION_MODES
        assert 1 <= b.high <= 10 and (b.low is None or 0.05 <= b.low <= 1)

    draws(cs.correction_batches(), declared, check)
    seen.require(*required(declared))


# --------------------------------------------------------------------------------------------------
# The bundles' options: empty_rows=False, min_tokens, junk, clip, bootstrap, with_mask

BUNDLES_WITH_EMPTY_ROWS: dict[str, Callable[..., st.SearchStrategy[Any]]] = {
    "policy": cs.policy_batches,
    "penalty": cs.penalty_batches,
    "value": cs.value_batches,
    "gae": cs.gae_batches,
    "reward": cs.reward_batches,
    "aggregation": cs.aggregation_batches,
    "gspo": cs.gspo_batches,
    "cispo": cs.cispo_batches,
    "kl_loss": cs.kl_loss_batches,
    "correction": cs.correction_batches,
}
PER_ROW = {"gae": ("last_values",), "reward": ("scores",), "gspo": ("advantages",)}


@pytest.mark.parametrize("name", BUNDLES_WITH_EMPTY_ROWS)
def test_empty_rows_off_gives_an_action_token_in_every_row(name: str) -> None:
    declared, seen = DECLARED[0], Seen()

    def check(b: Any) -> None:
        check_bundle(b, declared, seen, empty_rows=False, per_row=PER_ROW.get(name, ()))

    draws(BUNDLES_WITH_EMPTY_ROWS[name](empty_rows=False), declared, check)
    seen.require(*required(declared, empty_rows=False))


@pytest.mark.parametrize("junk", [True, False])
@pytest.mark.parametrize("declared", DECLARED[1:3], ids=lambda d: d.name)
def test_junk_is_written_when_asked_whatever_is_declared(declared: Declared, junk: bool) -> None:
    seen = Seen()

    def check(b: cs.PolicyBatch) -> None:
        check_bundle(b, declared, seen, junk=junk)
        if not junk:
            assert "junk" not in seen

    draws(cs.policy_batches(junk=junk), declared, check)
    if junk:
        seen.require("junk")


def test_min_tokens_widens_the_batch_to_hold_them() -> None:
    declared, seen = DECLARED[1], Seen()

    def check(b: cs.PolicyBatch) -> None:
        check_bundle(b, declared, seen, min_tokens=20, empty_rows=False)

    draws(cs.policy_batches(min_tokens=20), declared, check)


@pytest.mark.parametrize("option", ["clip", "bootstrap", "with_mask"])
@pytest.mark.parametrize("value", [True, False])
def test_forced_options_are_obeyed(option: str, value: bool) -> None:
    strategy, field = {
        "clip": (cs.value_batches, "clip_eps"),
        "bootstrap": (cs.gae_batches, "last_values"),
        "with_mask": (cs.kl_batches, "mask"),
    }[option]

    def check(b: Any) -> None:
        assert (getattr(b, field) is not None) == value

    draws(strategy(**{option: value}), DECLARED[0], check)


# --------------------------------------------------------------------------------------------------
# Primitive draws


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
@pytest.mark.parametrize("empty_rows", [True, False])
def test_masks(declared: Declared, empty_rows: bool) -> None:
    seen = Seen()

    def check(mask: Tensor) -> None:
        assert mask.shape == (4, 6)
        check_mask(mask, declared, seen, empty_rows=empty_rows, min_tokens=3)

    draws(cs.masks((4, 6), empty_rows=empty_rows, min_tokens=3), declared, check)
    seen.require(*required(declared, empty_rows=empty_rows, junk=False))


def test_masks_with_holes_off_are_prefixes_and_keep_their_dtypes() -> None:
    seen = Seen()

    def check(mask: Tensor) -> None:
        assert mask.dtype in (torch.bool, torch.int64)
        check_mask(mask, DECLARED[1], seen, empty_rows=False)

    draws(cs.masks((3, 5), holes=False, dtypes=(torch.bool, torch.int64)), DECLARED[0], check)
    assert "holes" not in seen


def test_masks_refuse_a_shape_too_small_for_min_tokens() -> None:
    with pytest.raises(ValueError, match="masks: shape"):
        draws(cs.masks((2, 2), min_tokens=5), DECLARED[0], lambda mask: None)


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_masked_fills(declared: Declared) -> None:
    def check(t: Tensor) -> None:
        assert t.shape == (3, 4) and t.dtype == torch.float32
        if declared.masked_fill == "zero":
            assert bool((t == 0).all())
        elif isinstance(declared.masked_fill, float):
            assert bool((t == declared.masked_fill).all())
        elif declared.masked_fill == "finite":
            assert within(t, -5, 0)

    draws(cs.masked_fills((3, 4), torch.float32), declared, check)


def test_junk_tensors_use_a_palette_of_at_most_four_values() -> None:
    seen = Seen()

    def check(t: Tensor) -> None:
        assert t.shape == (3, 4) and t.dtype == torch.float64
        assert len({repr(v) for v in t.flatten().tolist()}) <= 4
        if not bool((torch.isfinite(t) & (t.abs() < 1e6)).all()):
            seen.add("junk")

    draws(cs.junk_tensors((3, 4), torch.float64), DECLARED[0], check)
    seen.require("junk")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float_tensors(dtype: torch.dtype) -> None:
    def check(t: Tensor) -> None:
        assert t.shape == (2, 5) and t.dtype == dtype and within(t, -0.1, 3.0)

    draws(cs.float_tensors((2, 5), dtype, -0.1, 3.0), DECLARED[0], check)


SCALARS: dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], bool]]] = {
    "gammas": (cs.gammas(), lambda x: 0 <= x <= 1),
    "lams": (cs.lams(), lambda x: 0 <= x <= 1),
    "clip_eps": (cs.clip_eps(), lambda x: 0.05 <= x <= 0.5),
    "temperatures": (cs.temperatures(), lambda x: 0.3 <= x <= 3),
    "kl_coefs": (cs.kl_coefs(), lambda x: 0 <= x <= 1),
    "value_clips": (cs.value_clips(), lambda x: x is None or 0.05 <= x <= 10),
    "kl_estimators": (cs.kl_estimators(), lambda x: x in cs.KL_ESTIMATORS),
    "loss_aggregations": (cs.loss_aggregations(), lambda x: x in cs.COUNT_AGGREGATIONS),
    "float_dtypes": (cs.float_dtypes(), lambda x: x in cs.FLOAT_DTYPES),
    "junk_floats": (cs.junk_floats(), lambda x: isinstance(x, float)),
    "batch_shapes": (cs.batch_shapes(), lambda s: 1 <= s[0] <= cs.MAX_ROWS and 1 <= s[1] <= cs.MAX_STEPS),
    "norm_constants": (cs.norm_constants(), lambda x: 0.5 <= x <= 100),
    "clip_eps_highs": (cs.clip_eps_highs(), lambda x: x is None or 0.05 <= x <= 1),
    "dual_clips": (cs.dual_clips(), lambda x: x is None or 1 < x <= 10),
    "hole_positions": (
        cs.hole_positions(6),
        lambda p: 1 <= len(p) <= 4 and p == sorted(p) and set(p) <= set(range(7)),
    ),
    "token_ids": (cs.token_ids(5, 7), lambda ids: len(ids) == 5 and set(ids) <= set(range(7))),
}


@pytest.mark.parametrize("name", SCALARS)
def test_scalars_are_in_their_documented_range(name: str) -> None:
    strategy, promise = SCALARS[name]

    def check(value: Any) -> None:
        assert promise(value), value

    draws(strategy, DECLARED[0], check)


def test_micro_batches_split_the_rows() -> None:
    def check(parts: list[list[int]]) -> None:
        assert 1 <= len(parts) <= 4 and all(parts) and all(p == sorted(p) for p in parts)
        assert sorted(i for p in parts for i in p) == list(range(5))

    draws(cs.micro_batches(5), DECLARED[0], check)


# --------------------------------------------------------------------------------------------------
# The invariance helpers (deterministic: stated by hand)


def test_fill_masked_writes_the_masked_out_slots_only() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 0, 1], [0, 0, 1]])
    filled = cs.fill_masked(x, mask, math.nan)
    assert same_value(filled, torch.tensor([[1.0, math.nan, 3.0], [math.nan, math.nan, 6.0]]))
    assert torch.equal(
        cs.fill_masked(x, mask.bool(), torch.full_like(x, -1.0))[0], torch.tensor([1.0, -1.0, 3.0])
    )


def test_append_padding_adds_trailing_columns() -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert torch.equal(
        cs.append_padding(x, 2, -1.0), torch.tensor([[1.0, 2.0, -1.0, -1.0], [3.0, 4.0, -1.0, -1.0]])
    )
    mask = cs.append_padding(torch.tensor([[True], [False]]), 1)
    assert torch.equal(mask, torch.tensor([[True, False], [False, False]]))


def test_insert_holes_inserts_a_column_before_each_position() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0]])
    assert torch.equal(cs.insert_holes(x, [3, 0, 3], 9.0), torch.tensor([[9.0, 1.0, 2.0, 3.0, 9.0, 9.0]]))
    assert torch.equal(cs.insert_holes(x, [1], torch.tensor([[7.0]])), torch.tensor([[1.0, 7.0, 2.0, 3.0]]))
    with pytest.raises(ValueError, match="positions"):
        cs.insert_holes(x, [4])


def test_whole_batch_counts() -> None:
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert cs.whole_batch_counts(mask, "token-mean") == {"token_count": 3}
    assert cs.whole_batch_counts(mask, "seq-mean-token-sum-norm") == {"row_count": 3}
    assert cs.whole_batch_counts(mask, "seq-mean-token-mean") == {"row_count": 2}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"masked_fill": "nan"}, "masked_fill"),
        ({"masked_fill": math.inf}, "masked_fill"),
        ({"masked_fill": True}, "masked_fill"),
        ({"holes": 0}, "holes"),
        ({"empty_rows": None}, "empty_rows"),
        ({"inf_logits": "no"}, "inf_logits"),
    ],
)
def test_declared_inputs_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match), cs.declared_inputs(**kwargs):
        pass


def test_declared_inputs_holds_inside_its_block_only() -> None:
    """Draws made inside a block (here outside the harness' own block) obey it; after the block,
    left normally or by an exception, every edge input is drawn again."""
    off, inside, after = Declared("off", holes=False, empty_rows=False), Seen(), Seen()
    masks = cs.masks((4, 6), empty_rows=True, min_tokens=0)
    with cs.declared_inputs(holes=False, empty_rows=False):
        draws(masks, None, lambda mask: check_mask(mask, off, inside, empty_rows=True, min_tokens=0))
    with pytest.raises(RuntimeError), cs.declared_inputs(holes=False, empty_rows=False):
        raise RuntimeError
    draws(masks, None, lambda mask: check_mask(mask, DECLARED[0], after, empty_rows=True, min_tokens=0))
    inside.require("padding")
    after.require("holes", "empty")
