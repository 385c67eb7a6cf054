#!/usr/bin/env python3
"""Run the conformance suite against ppo-ref and the third-party PPO libraries; publish the matrix.

    python tools/conformance_matrix.py                       # mine + the six libraries (TRL 1.12 and 1.16)
    python tools/conformance_matrix.py trl torchrl sb3       # only these; the other columns are kept
    python tools/conformance_matrix.py --check mine torchrl  # CI: exit 1 if verdicts differ from the
                                                             # committed docs/conformance-matrix.json
    python tools/conformance_matrix.py --render-only         # rebuild the docs from the last reports

For each name it runs ``pytest conformance/ --impl=NAME --conformance-report=...`` with that
implementation's interpreter: ``mine`` in the main ``.venv``, a library in ``.envs/NAME/bin/python``
(built first with ``tools/thirdparty_envs.py NAME`` when missing, unless ``--no-build``). Reports and
logs go to ``build/conformance-matrix/``. Then it writes ``docs/conformance-matrix.json`` and
``docs/conformance-matrix.md``: clauses as rows, implementations as columns, every declared-convention
cell linked to its source citation and every FAIL cell linked to findings by evidence.

Findings live in ``docs/findings.md`` and ``docs/findings-family.md``. An entry starts with an anchor
``<a id="FINDING-ID"></a>`` and has header lines ``Implementations: trl``, ``Reach: metrics-only``
(one of REACHES) and ``Explains: test ids, test functions, hand-case ids or clause ids``. A FAIL cell
is linked only to the findings of its implementation whose ``Explains:`` ids match a test that failed
in that run (the report's ``failing_tests``); a failing test no finding explains is listed and makes
the cell's reach ``unexplained``. The cell shows the most severe reach of its findings, and each
implementation gets a count of its FAIL cells by reach (``reach_counts``). ``--check`` compares each
cell's verdict, reach, linked findings and unexplained tests with the committed matrix.

Hypothesis does not shrink failing examples in these runs, the suite's default (``--shrink`` passes
``--conformance-shrink`` to turn shrinking back on). Verdicts are the same (the derandomized examples
are generated either way; a failing clause fails whether or not its example is then minimised), and
a library with many failing properties runs in minutes instead of hours. Failure messages in the
reports show unshrunk examples.

This script is the command line; its parts are in ``tools/matrix/``: ``run.py`` (the suite in each
environment), ``findings.py`` (the findings and which failure each explains), ``build.py`` (the
matrix's data and ``--check``) and ``render.py`` (the Markdown). Only the standard library is
imported at module level, so ``--describe NAME`` (used internally, printing the adapter's metadata as
JSON) runs in any environment that has ppo-ref.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
MATRIX_JSON = DOCS / "conformance-matrix.json"
MATRIX_MD = DOCS / "conformance-matrix.md"

DISTRIBUTIONS: Mapping[str, tuple[str, ...]] = {
    "mine": ("ppo-ref", "torch"),
    "trl": ("trl", "transformers", "torch"),
    "trl116": ("trl", "transformers", "torch"),
    "verl": ("verl", "tensordict", "torch"),
    "openrlhf": ("openrlhf", "deepspeed", "torch"),
    "torchrl": ("torchrl", "tensordict", "torch"),
    "sb3": ("stable-baselines3", "gymnasium", "torch"),
    "skyrl": ("skyrl", "torch"),
    "rlinf": ("rlinf", "torch"),
    "swift": ("ms-swift", "trl", "torch"),
}
"""Distributions whose versions the matrix shows for each implementation."""
TEST_DISTRIBUTIONS = ("hypothesis", "pytest", "numpy")
"""What the suite runs on, recorded per environment (``test_versions``): a regeneration elsewhere
can match them."""


def describe(name: str) -> dict[str, Any]:
    """The adapter's metadata (run inside the implementation's environment)."""
    from ppo_ref.adapters import get_adapter
    from ppo_ref.adapters.conventions import describe as describe_value

    adapter = get_adapter(name)
    versions = {}
    for dist in DISTRIBUTIONS.get(name, ()):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    test_versions = {}
    for dist in TEST_DISTRIBUTIONS:
        try:
            test_versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            test_versions[dist] = "not installed"
    declared = getattr(adapter, "conventions", {}) or {}
    return {
        "versions": versions,
        "test_versions": test_versions,
        "conventions": {key: describe_value(value) for key, value in declared.items()},
        "convention_sources": dict(getattr(adapter, "convention_sources", {}) or {}),
        "not_provided": dict(getattr(adapter, "not_provided", {}) or {}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help=f"implementations (default: {' '.join(DISTRIBUTIONS)})")
    parser.add_argument(
        "--check", action="store_true", help="compare with the committed matrix, write nothing"
    )
    parser.add_argument("--render-only", action="store_true", help="rebuild the docs from the last reports")
    parser.add_argument("--no-build", action="store_true", help="do not build a missing environment")
    parser.add_argument("--shrink", action="store_true", help="let Hypothesis shrink failing examples (slow)")
    parser.add_argument("--examples", type=int, default=None, help="Hypothesis examples per property")
    parser.add_argument(
        "--reports", type=Path, default=None, help="report directory (default build/conformance-matrix)"
    )
    parser.add_argument(
        "--findings",
        type=Path,
        action="append",
        help="findings file(s) to link (default docs/findings.md and docs/findings-family.md)",
    )
    parser.add_argument("--describe", metavar="NAME", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.describe:
        print(json.dumps(describe(args.describe)))
        return 0
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # run as a script, the checkout's root is not on the path
    from tools.matrix import build, render, run
    from tools.matrix.findings import FINDINGS_FILES, load_findings

    names = args.names or list(run.ALL_NAMES)
    reports_dir: Path = args.reports or run.REPORTS
    previous = json.loads(MATRIX_JSON.read_text(encoding="utf-8")) if MATRIX_JSON.exists() else None
    # --check compares like with like: the committed matrix's example count unless one is given.
    examples = (
        args.examples if args.examples is not None or not args.check else (previous or {}).get("examples")
    )
    unknown = [n for n in names if n not in run.ALL_NAMES]
    if unknown:
        parser.error(f"unknown implementations {unknown}; known: {', '.join(run.ALL_NAMES)}")
    if args.render_only:
        reports = run.load_reports(names, reports_dir)
    else:
        reports = {}
        for name in names:
            build_seconds = run.ensure_env(name, build=not args.no_build) if name != "mine" else None
            reports[name] = run.run_suite(
                name, examples, reports_dir, build_seconds, args.shrink, metadata=not args.check
            )
    findings = load_findings(args.findings or list(FINDINGS_FILES))
    if args.check:
        differences = build.check_differences(previous or {}, reports, findings)
        for line in differences:
            print(f"DIFFERS: {line}", file=sys.stderr)
        print(f"check: {len(differences)} difference(s) from {MATRIX_JSON.relative_to(REPO)}")
        return 1 if differences else 0
    shown = " ".join(names) if args.names else ""
    command = f"python tools/conformance_matrix.py {shown}".strip()
    matrix = build.build_matrix(reports, findings, previous, command, examples)
    DOCS.mkdir(exist_ok=True)
    MATRIX_JSON.write_text(json.dumps(matrix, indent=2) + "\n", encoding="utf-8")
    MATRIX_MD.write_text(render.render_markdown(matrix), encoding="utf-8")
    for line in matrix["unexplained_failures"]:
        print(f"warning: failing test no finding explains: {line}", file=sys.stderr)
    for name in matrix["implementations"]:
        print(f"{name}: FAIL cells by reach: {render.summary_text(matrix, name)}")
    print(f"wrote {MATRIX_JSON.relative_to(REPO)} and {MATRIX_MD.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
