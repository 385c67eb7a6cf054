"""The clause maps of the narrowing convention keys agree with the suite's markers (issue 25).

A narrowing key (``loss_aggregations``, ``policy_loss_options``, ...) declares that the adapter
lacks a capability; the suite's tests that need it carry ``needs("<kind>:<option>")`` beside their
``clause`` markers, and are skipped as "not provided". The key's clause function
(:mod:`ppo_ref.adapters.conventions.clauses`) names the report rows such a declaration touches.
Each clause it names for a missing option must be a clause of a test that needs that option, so a
marker moved in ``conformance/`` without the map (or the map without the markers) fails here.

The maps are a chosen subset of the markers, not a copy: AGG-2 and AGG-3 need every mode, but a
missing mode is reported under the clause that checks that mode, so deriving the maps from the
markers would change the report. The markers are read from the suite's own collection
(``pytest --collect-only``), in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ppo_ref.adapters.conventions import CONVENTIONS

pytestmark = pytest.mark.multiprocess  # collects the suite in a pytest subprocess (seconds)

ROOT = Path(__file__).resolve().parent.parent

NARROWING = {
    "loss_aggregations": "loss_agg",
    "policy_loss_options": "policy_option",
    "group_methods": "group_method",
    "kl_loss_estimators": "kl_loss_estimator",
    "correction_levels": "correction_level",
    "correction_modes": "correction_mode",
    "value_clip_modes": "value_clip",
}
"""Narrowing key -> the capability kind of the ``needs`` markers of its options (``conformance.hooks``)."""

_COLLECT = """
import json, sys
import pytest

class Dump:
    def pytest_collection_finish(self, session):
        rows = [
            {
                "clauses": [c for m in item.iter_markers("clause") for c in m.args],
                "needs": [n for m in item.iter_markers("needs") for n in m.args],
            }
            for item in session.items
        ]
        with open(sys.argv[1], "w", encoding="utf-8") as out:
            json.dump(rows, out)

args = ["conformance/", "--impl=mine", "--collect-only", "-q", "-p", "no:cacheprovider"]
sys.exit(pytest.main(args, plugins=[Dump()]))
"""


@pytest.fixture(scope="module")
def needed_clauses(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Capability (``loss_agg:token-mean``) -> the clauses of the suite's tests that need it."""
    dump = tmp_path_factory.mktemp("markers") / "markers.json"
    command = [sys.executable, "-c", _COLLECT, str(dump)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    found: dict[str, set[str]] = {}
    for row in json.loads(dump.read_text(encoding="utf-8")):
        for capability in row["needs"]:
            found.setdefault(capability, set()).update(row["clauses"])
    return found


@pytest.mark.parametrize("key", sorted(NARROWING))
def test_a_missing_option_touches_only_clauses_whose_tests_need_it(
    key: str, needed_clauses: dict[str, set[str]]
) -> None:
    convention = CONVENTIONS[key]
    assert isinstance(convention.reference, frozenset)  # a narrowing key's reference: every option
    options = sorted(convention.reference)
    assert len(options) >= 2
    for option in options:
        declared = convention.parse([o for o in options if o != option])
        touched = set(convention.clauses(declared))
        needed = needed_clauses.get(f"{NARROWING[key]}:{option}", set())
        assert touched, f"{key} without {option!r} touches no clause"
        assert touched <= needed, (
            f"{key} without {option!r} touches {sorted(touched - needed)}, which no test needing "
            f"{NARROWING[key]}:{option} is marked with (those tests: {sorted(needed)})"
        )
