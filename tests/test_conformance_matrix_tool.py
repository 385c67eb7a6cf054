"""tools/conformance_matrix.py and its parts (tools/matrix/) on fabricated run results: findings parsed
from their header lines, FAIL cells linked by evidence (the failing test ids), reach per cell and per
library, the Markdown it renders, no machine paths, and its --check mode (verdicts, reach, linked
findings)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tools.matrix import run
from tools.matrix.build import build_matrix, check_differences, scrub, verdict_differences
from tools.matrix.findings import FINDINGS_FILES, REACHES, link_failures, load_findings, parse_findings
from tools.matrix.render import render_markdown

REPO = Path(__file__).resolve().parent.parent


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location(
        "conformance_matrix", REPO / "tools" / "conformance_matrix.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _clause(clause: str, verdict: str, **extra: Any) -> dict[str, Any]:
    """A report's clause entry; its kind ``value`` (GAE-2 of an adapter that declares holes) unless
    ``kind`` is given."""
    entry = {
        "id": clause,
        "title": f"title of {clause}",
        "kind": "value",
        "verdict": verdict,
        "declared_conventions": [],
        "first_failure": "",
        "skip_reasons": [],
    }
    return {**entry, **extra}


def _report(
    name: str, clauses: list[dict[str, Any]], conventions: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "implementation": {
            "impl": name,
            "name": name,
            "version": "1.0",
            "provenance": f"{name} functions | with a pipe",
            "ops": ["gae"],
            "declared_conventions": conventions or {},
            "contract_problems": [],
        },
        "date": "2026-11-29 12:00 UTC",
        "python": "3.11.7",
        "command": f"pytest conformance/ --impl={name}",
        "summary": {"pass": 1, "fail": 1},
        "clauses": clauses,
        "wall_seconds": 12.3,
        "metadata": {
            "versions": {name: "1.0", "torch": "2.13.0+cpu"},
            "test_versions": {"hypothesis": "6.0", "pytest": "8.0", "numpy": "2.0"},
            "convention_sources": {"approx_kl": "lib/file.py Trainer.train: approxkl = ..."},
            "not_provided": {"entropy": "no such function"},
        },
    }


FINDINGS_TEXT = """# Findings

<a id="lib-gae-padding"></a>
### lib-gae-padding: the recursion reads padded values

Implementations: lib
Reach: trainer-path
Explains: GAE-2/c8-skip-holes,
  `test_holes_and_padding_are_skipped`

```python
print("repro")  # Explains: GAE-2/never-parsed is code
```

<a id="lib-nan-padding"></a>
### lib-nan-padding
Reach: robustness
Explains: test_masked_out_entries_change_nothing[*]
Prose under the header: GAE-2/c8-skip-holes is not an id here.

<a id="other-gae"></a>
### other-gae: another library, the same test
Implementations: other
Reach: latent
Explains: test_holes_and_padding_are_skipped

<a id="lib-unfailed"></a>
### lib-unfailed: evidence that does not fail in this run
Reach: metrics-only
Explains: test_never_failed
"""

FAMILY_TEXT = """<a id="lib-contract"></a>
### lib-contract
Implementations: lib, other
Reach: adapter
Explains: CONTRACT
"""

GAE_TESTS = [
    "conformance/test_hand_cases.py::test_hand_case[GAE-2/c8-skip-holes]",
    "conformance/test_gae.py::test_holes_and_padding_are_skipped",
    "conformance/test_invariance.py::test_masked_out_entries_change_nothing[gae]",
]


def _reports(gae_tests: list[str] | None = None) -> dict[str, dict[str, Any]]:
    return {
        "mine": _report(
            "mine", [_clause("GAE-2", "pass"), _clause("PG-5", "pass"), _clause("ENT-1", "pass")]
        ),
        "lib": _report(
            "lib",
            [
                _clause(
                    "GAE-2", "fail", first_failure="advantages differ", failing_tests=gae_tests or GAE_TESTS
                ),
                _clause("PG-5", "declared convention", declared_conventions=["approx_kl='k2'"]),
                _clause(
                    "ENT-1", "not provided", skip_reasons=["not provided: op 'entropy' is not in the ops"]
                ),
            ],
            {"approx_kl": "'k2'"},
        ),
    }


REPORTS = _reports()


def _findings() -> Any:
    return parse_findings([FINDINGS_TEXT, ("findings-family.md", FAMILY_TEXT)])


def test_findings_header_lines_are_parsed() -> None:
    found = _findings()
    assert list(found) == ["lib-gae-padding", "lib-nan-padding", "other-gae", "lib-unfailed", "lib-contract"]
    gae = found["lib-gae-padding"]
    assert gae.implementations == ("lib",)
    assert gae.reach == "trainer-path"
    assert gae.explains == ("GAE-2/c8-skip-holes", "test_holes_and_padding_are_skipped")
    assert gae.source == "findings.md"
    assert found["lib-nan-padding"].implementations == ("lib",)  # from the id's prefix
    assert found["lib-nan-padding"].explains == ("test_masked_out_entries_change_nothing[*]",)
    assert found["lib-contract"].implementations == ("lib", "other")
    assert found["lib-contract"].source == "findings-family.md"


def test_an_unknown_reach_is_kept_as_unknown() -> None:
    found = parse_findings(['<a id="x-1"></a>\nReach: serious\nExplains: test_a\n'])
    assert found["x-1"].reach == "unknown"


def test_a_fixed_finding_explains_no_failure() -> None:
    """An entry the column's release fixed (reach ``fixed``) links no FAIL cell even when one of its
    ``Explains:`` ids fails: the failure has another cause, shown as unexplained until one is named."""
    text = '<a id="lib-old"></a>\nImplementations: lib\nReach: fixed\nExplains: GAE-2/c8-skip-holes, GAE-2\n'
    found = parse_findings([text])
    assert found["lib-old"].reach == "fixed"
    ids, unexplained = link_failures("lib", "GAE-2", GAE_TESTS[:1], found)
    assert (ids, unexplained) == ([], GAE_TESTS[:1])
    assert link_failures("lib", "GAE-2", GAE_TESTS[:1], _findings())[0] == ["lib-gae-padding"]


def test_failures_link_only_to_findings_whose_ids_failed() -> None:
    found = _findings()
    ids, unexplained = link_failures("lib", "GAE-2", GAE_TESTS, found)
    assert ids == ["lib-gae-padding", "lib-nan-padding"]
    assert unexplained == []
    # one test only: the finding whose evidence is another test is not linked
    ids, unexplained = link_failures("lib", "GAE-2", GAE_TESTS[2:], found)
    assert ids == ["lib-nan-padding"]
    # another library failing the same test is linked to its own finding only
    ids, unexplained = link_failures("other", "GAE-2", GAE_TESTS[1:2], found)
    assert ids == ["other-gae"]
    ids, unexplained = link_failures("lib", "GAE-3", ["conformance/test_gae.py::test_something_else"], found)
    assert (ids, unexplained) == ([], ["conformance/test_gae.py::test_something_else"])


def test_a_clause_id_explains_a_failure_without_test_ids() -> None:
    ids, unexplained = link_failures("lib", "CONTRACT", [], _findings())
    assert (ids, unexplained) == (["lib-contract"], [])
    ids, unexplained = link_failures("lib", "GAE-2", [], _findings())
    assert (ids, unexplained) == ([], ["GAE-2 (no failing test id)"])


def test_matrix_cells_carry_findings_reach_and_counts() -> None:
    matrix = build_matrix(REPORTS, _findings())
    assert matrix["unexplained_failures"] == []
    rows = {row["id"]: row["verdicts"] for row in matrix["clauses"]}
    cell = rows["GAE-2"]["lib"]
    assert cell["findings"] == ["lib-gae-padding", "lib-nan-padding"]
    assert cell["reach"] == "trainer-path"  # the most severe of trainer-path and robustness
    assert cell["finding_reach"] == {"lib-gae-padding": "trainer-path", "lib-nan-padding": "robustness"}
    assert matrix["reach_counts"] == {"mine": {}, "lib": {"trainer-path": 1}}
    assert matrix["findings"]["lib-unfailed"]["linked"] is False
    assert matrix["findings"]["lib-gae-padding"]["linked"] is True


def test_robustness_only_cell_and_an_unexplained_test() -> None:
    extra = "conformance/test_gae.py::test_new_property"
    matrix = build_matrix(_reports([GAE_TESTS[2], extra]), _findings())
    cell = {row["id"]: row["verdicts"] for row in matrix["clauses"]}["GAE-2"]["lib"]
    assert cell["findings"] == ["lib-nan-padding"]
    assert cell["unexplained"] == [extra]
    assert cell["reach"] == "unexplained"
    assert matrix["unexplained_failures"] == [f"lib GAE-2: {extra}"]
    text = render_markdown(matrix)
    assert (
        "**FAIL** (unexplained) [value: the adapter declares this edge input]: "
        "[lib-nan-padding](findings.md#lib-nan-padding), 1 failing test no"
    ) in text
    assert f"- lib GAE-2: {extra}" in text
    matrix = build_matrix(_reports([GAE_TESTS[2]]), _findings())
    assert matrix["reach_counts"]["lib"] == {"robustness": 1}
    assert "- `lib`: value clauses: robustness 1" in render_markdown(matrix)


def test_robustness_clauses_are_counted_apart() -> None:
    reports = _reports()
    reports["lib"]["clauses"].append(
        _clause("ROB-1", "fail", kind="robustness", failing_tests=[GAE_TESTS[2]], first_failure="nan")
    )
    matrix = build_matrix(reports, _findings())
    assert matrix["reach_counts"]["lib"] == {"trainer-path": 1}
    assert matrix["robustness_reach_counts"]["lib"] == {"robustness": 1}
    text = render_markdown(matrix)
    assert "- `lib`: value clauses: trainer-path 1; robustness clauses: robustness 1" in text
    assert "| ROB-1 (robustness) | title of ROB-1 |" in text


def test_edge_clauses_are_counted_apart_unless_declared() -> None:
    """Issue 20: an edge cell (an edge input the adapter does not declare) is counted apart from the
    value cells, in the header's summary too; the row names its kind."""
    reports = _reports()
    for entry in reports["lib"]["clauses"]:
        if entry["id"] == "GAE-2":
            entry["kind"] = "edge"  # an adapter that does not declare holes
    matrix = build_matrix(reports, _findings())
    assert matrix["reach_counts"]["lib"] == {}
    assert matrix["edge_reach_counts"]["lib"] == {"trainer-path": 1}
    cell = {row["id"]: row["verdicts"] for row in matrix["clauses"]}["GAE-2"]["lib"]
    assert cell["kind"] == "edge"
    text = render_markdown(matrix)
    assert "- `lib`: value clauses: none; edge clauses: trainer-path 1" in text
    assert "| GAE-2 (edge) | title of GAE-2 | pass | **FAIL** (trainer-path): " in text


def test_markdown_links_failures_conventions_and_sources() -> None:
    matrix = build_matrix(REPORTS, _findings())
    text = render_markdown(matrix)
    assert (
        "| GAE-2 (edge) | title of GAE-2 | pass | **FAIL** (trainer-path) [value: the adapter declares this "
        "edge input]: "
        "[lib-gae-padding](findings.md#lib-gae-padding) (trainer-path), "
        "[lib-nan-padding](findings.md#lib-nan-padding) (robustness) |"
    ) in text
    assert "declared convention ([approx_kl](#lib-convention-approx-kl))" in text
    assert "<a id=\"lib-convention-approx-kl\"></a>`approx_kl='k2'`: lib/file.py Trainer.train" in text
    assert "[not provided](#lib-not-provided-ent-1)" in text
    assert "<a id=\"lib-not-provided-ent-1\"></a>ENT-1: not provided: op 'entropy' is not in the ops" in text
    assert "- op `entropy`: no such function" in text
    assert "lib functions \\| with a pipe" in text  # table-safe provenance
    assert "| `lib` | lib 1.0, torch 2.13.0+cpu | hypothesis 6.0, pytest 8.0, numpy 2.0 |" in text
    assert "[lib-unfailed](findings.md#lib-unfailed) (metrics-only)" in text  # listed as not linked
    contract = build_matrix(
        {"lib": _report("lib", [_clause("CONTRACT", "fail", first_failure="bad adapter")])}, _findings()
    )
    assert "**FAIL** (adapter): [lib-contract](findings-family.md#lib-contract)" in render_markdown(contract)


def test_no_machine_path_reaches_the_docs() -> None:
    tool = _tool()
    report = json.loads(json.dumps(REPORTS["lib"]))
    site = "/home/someone/proj/.envs/lib/lib/python3.11/site-packages/lib/core.py:12"
    report["implementation"]["provenance"] = f"lib.core.gae ({site}); checkout {tool.REPO}/tools/x.py"
    report["clauses"][0]["first_failure"] = "see /tmp/pytest-of-x/test_0/out.json and /work/other/file.py"
    matrix = build_matrix({"lib": report}, _findings())
    text = render_markdown(matrix) + json.dumps(matrix)
    assert "site-packages/lib/core.py:12" in text
    assert "checkout tools/x.py" in text
    for prefix in ("/home/", "/tmp/", "/work/", str(tool.REPO)):
        assert prefix not in text
    assert "verl/workers/config/actor.py" == scrub("verl/workers/config/actor.py")


def test_a_partial_run_keeps_and_relinks_the_other_columns() -> None:
    full = json.loads(json.dumps(build_matrix(REPORTS, _findings())))
    updated = build_matrix({"mine": REPORTS["mine"]}, _findings(), full)
    assert updated["implementations"] == ["mine", "lib"]
    assert updated["clauses"] == full["clauses"]
    fewer = {k: v for k, v in _findings().items() if k != "lib-gae-padding"}
    relinked = build_matrix({"mine": REPORTS["mine"]}, fewer, full)
    cell = {row["id"]: row["verdicts"] for row in relinked["clauses"]}["GAE-2"]["lib"]
    assert cell["findings"] == ["lib-nan-padding"]
    assert cell["reach"] == "unexplained"  # the hand case and the GAE property lost their finding


def test_check_compares_verdicts_reach_and_linked_findings() -> None:
    found = _findings()
    matrix = json.loads(json.dumps(build_matrix(REPORTS, found)))
    assert check_differences(matrix, REPORTS, found) == []
    changed = json.loads(json.dumps(REPORTS["lib"]))
    changed["clauses"][0] = _clause("GAE-2", "pass")
    assert check_differences(matrix, {"lib": changed}, found) == [
        "lib GAE-2: verdict committed 'fail', now 'pass'"
    ]
    assert verdict_differences(matrix, {"other": changed}) == ["other: not in the committed matrix"]
    # the same verdicts, a finding's reach changed
    softer = dict(found)
    softer["lib-gae-padding"] = found["lib-gae-padding"]._replace(reach="latent")
    differences = check_differences(matrix, REPORTS, softer)
    assert any(d.startswith("lib GAE-2: reach committed 'trainer-path', now 'latent'") for d in differences)
    # the same verdicts, a finding gone: findings, reach and unexplained tests differ
    fewer = {k: v for k, v in found.items() if k != "lib-gae-padding"}
    differences = check_differences(matrix, REPORTS, fewer)
    assert [d.split(":")[1].split()[0] for d in differences] == ["reach", "findings", "unexplained"]


def test_check_mode_exit_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--check --render-only: reads saved reports, compares, writes nothing, exits 1 on a difference."""
    tool = _tool()
    reports = tmp_path / "reports"
    reports.mkdir()
    for name, report in REPORTS.items():
        (reports / f"{name}.run.json").write_text(json.dumps(report), encoding="utf-8")
    findings = tmp_path / "findings.md"
    findings.write_text(FINDINGS_TEXT, encoding="utf-8")
    committed = tmp_path / "matrix.json"
    committed.write_text(json.dumps(build_matrix(REPORTS, parse_findings([FINDINGS_TEXT]))))
    monkeypatch.setattr(tool, "MATRIX_JSON", committed)
    monkeypatch.setattr(tool, "REPO", tmp_path)
    monkeypatch.setattr(run, "ALL_NAMES", ("mine", "lib"))
    before = committed.read_text(encoding="utf-8")
    args = ["--check", "--render-only", "--reports", str(reports), "--findings", str(findings), "mine", "lib"]
    assert tool.main(args) == 0
    findings.write_text(FINDINGS_TEXT.replace("Reach: trainer-path", "Reach: non-default"), encoding="utf-8")
    assert tool.main(args) == 1  # same verdicts, another reach
    findings.write_text(FINDINGS_TEXT, encoding="utf-8")
    changed = json.loads(json.dumps(REPORTS["lib"]))
    changed["clauses"][2] = _clause("ENT-1", "pass")
    (reports / "lib.run.json").write_text(json.dumps(changed), encoding="utf-8")
    assert tool.main(args) == 1
    assert committed.read_text(encoding="utf-8") == before


def test_the_script_imports_only_the_standard_library() -> None:
    """``--describe`` runs in every library's environment: loading the script imports neither its
    parts (``tools/matrix/``, which import the suite) nor ppo-ref, torch or Hypothesis."""
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('cm', 'tools/conformance_matrix.py')\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "heavy = ('tools', 'conformance', 'ppo_ref', 'torch', 'hypothesis')\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] in heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow  # imports torch and the adapters
def test_describe_records_the_test_tool_versions() -> None:
    metadata = _tool().describe("mine")
    assert set(metadata["test_versions"]) == {"hypothesis", "pytest", "numpy"}
    assert all(v and v != "not installed" for v in metadata["test_versions"].values())


def test_every_finding_has_a_reach_evidence_and_its_script() -> None:
    """docs/findings.md and docs/findings-family.md: each entry names its implementations, a known
    reach and the test ids it explains; a trainer-path, non-default or metrics-only entry names a
    script under findings/repro/ that exists."""
    found = load_findings(list(FINDINGS_FILES))
    assert len(found) >= 30
    assert len({f.source for f in found.values()}) == len([p for p in FINDINGS_FILES if p.exists()])
    for finding in found.values():
        assert finding.reach in REACHES, finding.id
        assert finding.explains, finding.id
        assert finding.version, finding.id
        if finding.reach in ("trainer-path", "non-default", "metrics-only"):
            script = finding.reproduction
            assert script.startswith("findings/repro/") and (REPO / script).is_file(), finding.id


def test_the_matrix_and_ci_cover_every_built_in_adapter() -> None:
    """Every built-in adapter (TRL 1.12 as ``trl`` and TRL 1.16 as ``trl116`` included) is a column of
    the tool with the distributions it shows, a column of the committed matrix, an implementation
    some finding may name, and one of the names .ci/run's matrix check runs."""
    from ppo_ref.adapters.registry import BUILTIN_ADAPTERS

    tool = _tool()
    assert set(run.ALL_NAMES) == set(BUILTIN_ADAPTERS)
    assert set(tool.DISTRIBUTIONS) == set(run.ALL_NAMES)
    committed = json.loads(tool.MATRIX_JSON.read_text(encoding="utf-8"))
    assert set(committed["implementations"]) == set(run.ALL_NAMES)
    check_lines = [
        line.split()
        for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
        if "tools/conformance_matrix.py" in line and "--check" in line and not line.lstrip().startswith("#")
    ]
    assert len(check_lines) == 1
    assert set(run.ALL_NAMES) <= set(check_lines[0])
    # A finding names matrix columns, or a variant of one outside the matrix (``skyrl-normalize``).
    named = {i for f in load_findings(list(FINDINGS_FILES)).values() for i in f.implementations}
    stray = {i for i in named - set(run.ALL_NAMES) if i.split("-", 1)[0] not in run.ALL_NAMES}
    assert not stray, stray


def test_shrink_is_the_suites_own_option() -> None:
    """The suite drops Hypothesis' shrink phase by itself (``conformance.support.examples``);
    ``--shrink`` passes ``--conformance-shrink`` and no plugin of the tool's own is loaded."""
    plain = run.suite_command("mine", Path("build/x"), None)
    shrunk = run.suite_command("mine", Path("build/x"), 7, shrink=True)
    assert "--conformance-shrink" not in plain and "tools.conformance_matrix" not in plain
    assert shrunk == [*plain, "--conformance-examples=7", "--conformance-shrink"]


def test_a_step_runners_declared_convention_is_labelled_with_its_source() -> None:
    """A trainer-step clause passed under a convention the step runner declares (issue 22: STEP-8's
    "full" support) reads "declared convention", linked to the source its test recorded."""
    from conformance.records import TestRecord
    from conformance.verdicts import _clause_entry, _step_conventions

    applied = (
        "sampling_convention",
        "full",
        "weights are the kept mass S (TRL #6789); measured: S mean 0.84",
    )
    records = [
        TestRecord(
            "conformance/test_step_tier.py::test_step8[0-0.8]",
            ("STEP-8",),
            "passed",
            step_conventions=(applied,),
        ),
        TestRecord(
            "conformance/test_step_tier.py::test_step8[4-1.0]",
            ("STEP-8",),
            "passed",
            step_conventions=(applied,),
        ),
    ]
    entry = _clause_entry("STEP-8", "A rollout sampled with top-k or top-p", records, [], "value")
    assert entry["verdict"] == "declared convention"
    assert entry["declared_conventions"] == ["sampling_convention=full"]
    plain = _clause_entry("STEP-8", "t", [TestRecord("t", ("STEP-8",), "passed")], [], "value")
    assert plain["verdict"] == "pass" and plain["declared_conventions"] == []
    failed = TestRecord("t2", ("STEP-8",), "failed", "weights differ")
    assert _clause_entry("STEP-8", "t", [*records, failed], [], "value")["verdict"] == "fail"
    report = _report(
        "lib", [_clause("STEP-8", "declared convention", declared_conventions=["sampling_convention=full"])]
    )
    report["implementation"]["step_conventions"] = _step_conventions(records)
    text = render_markdown(build_matrix({"lib": report}, _findings()))
    assert "declared convention ([sampling_convention](#lib-convention-sampling-convention))" in text
    assert (
        '<a id="lib-convention-sampling-convention"></a>`sampling_convention=full`: weights are the kept'
        in text
    )
