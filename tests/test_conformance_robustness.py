"""Value and robustness verdicts apart (issue 11, part 1).

A stand-in library whose masked reductions multiply by the mask (``x * mask``: right on the zeros
its own pipeline puts into masked-out slots, NaN as soon as a NaN sits there) declares
``masked_fill='zero'``. The suite must pass it on the value clauses (MASK-1, KL-1..3, IN-1, ...) and
fail it only on the robustness clause ROB-1; the report tells the two kinds apart.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import MappingProxyType

import pytest
import torch
from torch import Tensor

import ppo_ref

ROOT = Path(__file__).resolve().parent.parent


class FragileAdapter:
    """masked_mean and kl_penalty written with ``x * mask``; right on zero-filled inputs only."""

    name = "fragile-standin"
    version = "0"
    provenance = "tests/test_conformance_robustness.py: masked_mean = sum(x * m) / sum(m); kl * m"
    ops = frozenset({"masked_mean", "kl_penalty"})
    conventions = MappingProxyType({"masked_fill": "zero"})

    def masked_mean(self, x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
        m = mask.to(x.dtype)
        total = (x * m).sum() if dim is None else (x * m).sum(dim)
        count = m.sum() if dim is None else m.sum(dim)
        return total / count.clamp(min=1)

    def kl_penalty(
        self, logp: Tensor, ref_logp: Tensor, estimator: str = "k1", mask: Tensor | None = None
    ) -> Tensor:
        kl = ppo_ref.kl_penalty(logp, ref_logp, estimator)
        return kl if mask is None else kl * mask.to(kl.dtype)


def make_fragile_adapter() -> FragileAdapter:
    return FragileAdapter()


def test_the_stand_in_is_right_on_zeros_and_fragile_to_nan() -> None:
    """The premise: equal to the reference with zeros off the mask, NaN with a NaN there."""
    adapter = make_fragile_adapter()
    x, mask = torch.tensor([[1.0, 3.0, 0.0]]), torch.tensor([[1, 1, 0]])
    assert float(adapter.masked_mean(x, mask)) == float(ppo_ref.masked_mean(x, mask)) == 2.0
    assert torch.isnan(adapter.masked_mean(torch.tensor([[1.0, 3.0, float("nan")]]), mask))


@pytest.mark.multiprocess  # runs the suite in a subprocess
def test_a_fragile_library_passes_the_value_clauses_and_fails_only_robustness(tmp_path: Path) -> None:
    stem = tmp_path / "report"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "conformance/test_masked.py",
        "conformance/test_kl.py",
        "conformance/test_invariances.py",
        "conformance/test_robustness.py",
        "conformance/test_hand_cases.py",
        "-q",
        "-p",
        "no:cacheprovider",
        "--impl=tests.test_conformance_robustness:make_fragile_adapter",
        "--conformance-examples=10",
        f"--conformance-report={stem}",
    ]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    report = json.loads(stem.with_suffix(".json").read_text(encoding="utf-8"))
    verdicts = {c["id"]: (c["verdict"], c["kind"]) for c in report["clauses"]}
    for clause in ("MASK-1", "KL-1", "KL-2", "KL-3"):
        assert verdicts[clause] == ("pass", "value"), (clause, verdicts[clause])
    # IN-1 is checked with the declared zeros off the mask: a pass against the declared convention.
    assert verdicts["IN-1"] == ("declared convention", "value"), verdicts["IN-1"]
    assert verdicts["ROB-1"] == ("fail", "robustness"), verdicts["ROB-1"]
    failing = sorted(clause for clause, (verdict, _) in verdicts.items() if verdict == "fail")
    assert failing == ["ROB-1"], failing
    by_kind = report["summary_by_kind"]
    assert by_kind["value"]["fail"] == 0 and by_kind["robustness"]["fail"] == 1, by_kind
