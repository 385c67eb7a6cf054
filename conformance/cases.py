"""The hand-computed spec cases (``spec/cases/*.json``): load them, decode them, run them.

Each JSON file holds a list of case records; ``spec/README.md`` documents the schema and
``spec/SPEC.md`` the clauses. :func:`run_case` calls ``getattr(impl, case.op)(**inputs)`` on any
object that has the op as an attribute (:class:`ReferenceOps` for ppo-ref itself, an adapter for
another library), compares the outputs with the expected values, and returns the mismatches as
messages that each carry a copy-pasteable reproduction. An empty list means the case passed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import ppo_ref

__all__ = [
    "CASES_DIR",
    "OPS",
    "SPEC_PATH",
    "SPEC_VERSION",
    "Case",
    "GradCheck",
    "ReferenceOps",
    "WeightedSumCheck",
    "decode_inputs",
    "load_cases",
    "output_names",
    "reproduction",
    "run_case",
    "spec_clauses",
    "spec_version",
]


def _spec_dir() -> Path:
    """``spec/``: package data of the installed suite (``ppo_ref_conformance/spec``), else the
    checkout's ``spec/`` next to ``conformance/``."""
    if __package__:
        packaged = resources.files(__package__).joinpath("spec")
        if packaged.is_dir():
            return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / "spec"


SPEC_DIR = _spec_dir()
SPEC_PATH = SPEC_DIR / "SPEC.md"
CASES_DIR = SPEC_DIR / "cases"
_SPEC_VERSION_LINE = re.compile(r"^Spec version: (\d+\.\d+\.\d+)\b", re.MULTILINE)


def spec_version(spec_path: Path | None = None) -> str:
    """The version on ``spec/SPEC.md``'s ``Spec version: X.Y.Z`` line (``spec/CHANGELOG.md`` says
    what each version changed)."""
    if spec_path is not None and not isinstance(spec_path, Path):
        raise ValueError(f"spec_path: expected a pathlib.Path or None, got {type(spec_path).__name__}")
    path = SPEC_PATH if spec_path is None else spec_path
    match = _SPEC_VERSION_LINE.search(path.read_text(encoding="utf-8"))
    if match is None:
        raise ValueError(f"spec_path: {path} has no 'Spec version: X.Y.Z' line")
    return match.group(1)


SPEC_VERSION: str = spec_version()
"""The version of the specification this suite checks (``Spec version:`` in ``spec/SPEC.md``)."""

OPS: frozenset[str] = frozenset(
    {
        "token_logprobs",
        "entropy",
        "masked_mean",
        "masked_var",
        "masked_whiten",
        "kl_penalty",
        "token_rewards",
        "gae",
        "policy_loss",
        "value_loss",
        "ppo_penalty_loss",
        "explained_variance",
        "update_penalty_beta",
        "adaptive_kl",
        "fixed_kl",
        "group_advantages",
        "aggregate_loss",
        "gspo_loss",
        "cispo_loss",
        "kl_loss",
        "rollout_correction",
    }
)

_MULTI_OUTPUTS: dict[str, tuple[str, ...]] = {
    "gae": ("advantages", "returns"),
    "policy_loss": (
        "loss",
        "clipfrac",
        "ratio_outside_frac",
        "approx_kl",
        "ratio_mean",
        "ratio_max",
        "dual_clip_frac",
    ),
    "ppo_penalty_loss": ("loss", "kl"),
    "gspo_loss": ("loss", "clipfrac", "ratio_mean", "ratio_max", "approx_kl"),
    "cispo_loss": ("loss", "clipfrac", "ratio_mean", "ratio_max", "approx_kl"),
}
_TUPLE_OPS = frozenset({"gae"})

_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "bool": torch.bool,
}
_CASE_DTYPES = frozenset({"float64", "float32", "bfloat16", "float16"})
_INTEGER_INPUTS = frozenset({"input_ids", "group_ids"})
_SPECIAL_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_REQUIRED = ("id", "clause", "op", "description", "source", "inputs", "expected")
_OPTIONAL = ("dtype", "atol", "input_dtypes", "grad", "weighted_sum", "raises", "match")
_CLAUSE_HEADING = re.compile(r"^### ([A-Z]+-\d+): (.+?)\s*$", re.MULTILINE)


def output_names(op: str) -> tuple[str, ...]:
    """The names under which the outputs of ``op`` appear in a case's ``expected``."""
    return _MULTI_OUTPUTS.get(op, ("out",))


@dataclass(frozen=True)
class GradCheck:
    """Gradient of output ``of`` (its sum, if not a scalar) with respect to input ``wrt``."""

    of: str
    wrt: str
    expected: Any


@dataclass(frozen=True)
class WeightedSumCheck:
    """``sum(outputs[of] * weights)`` must equal ``expected`` (e.g. an expectation under π)."""

    of: str
    weights: Any
    expected: float


@dataclass(frozen=True)
class Case:
    """One hand-computed case: an op called on ``inputs`` and the values it must produce."""

    id: str
    clause: str
    op: str
    description: str
    source: str
    inputs: Mapping[str, Any]
    expected: Mapping[str, Any]
    dtype: str = "float64"
    atol: float = 1e-6
    input_dtypes: Mapping[str, str] | None = None
    grad: GradCheck | None = None
    weighted_sum: WeightedSumCheck | None = None
    raises: str | None = None
    match: str | None = None
    file: str = ""


def _case_from_record(record: Mapping[str, Any], file: str) -> Case:
    where = f"{file}: case {record.get('id', '?')!r}"
    missing = [key for key in _REQUIRED if key not in record]
    unknown = sorted(set(record) - set(_REQUIRED) - set(_OPTIONAL))
    if missing or unknown:
        raise ValueError(f"{where}: missing fields {missing}, unknown fields {unknown}")
    op, clause = record["op"], record["clause"]
    if op not in OPS:
        raise ValueError(f"{where}: unknown op {op!r}")
    if not re.fullmatch(r"[A-Z]+-\d+", clause) or not record["id"].startswith(clause + "/"):
        raise ValueError(f"{where}: clause {clause!r} must be an id like GAE-1 and prefix the case id")
    dtype = record.get("dtype", "float64")
    if dtype not in _CASE_DTYPES:
        raise ValueError(f"{where}: dtype must be one of {sorted(_CASE_DTYPES)}, got {dtype!r}")
    input_dtypes = record.get("input_dtypes")
    if input_dtypes is not None and not set(input_dtypes.values()) <= set(_DTYPES):
        raise ValueError(f"{where}: input_dtypes must map to one of {sorted(_DTYPES)}")
    bad_outputs = set(record["expected"]) - set(output_names(op))
    if bad_outputs:
        raise ValueError(f"{where}: {op} has no outputs {sorted(bad_outputs)}; use {output_names(op)}")
    raises = record.get("raises")
    if (raises is None) != (clause != "IN-2"):
        raise ValueError(f"{where}: 'raises' is required for clause IN-2 cases and only for them")
    grad = record.get("grad")
    weighted = record.get("weighted_sum")
    for check in (grad, weighted):
        if check is not None and check["of"] not in output_names(op):
            raise ValueError(f"{where}: grad/weighted_sum 'of' must be one of {output_names(op)}")
    if grad is not None and grad["wrt"] not in record["inputs"]:
        raise ValueError(f"{where}: grad 'wrt' must name an input")
    return Case(
        id=record["id"],
        clause=clause,
        op=op,
        description=record["description"],
        source=record["source"],
        inputs=record["inputs"],
        expected=record["expected"],
        dtype=dtype,
        atol=float(record.get("atol", 1e-6)),
        input_dtypes=input_dtypes,
        grad=None if grad is None else GradCheck(grad["of"], grad["wrt"], grad["expected"]),
        weighted_sum=None
        if weighted is None
        else WeightedSumCheck(weighted["of"], weighted["weights"], float(weighted["expected"])),
        raises=raises,
        match=record.get("match"),
        file=file,
    )


def load_cases(clause: str | None = None, cases_dir: Path | None = None) -> list[Case]:
    """Every case in ``spec/cases/*.json`` (files in name order), or only those of ``clause``."""
    directory = CASES_DIR if cases_dir is None else cases_dir
    cases: list[Case] = []
    for path in sorted(directory.glob("*.json")):
        records = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(records, list):
            raise ValueError(f"{path.name}: expected a JSON list of case records")
        cases.extend(_case_from_record(record, path.name) for record in records)
    return cases if clause is None else [case for case in cases if case.clause == clause]


def spec_clauses(spec_path: Path | None = None) -> dict[str, str]:
    """Clause id -> title, from the ``### ID: Title`` headings of ``spec/SPEC.md``, in order."""
    text = (SPEC_PATH if spec_path is None else spec_path).read_text(encoding="utf-8")
    return {match.group(1): match.group(2) for match in _CLAUSE_HEADING.finditer(text)}


def _numbers(value: Any) -> Any:
    """JSON value with the strings "nan", "inf", "-inf" turned into floats (inside lists too)."""
    if isinstance(value, list):
        return [_numbers(item) for item in value]
    if isinstance(value, str):
        if value not in _SPECIAL_FLOATS:
            raise ValueError(f"unexpected string {value!r} inside a numeric list")
        return _SPECIAL_FLOATS[value]
    return value


def _input_dtype(case: Case, name: str) -> torch.dtype:
    if case.input_dtypes and name in case.input_dtypes:
        return _DTYPES[case.input_dtypes[name]]
    if name == "mask":
        return torch.bool
    if name in _INTEGER_INPUTS:
        return torch.int64
    return _DTYPES[case.dtype]


def _decode(case: Case, name: str, value: Any) -> Any:
    if isinstance(value, list):
        return torch.tensor(_numbers(value), dtype=_input_dtype(case, name))
    if isinstance(value, str) and value in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[value]
    return value


def decode_inputs(case: Case) -> dict[str, Any]:
    """The case's inputs as call arguments: nested lists become tensors (``mask`` bool,
    ``input_ids`` and ``group_ids`` int64, others the case dtype, unless ``input_dtypes`` says
    otherwise), the strings "nan"/"inf"/"-inf" floats, everything else as is."""
    return {name: _decode(case, name, value) for name, value in case.inputs.items()}


class ReferenceOps:
    """ppo-ref's functions under the op names of the cases (``adaptive_kl`` and ``fixed_kl`` wrap
    the controllers: build one, apply one update, return the new coefficient)."""

    name = "ppo-ref"
    token_logprobs = staticmethod(ppo_ref.token_logprobs)
    entropy = staticmethod(ppo_ref.entropy)
    masked_mean = staticmethod(ppo_ref.masked_mean)
    masked_var = staticmethod(ppo_ref.masked_var)
    masked_whiten = staticmethod(ppo_ref.masked_whiten)
    kl_penalty = staticmethod(ppo_ref.kl_penalty)
    token_rewards = staticmethod(ppo_ref.token_rewards)
    gae = staticmethod(ppo_ref.gae)
    policy_loss = staticmethod(ppo_ref.policy_loss)
    value_loss = staticmethod(ppo_ref.value_loss)
    ppo_penalty_loss = staticmethod(ppo_ref.ppo_penalty_loss)
    explained_variance = staticmethod(ppo_ref.explained_variance)
    update_penalty_beta = staticmethod(ppo_ref.update_penalty_beta)
    group_advantages = staticmethod(ppo_ref.group_advantages)
    aggregate_loss = staticmethod(ppo_ref.aggregate_loss)
    gspo_loss = staticmethod(ppo_ref.gspo_loss)
    cispo_loss = staticmethod(ppo_ref.cispo_loss)
    kl_loss = staticmethod(ppo_ref.kl_loss)
    rollout_correction = staticmethod(ppo_ref.rollout_correction)

    @staticmethod
    def adaptive_kl(init_kl_coef: float, target: float, horizon: float, kl: float, n_steps: int) -> float:
        """``AdaptiveKLController(init_kl_coef, target, horizon).update(kl, n_steps)``."""
        return ppo_ref.AdaptiveKLController(init_kl_coef, target, horizon).update(kl, n_steps)

    @staticmethod
    def fixed_kl(kl_coef: float, kl: float, n_steps: int) -> float:
        """``FixedKLController(kl_coef).update(kl, n_steps)``."""
        return ppo_ref.FixedKLController(kl_coef).update(kl, n_steps)


REFERENCE_SETUP = f"from {__name__} import ReferenceOps\nimpl = ReferenceOps()"


def _literal(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_literal(item) for item in value) + "]"
    if isinstance(value, str) and value in _SPECIAL_FLOATS:
        return value  # the reproduction defines nan and inf
    return repr(value)


def _output_expr(op: str, name: str) -> str:
    if op in _TUPLE_OPS:
        return f"result[{output_names(op).index(name)}]"
    return "result" if name == "out" else f"result.{name}"


def reproduction(case: Case, impl: object, impl_setup: str | None = None) -> str:
    """Python source that reruns ``case`` against ``impl`` and prints what to compare."""
    if impl_setup is None:
        impl_setup = (
            REFERENCE_SETUP
            if type(impl) is ReferenceOps
            else f"impl = ...  # the implementation under test: {getattr(impl, 'name', type(impl).__name__)}"
        )
    lines = ["import torch", 'nan, inf = float("nan"), float("inf")', impl_setup]
    arguments = []
    for name, value in case.inputs.items():
        if isinstance(value, list):
            dtype = str(_input_dtype(case, name))
            grad = ", requires_grad=True" if case.grad and case.grad.wrt == name else ""
            lines.append(f"{name} = torch.tensor({_literal(value)}, dtype={dtype}{grad})")
            arguments.append(f"{name}={name}")
        else:
            arguments.append(f"{name}={_literal(value)}")
    lines.append(f"result = impl.{case.op}({', '.join(arguments)})")
    if case.raises:
        lines.append(f"# expected: {case.raises} with a message containing {case.match!r}")
    for name, expected in case.expected.items():
        lines.append(f"print({name!r}, {_output_expr(case.op, name)})  # expected {_literal(expected)}")
    if case.grad:
        of = _output_expr(case.op, case.grad.of)
        expected_grad = _literal(case.grad.expected)
        gradient = f"torch.autograd.grad({of}.sum(), {case.grad.wrt})"
        # a detached output (rollout_correction's weights, IS-3) has no graph: its gradient is 0
        lines.append(f"print({gradient} if {of}.requires_grad else 0.0)  # expected {expected_grad}")
    if case.weighted_sum:
        of = _output_expr(case.op, case.weighted_sum.of)
        weights = _literal(case.weighted_sum.weights)
        lines.append(
            f"print(({of}.double() * torch.tensor({weights}, dtype=torch.float64)).sum())"
            f"  # expected {case.weighted_sum.expected!r}"
        )
    return "\n".join(lines)


def _outputs(op: str, result: Any) -> dict[str, Any]:
    names = output_names(op)
    if names == ("out",):
        return {"out": result}
    if isinstance(result, Mapping):
        return {name: result[name] for name in names if name in result}
    if op in _TUPLE_OPS and isinstance(result, Sequence):
        return dict(zip(names, result, strict=False))
    return {name: getattr(result, name) for name in names if hasattr(result, name)}


def _as_float64(value: Any) -> Tensor:
    if isinstance(value, Tensor):
        return value.detach().to("cpu", torch.float64)
    return torch.tensor(_numbers(value), dtype=torch.float64)


def _compare(label: str, actual: Any, expected: Any, atol: float) -> str | None:
    """None if ``actual`` matches ``expected`` within ``atol`` (NaN matches NaN), else why not."""
    try:
        got = _as_float64(actual)
    except (TypeError, ValueError, RuntimeError) as error:
        return f"{label}: could not read {type(actual).__name__} as numbers ({error})"
    want = _as_float64(expected)
    if want.dim() == 0 and got.numel() == 1:
        got = got.reshape(())
    if got.shape != want.shape:
        return f"{label}: expected shape {tuple(want.shape)}, got {tuple(got.shape)}: {got.tolist()}"
    same_nan = torch.isnan(got) == torch.isnan(want)
    close = torch.isclose(got, want, rtol=0.0, atol=atol, equal_nan=True)
    if bool(same_nan.all()) and bool(close.all()):
        return None
    # A NaN against a number (or the other way round) and an infinity against anything else are
    # mismatches of infinite size, never a difference of 0.
    bad = ~(same_nan & close)
    diff = torch.where(bad, (got - want).abs().nan_to_num(nan=math.inf), torch.zeros(()))
    worst = float(diff.max())
    first = tuple(int(i) for i in bad.nonzero()[0].tolist())
    at = f" at index {first}" if first else ""
    return (
        f"{label}: expected {want.tolist()}, got {got.tolist()} (first mismatch{at}: got "
        f"{got[first].item()!r}, expected {want[first].item()!r}; max abs diff {worst:.3g}, atol {atol:g})"
    )


def _is_named(error: BaseException, name: str) -> bool:
    return any(cls.__name__ == name for cls in type(error).__mro__)


def run_case(case: Case, impl: object, impl_setup: str | None = None) -> list[str]:
    """Run ``case`` against ``impl``; return mismatch messages (empty when it passes).

    ``impl`` is any object with the op as an attribute. ``impl_setup`` is the Python source that
    creates ``impl`` in the reproduction (default: ``ReferenceOps()`` for the reference, a
    placeholder otherwise).
    """
    repro = reproduction(case, impl, impl_setup)

    def failure(detail: str) -> list[str]:
        return [f"{case.id} ({case.clause}, {case.file}): {detail}\nreproduce:\n{repro}"]

    def failures(details: list[str]) -> list[str]:
        """One message per problem; only the last carries the reproduction (it is the same for all)."""
        heads = [f"{case.id} ({case.clause}, {case.file}): {detail}" for detail in details]
        return [*heads[:-1], f"{heads[-1]}\nreproduce:\n{repro}"] if heads else []

    function = getattr(impl, case.op, None)
    if not callable(function):
        return failure(f"the implementation has no op {case.op!r}")
    inputs = decode_inputs(case)
    if case.grad is not None:
        wrt = inputs[case.grad.wrt]
        if not isinstance(wrt, Tensor) or not wrt.is_floating_point():
            return failure(f"grad wrt {case.grad.wrt!r} needs a floating-point tensor input")
        wrt.requires_grad_(True)
    try:
        result = function(**inputs)
    except Exception as error:
        if case.raises is None:
            return failure(f"raised {type(error).__name__}: {error}")
        if not _is_named(error, case.raises):
            return failure(f"expected {case.raises}, raised {type(error).__name__}: {error}")
        if case.match is not None and case.match not in str(error):
            return failure(f"the {case.raises} message {str(error)!r} does not contain {case.match!r}")
        return []
    if case.raises is not None:
        return failure(f"expected {case.raises} ({case.match!r}), but it returned {result!r}")
    outputs = _outputs(case.op, result)
    problems: list[str] = []
    for name, expected in case.expected.items():
        if name not in outputs:
            problems.append(f"output {name!r} missing from the result {type(result).__name__}")
            continue
        mismatch = _compare(name, outputs[name], expected, case.atol)
        if mismatch:
            problems.append(mismatch)
    if case.grad is not None:
        problems.extend(_check_grad(case.grad, outputs, inputs[case.grad.wrt], case.atol))
    if case.weighted_sum is not None:
        problems.extend(_check_weighted_sum(case.weighted_sum, outputs, case.atol))
    return failures(problems)


def _check_grad(check: GradCheck, outputs: Mapping[str, Any], wrt: Tensor, atol: float) -> list[str]:
    output = outputs.get(check.of)
    if not isinstance(output, Tensor):
        return [f"grad: output {check.of!r} is not a tensor"]
    if output.requires_grad:
        (gradient,) = torch.autograd.grad(output.sum(), wrt, allow_unused=True)
    else:
        gradient = None  # a constant output (e.g. an empty batch's 0): its gradient is 0
    if gradient is None:
        gradient = torch.zeros_like(wrt)
    mismatch = _compare(f"d {check.of} / d {check.wrt}", gradient, check.expected, atol)
    return [mismatch] if mismatch else []


def _check_weighted_sum(check: WeightedSumCheck, outputs: Mapping[str, Any], atol: float) -> list[str]:
    output = outputs.get(check.of)
    if output is None:
        return [f"weighted_sum: output {check.of!r} missing"]
    values = _as_float64(output)
    weights = _as_float64(check.weights)
    if values.shape != weights.shape:
        return [f"weighted_sum: weights of shape {tuple(weights.shape)} for {check.of!r} of {values.shape}"]
    mismatch = _compare(f"sum({check.of} * weights)", (values * weights).sum(), check.expected, atol)
    return [mismatch] if mismatch else []
