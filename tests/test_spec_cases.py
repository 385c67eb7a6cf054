"""The hand-computed spec cases (spec/cases/*.json) against the reference, and the case machinery."""

from __future__ import annotations

import contextlib
import fnmatch
import io
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from conformance.cases import (
    OPS,
    SPEC_PATH,
    Case,
    ReferenceOps,
    decode_inputs,
    load_cases,
    reproduction,
    run_case,
    spec_clauses,
)

CASES = load_cases()
REFERENCE = ReferenceOps()

# The clause ids of the ground rules, in SPEC.md order: SPEC.md must define exactly these.
CLAUSE_IDS = (
    "LOGP-1 LOGP-2 LOGP-3 ENT-1 MASK-1 MASK-2 MASK-3 KL-1 KL-2 KL-3 KL-4 RWD-1 RWD-2 RWD-3 "
    "GAE-1 GAE-2 GAE-3 GAE-4 PG-1 PG-2 PG-3 PG-4 PG-5 PG-6 PG-7 VF-1 VF-2 PEN-1 PEN-2 EV-1 KLC-1 KLC-2 "
    "IN-1 IN-2 GRP-1 GRP-2 GRP-3 GRP-4 AGG-1 AGG-2 AGG-3 CLIP-1 CLIP-2 CLIP-3 GSPO-1 GSPO-2 GSPO-3 "
    "CISPO-1 CISPO-2 KLL-1 KLL-2 KLL-3 IS-1 IS-2 IS-3 RPP-1 RPP-2 ROB-1 ROB-2 ROB-3 ROB-4 "
    "STEP-1 STEP-2 STEP-3 STEP-4 STEP-5 STEP-6 STEP-7 STEP-8 EDGE-1 EDGE-2 EDGE-3"
).split()


@pytest.mark.parametrize("case", [pytest.param(case, id=case.id) for case in CASES])
def test_reference_reproduces_case(case: Case) -> None:
    problems = run_case(case, REFERENCE)
    assert not problems, "\n\n".join(problems)


def test_spec_defines_exactly_the_clause_ids() -> None:
    assert list(spec_clauses()) == CLAUSE_IDS


def test_every_clause_has_a_case_and_every_case_a_clause() -> None:
    clauses = set(spec_clauses())
    used = {case.clause for case in CASES}
    assert clauses - used == set(), "clauses without a hand case"
    assert used - clauses == set(), "cases whose clause is not a SPEC.md heading"


def test_case_ids_cited_in_spec_exist() -> None:
    ids = [case.id for case in CASES]
    cited = set(re.findall(r"`([A-Z]+-\d+/[A-Za-z0-9_.*-]+)`", SPEC_PATH.read_text(encoding="utf-8")))
    assert cited, "SPEC.md cites no case ids"
    assert sorted(pattern for pattern in cited if not fnmatch.filter(ids, pattern)) == []


def test_case_ids_are_unique() -> None:
    duplicates = [case_id for case_id, count in Counter(case.id for case in CASES).items() if count > 1]
    assert duplicates == []


def test_every_op_has_a_case() -> None:
    assert {case.op for case in CASES} == OPS


def test_decode_inputs_types() -> None:
    case = Case(
        id="IN-1/decode",
        clause="IN-1",
        op="masked_mean",
        description="",
        source="",
        inputs={
            "x": [[1.0, "nan", "-inf"]],
            "mask": [[1, 0, 0]],
            "input_ids": [[0, 1]],
            "weights": [[1, 2]],
            "scale": "inf",
            "name": "k3",
            "flag": False,
        },
        expected={},
        dtype="float32",
        input_dtypes={"weights": "float64"},
    )
    decoded = decode_inputs(case)
    assert decoded["x"].dtype == torch.float32
    assert torch.isnan(decoded["x"][0, 1]) and decoded["x"][0, 2] == float("-inf")
    assert decoded["mask"].dtype == torch.bool and decoded["mask"].tolist() == [[True, False, False]]
    assert decoded["input_ids"].dtype == torch.int64
    assert decoded["weights"].dtype == torch.float64
    assert decoded["scale"] == float("inf")
    assert decoded["name"] == "k3" and decoded["flag"] is False


class _FlippedGae(ReferenceOps):
    """A wrong implementation: GAE advantages with the sign flipped."""

    name = "flipped-gae"

    @staticmethod
    def gae(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        advantages, returns = ReferenceOps.gae(*args, **kwargs)
        return -advantages, returns


class _DetachedLoss(ReferenceOps):
    """A wrong implementation: the right policy-loss values, but no gradient."""

    @staticmethod
    def policy_loss(*args: Any, **kwargs: Any) -> Any:
        result = ReferenceOps.policy_loss(*args, **kwargs)
        return {"loss": result.loss.detach() + 0.0, "clipfrac": result.clipfrac}


class _NoValidation(ReferenceOps):
    """A wrong implementation: never raises."""

    @staticmethod
    def masked_mean(*args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(())


def _case(case_id: str) -> Case:
    (case,) = [case for case in CASES if case.id == case_id]
    return case


def test_run_case_reports_a_wrong_value_with_a_reproduction() -> None:
    messages = run_case(_case("GAE-1/three-step-lambda-0.5"), _FlippedGae())
    assert len(messages) == 1
    message = messages[0]
    assert message.startswith("GAE-1/three-step-lambda-0.5 (GAE-1, gae.json): advantages: expected")
    assert "got [[-0.42" in message
    assert "impl.gae(rewards=rewards, values=values, mask=mask, gamma=1.0, lam=0.5)" in message
    assert "flipped-gae" in message


def test_run_case_reports_a_missing_gradient() -> None:
    messages = run_case(_case("PG-1/clip-table-A2-ratio0.6"), _DetachedLoss())
    assert len(messages) == 1 and "d loss / d logp: expected [[-1.2]], got [[0.0]]" in messages[0]


def test_run_case_reports_missing_outputs_and_ops() -> None:
    messages = run_case(_case("PG-7/step-0-identity"), _DetachedLoss())
    assert any("output 'approx_kl' missing" in message for message in messages)
    assert run_case(_case("KLC-2/unchanged"), object()) != []


def test_run_case_reports_a_missing_error() -> None:
    messages = run_case(_case("IN-2/masked-mean-wrong-shape"), _NoValidation())
    assert len(messages) == 1 and "expected ValueError" in messages[0]


def test_reproductions_run() -> None:
    for case in CASES:
        source = reproduction(case, REFERENCE)
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            try:
                exec(compile(source, case.id, "exec"), {})
            except ValueError as error:
                assert case.raises == "ValueError" and case.match is not None and case.match in str(error)
            else:
                assert case.raises is None, f"{case.id}: the reproduction did not raise"
        assert case.raises is not None or output.getvalue().count("\n") >= len(case.expected)


def test_load_cases_rejects_malformed_records(tmp_path: Path) -> None:
    record = json.loads(json.dumps(_record("GAE-1/three-step-lambda-0.5")))
    (tmp_path / "ok.json").write_text(json.dumps([record]))
    assert [case.id for case in load_cases(cases_dir=tmp_path)] == [record["id"]]
    for broken in (
        {**record, "unknown": 1},
        {**record, "op": "nope"},
        {**record, "clause": "GAE-9"},
        {**record, "expected": {"out": 1.0}},
        {**record, "raises": "ValueError"},
        {key: value for key, value in record.items() if key != "source"},
    ):
        (tmp_path / "ok.json").write_text(json.dumps([broken]))
        with pytest.raises(ValueError):
            load_cases(cases_dir=tmp_path)


def _record(case_id: str) -> dict[str, Any]:
    case = _case(case_id)
    path = Path(__file__).resolve().parent.parent / "spec" / "cases" / case.file
    (record,) = [item for item in json.loads(path.read_text()) if item["id"] == case_id]
    return dict(record)
