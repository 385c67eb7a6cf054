"""The conformance suite run as a user would run it: ``pytest conformance/ --impl=module:factory
--conformance-report PATH`` in a subprocess, against the example adapters of
``tests/example_adapter.py``, with few Hypothesis examples to keep it fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.cases import spec_clauses
from conformance.support import EDGE_CLAUSES

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.multiprocess  # each test starts pytest in a subprocess (most: the whole suite)


def _run_suite(*args: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "pytest",
        *args,
        "-p",
        "no:cacheprovider",
        "--conformance-examples=4",
    ]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def _verdicts(report_stem: Path) -> dict[str, str]:
    report = json.loads(report_stem.with_name(report_stem.name + ".json").read_text(encoding="utf-8"))
    return {entry["id"]: entry["verdict"] for entry in report["clauses"]}


def test_example_adapter_passes_with_its_declared_convention(tmp_path: Path) -> None:
    stem = tmp_path / "report"
    run = _run_suite(
        "conformance/", "--impl=tests.example_adapter:make_adapter", f"--conformance-report={stem}"
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "ppo-ref conformance: --impl=tests.example_adapter:make_adapter -> example" in run.stdout
    assert "declared conventions: clipfrac='ratio-outside'" in run.stdout
    verdicts = _verdicts(stem)
    clauses = spec_clauses()
    assert set(verdicts) == {"CONTRACT", *clauses}
    expected_special = {
        "PG-3": "declared convention",
        "PG-4": "not provided",  # the result has no ratio_outside_frac (optional in the contract)
        "ENT-1": "not provided",
        "PEN-1": "not provided",
        "PEN-2": "not applicable",
        "EV-1": "not applicable",
        "KLC-1": "not applicable",
        "KLC-2": "not applicable",
        "IN-2": "not applicable",
        # The PPO-family ops are not in its ops, and its policy_loss takes none of the new keywords
        # (clip_eps_high, dual_clip, the counts): inferred from its signature, so not provided.
        # RPP-1 and RPP-2's hand cases compose gae and masked_whiten, which it has; CLIP-3's case
        # without a dual clip runs.
        **dict.fromkeys(
            "GRP-1 GRP-2 GRP-3 GRP-4 AGG-1 AGG-2 AGG-3 CLIP-1 CLIP-2 GSPO-1 GSPO-2 GSPO-3 "
            "CISPO-1 CISPO-2 KLL-1 KLL-2 KLL-3 IS-1 IS-2 IS-3 "
            # ROB-4: family ops; STEP: no step runner
            "ROB-4 STEP-1 STEP-2 STEP-3 STEP-4 STEP-5 STEP-6 STEP-7 STEP-8".split(),
            "not provided",
        ),
        "CLIP-3": "declared convention",
        # its one hand case has a hole, an edge input this adapter does not declare (it moves to
        # EDGE-1), and its property needs group_advantages (issue 20)
        "RPP-2": "not provided",
    }
    for clause, verdict in verdicts.items():
        assert verdict == expected_special.get(clause, "pass"), f"{clause}: {verdict}"
    markdown = stem.with_name("report.md").read_text(encoding="utf-8")
    assert markdown.startswith("# Conformance report: example ")
    assert "**Result: PASS**" in markdown
    for clause, title in clauses.items():
        kind = "robustness" if clause.startswith("ROB-") else "edge" if clause in EDGE_CLAUSES else "value"
        assert f"| {clause} | {kind} | {title} |" in markdown
    assert "checked against the variant for `clipfrac='ratio-outside'`" in markdown
    assert "not provided: op 'entropy' is not in the adapter's ops" in markdown


def test_an_undeclared_deviation_fails(tmp_path: Path) -> None:
    stem = tmp_path / "wrong.json"  # a trailing .json is dropped: wrong.json and wrong.md are written
    run = _run_suite(
        "conformance/test_contract.py",
        "conformance/test_policy_loss.py",
        "--impl=tests.example_adapter:make_wrong_adapter",
        f"--conformance-report={stem}",
    )
    assert run.returncode == 1, run.stdout[-3000:]
    verdicts = _verdicts(tmp_path / "wrong")
    # The misspelt key leaves the clip-fraction rule undeclared: the suite's inference finds it.
    assert verdicts["PG-3"] == "matches undeclared convention"
    assert verdicts["CONTRACT"] == "fail"
    assert {verdicts[c] for c in ("PG-1", "PG-2", "PG-5", "PG-6")} == {"pass"}
    assert verdicts["PG-4"] == "not provided"
    markdown = (tmp_path / "wrong.md").read_text(encoding="utf-8")
    assert "**Result: FAIL**" in markdown
    assert "unknown key 'clipfrac_definition'" in markdown
    assert '"clipfrac": "ratio-outside",' in markdown and "## Undeclared conventions" in markdown
    assert '"clipfrac": "ratio-outside",' in run.stdout  # the terminal says what to paste, too

    # With the inference off, the undeclared deviation is a FAIL, as before issue 20.
    off = _run_suite(
        "conformance/test_policy_loss.py",
        "--impl=tests.example_adapter:make_wrong_adapter",
        "--conformance-inference=off",
        f"--conformance-report={tmp_path / 'off'}",
    )
    assert off.returncode == 1, off.stdout[-3000:]
    assert _verdicts(tmp_path / "off")["PG-3"] == "fail"
    markdown = (tmp_path / "off.md").read_text(encoding="utf-8")
    assert "test_clipfrac_matches_the_reference" in markdown


def test_two_undeclared_conventions_are_named_and_only_the_planted_bug_fails(tmp_path: Path) -> None:
    """Issue 20: the planted adapter computes biased whitening and a value loss without the 1/2
    (conventions it does not declare) and k3 with the ratio the wrong way up (a bug). The report
    names both keys with the declaration to paste, and every FAIL left is a test of the bug."""
    stem = tmp_path / "planted"
    run = _run_suite(
        "conformance/",
        "--impl=tests.example_adapter:make_planted_adapter",
        "--conformance-output=compact",
        f"--conformance-report={stem}",
    )
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    report = json.loads(stem.with_name("planted.json").read_text(encoding="utf-8"))
    clauses = {entry["id"]: entry for entry in report["clauses"]}
    for clause in ("MASK-2", "MASK-3"):
        assert clauses[clause]["verdict"] == "matches undeclared convention", clauses[clause]
        assert clauses[clause]["undeclared_conventions"] == ['"whiten_variance": "biased",']
        assert "biased (1/n) variance" in clauses[clause]["convention_reasons"][0]
    for clause in ("VF-1", "VF-2"):
        assert clauses[clause]["verdict"] == "matches undeclared convention", clauses[clause]
        assert clauses[clause]["undeclared_conventions"] == ['"value_loss_scale": 1.0,']
    failing = {
        entry["id"]: entry["failing_tests"] for entry in report["clauses"] if entry["verdict"] == "fail"
    }
    assert {"KL-3", "KL-4"} <= set(failing), failing
    tests = [test for ids in failing.values() for test in ids]
    # every failing test is one of k3 in kl_penalty: the kl tests, or a hand case of kl_penalty
    assert all(("test_kl.py::" in t and "k3" in t) or "KL-" in t or "kl-penalty" in t for t in tests), tests
    assert report["summary_by_kind"]["value"]["fail"] == len([c for c in failing if not c.startswith("ROB-")])
    out = run.stdout
    assert '"whiten_variance": "biased",' in out and '"value_loss_scale": 1.0,' in out
    assert "FAIL KL-3" in out or "FAIL (value) KL-3" in out


def test_a_wrong_number_on_an_undeclared_edge_input_is_an_edge_fail(tmp_path: Path) -> None:
    """Issue 20: an adapter whose masked_mean is NaN on a row or batch without action tokens gets an
    edge FAIL only (EDGE-2: its MASK-1 hand cases on such inputs moved there), no value FAIL, and
    leads its compact output with it; declaring that its pipeline makes empty rows turns the same
    hand cases into a value FAIL of MASK-1 (and EDGE-2 into a value clause, which it passes: its
    properties insert empty rows into batches that keep a token)."""
    failing: dict[str, dict[str, str]] = {}
    for factory in ("make_empty_row_adapter", "make_empty_row_adapter_declared"):
        stem = tmp_path / factory
        run = _run_suite(
            "conformance/",
            f"--impl=tests.example_adapter:{factory}",
            "--conformance-output=compact",
            f"--conformance-report={stem}",
        )
        assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
        report = json.loads(stem.with_name(f"{factory}.json").read_text(encoding="utf-8"))
        entries = {entry["id"]: entry for entry in report["clauses"]}
        failing[factory] = {c: e["kind"] for c, e in entries.items() if e["verdict"] == "fail"}
        counts = report["summary_by_kind"]
        assert sum(counts[k]["fail"] for k in ("value", "edge", "robustness")) == len(failing[factory])
        tests = [t for c in failing[factory] for t in entries[c]["failing_tests"]]
        assert any("MASK-1/empty-mask" in t for t in tests), tests
        heads = [line for line in run.stdout.splitlines() if line.startswith("FAIL (")]
        first = heads[0].split()[2].rstrip(",:")
        assert heads[0].startswith(f"FAIL ({failing[factory][first]}) "), heads
    assert failing["make_empty_row_adapter"] == {"EDGE-2": "edge"}
    assert failing["make_empty_row_adapter_declared"].get("MASK-1") == "value"
    assert "EDGE-2" not in failing["make_empty_row_adapter_declared"]


def test_unknown_impl_is_a_usage_error_listing_the_adapters() -> None:
    run = _run_suite("conformance/test_contract.py", "--impl=no-such-adapter")
    assert run.returncode == 4, run.stdout + run.stderr
    assert "available adapters: mine, trl, verl" in run.stderr


def test_the_readme_adapter_runs_from_outside_the_repository(tmp_path: Path) -> None:
    # examples/my_ppo_adapter.py is the adapter the README shows; a user keeps it in their own repo.
    outside = tmp_path / "users_repo"
    outside.mkdir()
    (outside / "my_ppo_adapter.py").write_text(
        (ROOT / "examples" / "my_ppo_adapter.py").read_text(encoding="utf-8"), encoding="utf-8"
    )
    stem = tmp_path / "mine-report"
    command = [sys.executable, "-m", "pytest", "conformance/", "-p", "no:cacheprovider"]
    command += ["--conformance-examples=4", "--impl=my_ppo_adapter:make_adapter"]
    command += [f"--conformance-report={stem}"]
    env = {**os.environ, "PYTHONPATH": str(outside)}
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    verdicts = _verdicts(stem)
    assert {verdicts[c] for c in ("GAE-1", "GAE-2", "GAE-3", "GAE-4", "PG-1", "PG-5")} == {"pass"}
    assert verdicts["PG-3"] == "declared convention"
    assert verdicts["KL-1"] == "not provided"


def test_an_aggregate_loss_without_count_keywords_is_not_provided_there(tmp_path: Path) -> None:
    """Issue 28: an adapter whose aggregate_loss takes no count keywords (a newcomer wrapping
    ms-swift's ``_sdar_agg_loss``) and declares no ``policy_loss_options`` has ``counts`` inferred
    away from its signature: the tests that need the keywords are not provided, naming them, where
    they were FAILs with a TypeError (PG-2, AGG-1..3, ROB-4 and EDGE-2 before)."""
    stem = tmp_path / "countless"
    run = _run_suite(
        "conformance/",
        "--impl=tests.example_adapter:make_countless_aggregation_adapter",
        "--conformance-output=compact",
        f"--conformance-report={stem}",
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    verdicts = _verdicts(stem)
    assert "fail" not in verdicts.values(), verdicts
    assert verdicts["PG-2"] == "pass" and verdicts["EDGE-2"] == "pass"
    assert (
        "not provided: the keyword token_count (declared policy_loss_options excludes 'counts')" in run.stdout
    )
    assert "TypeError" not in run.stdout


def test_a_fixed_epsilon_in_float32_is_suggested_as_both_keys(tmp_path: Path) -> None:
    """Issue 28: a group advantage computed in float32 with its own fixed epsilon (ms-swift's 1e-4)
    fails on either key alone; the suite used to suggest nothing for its GRPO cases (each re-run
    tried one key), it now names ``compute_dtype`` and ``group_std_eps`` together."""
    stem = tmp_path / "float32-eps"
    run = _run_suite(
        "conformance/",
        "--impl=tests.example_adapter:make_float32_fixed_eps_group_adapter",
        "--conformance-output=compact",
        f"--conformance-report={stem}",
        "-k",
        "group or GRP",
    )
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    report = json.loads(stem.with_name(stem.name + ".json").read_text(encoding="utf-8"))
    entries = {entry["id"]: entry for entry in report["clauses"]}
    failing = [clause for clause, entry in entries.items() if entry["verdict"] == "fail"]
    assert failing, {clause: entry["verdict"] for clause, entry in entries.items()}
    for clause in failing:
        suggestions = " ".join(entries[clause]["suggestions"])
        assert '"compute_dtype"' in suggestions and '"group_std_eps": 0.0001' in suggestions, entries[clause]
    assert 'passes only together with "group_std_eps": 0.0001' in run.stdout
