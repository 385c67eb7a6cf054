"""Every hand-computed case of ``spec/cases/*.json``, run against the adapter.

A case whose expected values still hold under the adapter's declared conventions (the reference
variant reproduces them) is run as is with :func:`conformance.cases.run_case`. A case that a
declared convention changes (the variant does not reproduce it) is checked by comparing the
adapter with the variant on the case's inputs. Which outputs are compared follows the suite's one
rule for unreported statistics (:func:`conformance.support.checked_outputs`, as in the properties).

Cases with ``raises`` are IN-2 (input validation), which holds for ppo-ref's own functions only;
cases of functions outside the adapter contract (``masked_var``, ``explained_variance``, the
controllers, ``update_penalty_beta``) are not applicable here. ``tests/`` runs both for ppo-ref.

Input conventions (issue 11): a case is run for its own clause with its masked-out slots holding
what the adapter's declared ``masked_fill`` allows (zeros or the pad value; under ``finite`` a NaN
or inf there becomes 0; under the reference's ``any`` the case as written), and a case with a hole
in its mask is not provided to an op the adapter declares in ``prefix_masks``. A case with NaN or
inf in a masked-out slot also runs as written under its op's robustness clause (ROB-1..4,
``test_hand_case_robustness``), whatever the adapter declares.

Edge inputs (issue 20): a case of a value clause whose input has an edge input the adapter does not
declare in ``edge_inputs`` (a hole, a row without action tokens, a ``-inf`` logit) is reported under
that input's edge clause (EDGE-1, EDGE-2, EDGE-3; :func:`edge_clause`, applied by the hooks at
collection), so a wrong number there is an edge FAIL, not a value FAIL.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest
import torch
from torch import Tensor

import ppo_ref
from ppo_ref.adapters import OP_NAMES
from ppo_ref.adapters.step import StepRunner, clause_not_judged, step_runner

from .cases import Case, decode_inputs, load_cases, output_names, reproduction, run_case
from .support import (
    Context,
    case_edge_inputs,
    checked_outputs,
    has_holes,
    masked_out_inputs,
    precision_case,
    unsupported_call,
    whitening_scale,
)
from .test_robustness import ROBUSTNESS_CLAUSES

LOSS_OPS = frozenset({"aggregate_loss", "policy_loss", "value_loss", "cispo_loss", "kl_loss"})
"""Ops whose ``loss_agg`` the declared ``loss_aggregations`` narrows."""
OPTION_KEYWORDS = {
    "clip_eps_high": ("clip_eps_high",),
    "dual_clip": ("dual_clip",),
    "counts": ("norm_constant", "token_count", "row_count"),
}
"""``policy_loss_options`` value -> the keywords a case uses it by (the option a case needs is
read off its inputs)."""
CHOICES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "group_advantages": (("group_methods", "method", "grpo"), ("group_std_scopes", "std_scope", "group")),
    "kl_loss": (("kl_loss_estimators", "estimator", "k1"),),
    "rollout_correction": (("correction_levels", "level", "token"), ("correction_modes", "mode", "truncate")),
}
"""op -> (declared capability key, argument, default) narrowing the cases it can run."""


def _param(case: Case) -> Any:
    marks = [pytest.mark.clause(case.clause)]
    if case.op in OP_NAMES and case.raises is None:  # the others are not applicable, whatever the ops
        marks.append(pytest.mark.ops(case.op))
    return pytest.param(case, id=case.id, marks=marks)


def _output(op: str, result: Any, name: str) -> Any:
    """Output ``name`` of ``op``'s result, or None when the result does not have it."""
    names = output_names(op)
    if names == ("out",):
        return result
    if isinstance(result, tuple | list):
        return result[names.index(name)] if len(result) == len(names) else None
    if isinstance(result, Mapping):
        return result.get(name)
    return getattr(result, name, None)


def _unsupported(ctx: Context, case: Case) -> str | None:
    """Why the adapter's declared capabilities exclude this case, or None."""
    c, inputs = ctx.conventions, case.inputs
    if case.op in ("kl_penalty", "token_rewards") and inputs.get("estimator", "k1") not in c.kl_estimators:
        return f"estimator {inputs.get('estimator', 'k1')!r} (declared kl_estimators excludes it)"
    if case.op in LOSS_OPS and inputs.get("loss_agg", "token-mean") not in c.loss_aggregations:
        return f"loss_agg {inputs.get('loss_agg', 'token-mean')!r} (declared loss_aggregations excludes it)"
    for option, keywords in OPTION_KEYWORDS.items():
        used = [k for k in keywords if inputs.get(k) is not None]
        if case.op in LOSS_OPS | {"gspo_loss"} and used and option not in c.policy_loss_options:
            return f"the keyword {used[0]} (declared policy_loss_options excludes {option!r})"
    if case.op == "value_loss" and "loss_agg" in inputs and "counts" not in c.policy_loss_options:
        return "value_loss's loss_agg keyword (declared policy_loss_options excludes 'counts')"
    for key, argument, default in CHOICES.get(case.op, ()):
        value = inputs.get(argument, default)
        if value not in getattr(c, key):
            return f"{argument} {value!r} (declared {key} excludes it)"
    if case.op == "rollout_correction":
        mode, low = inputs.get("mode", "truncate"), inputs.get("low")
        if mode == "truncate" and low is not None and "truncate-low" not in c.correction_bounds:
            return "a floor (low) in truncate mode (declared correction_bounds excludes 'truncate-low')"
        if mode == "mask" and low is None and "mask-open-low" not in c.correction_bounds:
            return "mask mode without low (declared correction_bounds excludes 'mask-open-low')"
    if case.op == "value_loss":
        mode = "unclipped" if inputs.get("clip_eps") is None else "clipped"
        if mode not in c.value_clip_modes:
            return f"the {mode} value loss (declared value_clip_modes excludes it)"
    if case.op == "gae" and inputs.get("last_values") is not None and c.gae_bootstrap == "none":
        return "bootstrapping from last_values (declared gae_bootstrap='none')"
    return None


def _compare(label: str, actual: Any, expected: Any, atol: float) -> str | None:
    got = torch.as_tensor(actual.detach() if isinstance(actual, Tensor) else actual).to(torch.float64)
    want = torch.as_tensor(expected.detach() if isinstance(expected, Tensor) else expected).to(torch.float64)
    if got.numel() == 1 and want.numel() == 1:
        got, want = got.reshape(()), want.reshape(())
    if got.shape != want.shape:
        return f"{label}: expected shape {tuple(want.shape)}, got {tuple(got.shape)}"
    if torch.allclose(got, want, rtol=0.0, atol=atol, equal_nan=True):
        return None
    return (
        f"{label}: the declared-convention variant gives {want.tolist()}, the implementation {got.tolist()}"
    )


def _against_variant(ctx: Context, case: Case, outputs: list[str]) -> list[str]:
    """Compare the adapter with the reference variant on the case's inputs (declared conventions)."""
    runs: dict[str, tuple[Any, dict[str, Any]]] = {}
    for who, impl in (("variant", ctx.variant), ("implementation", ctx.adapter)):
        inputs = decode_inputs(case)
        if case.grad is not None:
            inputs[case.grad.wrt].requires_grad_(True)
        try:
            runs[who] = (getattr(impl, case.op)(**inputs), inputs)
        except Exception as error:
            if who == "variant":
                pytest.skip(f"not applicable: the declared conventions leave this case undefined ({error})")
            return [f"{case.id}: the implementation raised {type(error).__name__}: {error}"]
    atol = case.atol
    if case.op == "gae" and ctx.conventions.gae_whitening != "none":
        # Whitening inside GAE amplifies rounding by max|A| / std(A) of the raw advantages.
        raw = decode_inputs(case)
        atol *= whitening_scale(ppo_ref.gae(**raw)[0], raw["mask"])
    problems = []
    for name in outputs:
        want, got = (_output(case.op, runs[w][0], name) for w in ("variant", "implementation"))
        if want is None:
            continue  # a statistic the declared conventions say is not reported
        problems.append(_compare(f"{case.id}: {name}", got, want, atol))
    if case.grad is not None:
        grads = []
        for who in ("variant", "implementation"):
            output, inputs = _output(case.op, runs[who][0], case.grad.of), runs[who][1]
            wrt = inputs[case.grad.wrt]
            reachable = isinstance(output, Tensor) and output.requires_grad
            grad = torch.autograd.grad(output.sum(), wrt, allow_unused=True)[0] if reachable else None
            grads.append(torch.zeros_like(wrt) if grad is None else grad)
        problems.append(
            _compare(f"{case.id}: d {case.grad.of} / d {case.grad.wrt}", grads[1], grads[0], case.atol)
        )
    return [problem for problem in problems if problem]


def has_junk(case: Case) -> bool:
    """Whether the case puts NaN or inf into a masked-out slot of a per-token input."""
    found = masked_out_inputs(case)
    return found is not None and any(bool((~t.isfinite() & ~found[0]).any()) for t in found[1].values())


def declared_case(case: Case, masked_fill: str | float) -> Case:
    """The case with its masked-out slots as the declared ``masked_fill`` allows: ``zero`` or a pad
    value fill them, ``finite`` turns NaN and inf there into 0, ``any`` keeps the case as written.
    Masked-out values do not change the reference's expected values (IN-1)."""
    found = masked_out_inputs(case)
    if masked_fill == "any" or found is None:
        return case
    keep, per_token = found
    inputs = dict(case.inputs)
    for name, value in per_token.items():
        if masked_fill == "finite":
            filled = torch.where(keep | value.isfinite(), value, torch.zeros((), dtype=value.dtype))
        else:
            pad = 0.0 if masked_fill == "zero" else float(masked_fill)
            filled = torch.where(keep, value, torch.full((), pad, dtype=value.dtype))
        inputs[name] = filled.to(torch.float64).tolist()
    return dataclasses.replace(case, inputs=inputs)


def _robustness_param(case: Case) -> Any:
    clause = ROBUSTNESS_CLAUSES[case.op]
    return pytest.param(case, id=case.id, marks=[pytest.mark.clause(clause), pytest.mark.ops(case.op)])


_STEP_RUNNERS: dict[int, StepRunner | None] = {}


def _step_runner(adapter: object) -> StepRunner | None:
    """``adapter``'s trainer-step runner, or None (looked up once per adapter object)."""
    if id(adapter) not in _STEP_RUNNERS:
        _STEP_RUNNERS[id(adapter)] = step_runner(adapter)
    return _STEP_RUNNERS[id(adapter)]


@pytest.mark.parametrize("case", [_param(case) for case in load_cases()])
def test_hand_case(ctx: Context, case: Case) -> None:
    if case.clause.startswith("STEP-"):
        # A STEP case pins the arithmetic a trainer step rests on through an op; without a step
        # runner no step of the library's training code ran, so the clause is not judged, nor where
        # the runner declares the clause's setting absent from its library (clause_not_judged).
        runner = _step_runner(ctx.adapter)
        if runner is None:
            pytest.skip(
                "not provided: no trainer-step runner (the STEP clauses judge a step of its training code)"
            )
        reason = clause_not_judged(runner, case.clause)
        if reason is not None:
            pytest.skip(reason)
    if case.op in ctx.conventions.prefix_masks and has_holes(case):
        pytest.skip(f"not provided: the case's mask has holes (declared prefix_masks includes {case.op!r})")
    robustness = case.clause.startswith("ROB-")  # a robustness case runs as written
    _run_hand_case(ctx, case if robustness else declared_case(case, ctx.conventions.masked_fill))


@pytest.mark.parametrize(
    "case",
    [
        _robustness_param(case)
        for case in load_cases()
        if case.op in ROBUSTNESS_CLAUSES and has_junk(case) and not case.clause.startswith("ROB-")
    ],
)
def test_hand_case_robustness(ctx: Context, case: Case) -> None:
    """The case as written, NaN and inf in its masked-out slots, whatever ``masked_fill`` declares;
    not on an edge input the adapter does not declare (its EDGE clause checks that input)."""
    undeclared = [e for e in case_edge_inputs(case) if e not in ctx.conventions.edge_inputs]
    if undeclared:
        pytest.skip(
            f"not applicable: the case has an edge input the adapter does not declare ({undeclared[0]}); "
            "its EDGE clause checks it"
        )
    if case.op in ctx.conventions.prefix_masks and has_holes(case):
        pytest.skip(f"not provided: the case's mask has holes (declared prefix_masks includes {case.op!r})")
    _run_hand_case(ctx, case)


def _run_hand_case(ctx: Context, case: Case) -> None:
    if case.raises is not None:
        pytest.skip(
            "not applicable: IN-2 input validation is checked for ppo-ref's own functions only (tests/)"
        )
    if case.op not in OP_NAMES:
        pytest.skip(
            f"not applicable: {case.op} is outside the adapter contract (checked for ppo-ref in tests/)"
        )
    missing = _unsupported(ctx, case) or unsupported_call(ctx, case.op, case.inputs)
    if missing:
        pytest.skip(f"not provided: {missing}")
    case = precision_case(ctx, case)  # compute_dtype: the float32 tolerance
    try:
        result = getattr(ctx.adapter, case.op)(**decode_inputs(case))
    except Exception as error:
        setup = f"from ppo_ref.adapters import get_adapter\nimpl = get_adapter({ctx.impl!r})"
        pytest.fail(
            f"{case.id}: raised {type(error).__name__}: {error}\n{reproduction(case, ctx.adapter, setup)}"
        )
    kept = checked_outputs(ctx, case.op, result, case.expected)  # the rule for unreported statistics
    if not kept and case.grad is None:
        pytest.skip(f"not provided: the result has none of the outputs {sorted(case.expected)}")
    trimmed = dataclasses.replace(case, expected={name: case.expected[name] for name in kept})
    if not ctx.conventions.deviations() or not run_case(trimmed, ctx.variant):
        setup = f"from ppo_ref.adapters import get_adapter\nimpl = get_adapter({ctx.impl!r})"
        problems = run_case(trimmed, ctx.adapter, setup)
    else:
        problems = _against_variant(ctx, trimmed, kept)
    assert not problems, "\n".join(problems)
