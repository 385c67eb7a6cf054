"""An op that computes in float32 and refuses float64 inputs (issue 28, Deliver 3).

ms-swift's ``compute_advantages_dynamic`` allocates its group means in float32 and index-puts the
scores into them (``swift/rl_core/advantage.py:159``), so float64 scores raise ``RuntimeError: Index
put requires the source and destination dtypes match``; its pipeline only ever gives it float32.
The suite used to report that as a value FAIL with no hint, because declaring ``compute_dtype:
float32`` only widened the tolerance and the inputs stayed float64. Now an op declared computed in
float32 is called again on float32 casts of its float64 inputs where it raises on them
(``conformance.support.ComparedAdapter``), and the convention inference says so when it suggests
the declaration.

The fast tests check the compared adapter itself; the ``multiprocess`` one runs ``check_op`` on a
stand-in of that function, undeclared (GRP-1 fails, and the suggestion names the refusal) and
declared (every group_advantages clause passes).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import torch

import ppo_ref
from conformance import support
from ppo_ref.adapters import parse_conventions

ROOT = Path(__file__).resolve().parent.parent


def refusing_group_advantages(scores: torch.Tensor, group_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """The reference's group advantages behind ms-swift's float32 index-put (raises on float64)."""
    groups, index = torch.unique(group_ids, return_inverse=True)
    means = torch.zeros(len(groups))  # float32, as ms-swift's prompt_means
    means.index_put_((index,), scores, accumulate=True)
    return ppo_ref.group_advantages(scores, group_ids, **kwargs)


class _Refusing:
    name, version, provenance = "refusing", "0", "tests/test_float64_refused.py"
    ops = frozenset({"group_advantages", "masked_mean"})
    conventions = MappingProxyType({"compute_dtype": {"group_advantages": "float32"}})
    group_advantages = staticmethod(refusing_group_advantages)

    @staticmethod
    def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
        if values.dtype == torch.float64:
            raise RuntimeError("float64 refused")
        return ppo_ref.masked_mean(values, mask, dim)


def _compared(conventions: Mapping[str, object]) -> Any:
    return support.compared_adapter(_Refusing(), parse_conventions(dict(conventions)))


SCORES = torch.tensor([0.0, 1.0, 2.0, 4.0], dtype=torch.float64)
GROUPS = torch.tensor([0, 0, 1, 1])


def test_a_declared_float32_op_gets_float32_where_it_refuses_float64() -> None:
    support.begin_test()
    with pytest.raises(RuntimeError, match="Index put requires"):
        refusing_group_advantages(SCORES, GROUPS)  # what the suite saw before
    scores = SCORES.clone().requires_grad_(True)
    result = _compared(_Refusing.conventions).group_advantages(scores, GROUPS, method="grpo")
    assert result.dtype == torch.float32
    torch.testing.assert_close(
        result.double(), ppo_ref.group_advantages(SCORES, GROUPS), rtol=1e-6, atol=1e-6
    )
    assert support.refused_float64() == {"group_advantages"}
    (gradient,) = torch.autograd.grad(result[1] * 2.0, scores)  # the cast is differentiable
    assert gradient.dtype == torch.float64 and gradient.abs().sum() > 0
    support.begin_test()
    assert support.refused_float64() == frozenset()  # per test


def test_only_a_declared_op_and_only_on_float64_is_retried() -> None:
    support.begin_test()
    undeclared = _compared({"compute_dtype": {"group_advantages": "float32"}})
    with pytest.raises(RuntimeError, match="float64 refused"):  # masked_mean not declared float32
        undeclared.masked_mean(SCORES, torch.ones(4, dtype=torch.bool))
    not_declared = _compared({})
    with pytest.raises(RuntimeError, match="Index put requires"):
        not_declared.group_advantages(SCORES, GROUPS)
    declared = _compared(_Refusing.conventions)
    with pytest.raises(RuntimeError, match="shape mismatch"):  # float32 input that fails: its own error
        declared.group_advantages(SCORES.float()[:3], GROUPS)
    assert support.refused_float64() == frozenset()


def test_a_second_failure_raises_the_first_exception() -> None:
    def always(scores: torch.Tensor, group_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError(f"refused {scores.dtype}")

    class Always(_Refusing):
        group_advantages = staticmethod(always)

    support.begin_test()
    compared: Any = support.compared_adapter(Always(), parse_conventions(dict(_Refusing.conventions)))
    with pytest.raises(RuntimeError, match=r"^refused torch.float64$"):
        compared.group_advantages(SCORES, GROUPS)
    assert support.refused_float64() == frozenset()


_SCRIPT = """
import json, sys
from ppo_ref_conformance import check_op
sys.path[:0] = [{root!r}, {tests!r}]  # the stand-in lives in this test module
from test_float64_refused import refusing_group_advantages

out = {{}}
declared = {{"compute_dtype": {{"group_advantages": "float32"}}}}
for name, conventions in (("undeclared", {{}}), ("declared", declared)):
    found = check_op("group_advantages", refusing_group_advantages, conventions=conventions, examples=5,
                     raise_on_failure=False)
    out[name] = {{c.id: [c.verdict, list(c.suggestions)] for c in found.clauses}}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.multiprocess
def test_the_suite_names_the_refusal_and_passes_once_it_is_declared(tmp_path: Path) -> None:
    script = tmp_path / "check_refusing.py"
    script.write_text(
        textwrap.dedent(_SCRIPT.format(root=str(ROOT), tests=str(ROOT / "tests"))), encoding="utf-8"
    )
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    undeclared, declared = result["undeclared"], result["declared"]
    verdict, suggestions = undeclared["GRP-1"]
    assert verdict == "fail"
    assert any('"compute_dtype": {"group_advantages": "float32"}' in s for s in suggestions), suggestions
    assert any("raises on float64 inputs and returns on the same inputs in float32" in s for s in suggestions)
    assert "fail" not in {v for v, _ in declared.values()}, declared
    assert declared["GRP-1"][0] in {"pass", "declared convention"}, declared
