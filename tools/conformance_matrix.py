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

Hypothesis does not shrink failing examples in these runs (``--shrink`` turns shrinking back on):
the module is also a pytest plugin (``-p tools.conformance_matrix``) that loads the suite's profile
without the shrink phase. Verdicts are the same (the derandomized examples are generated either way;
a failing clause fails whether or not its example is then minimised), and a library with many failing
properties runs in minutes instead of hours. Failure messages in the reports show unshrunk examples.

Only the standard library is imported at module level, so ``--describe NAME`` (used internally,
printing the adapter's metadata as JSON) runs in any environment that has ppo-ref.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
MATRIX_JSON = DOCS / "conformance-matrix.json"
MATRIX_MD = DOCS / "conformance-matrix.md"
FINDINGS = DOCS / "findings.md"
FINDINGS_FILES = (FINDINGS, DOCS / "findings-family.md")
REPORTS = REPO / "build" / "conformance-matrix"
ALL_NAMES = ("mine", "trl", "trl116", "verl", "openrlhf", "torchrl", "sb3", "skyrl", "rlinf", "swift")
"""ppo-ref, then the libraries: ``trl`` is TRL 1.12 (the last release with PPOTrainer), ``trl116`` TRL 1.16
(GRPOTrainer and RLOOTrainer: the family ops and the step tier)."""
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

MATCH = "matches undeclared convention"
"""The verdict of a clause whose failures a convention the adapter does not declare explains
(``conformance/inference.py``)."""

NO_SHRINK_PROFILE = "ppo-ref-matrix"
PLUGIN = "tools.conformance_matrix"

EDGE_CLAUSES = frozenset({"EDGE-1", "EDGE-2", "EDGE-3", "GAE-2", "RWD-3", "PG-6"})
"""The edge clauses (spec section 22; ``conformance.support.EDGE_CLAUSES`` names the input of each;
a test checks the two agree)."""


def clause_is_edge(clause: str) -> bool:
    return clause in EDGE_CLAUSES


ANCHOR = re.compile(r'<a id="([A-Za-z0-9_.-]+)"></a>')


# --- running the suite ----------------------------------------------------------------------------


def interpreter(name: str) -> Path:
    if name == "mine":
        venv = REPO / ".venv" / "bin" / "python"
        return venv if venv.exists() else Path(sys.executable)
    return REPO / ".envs" / name / "bin" / "python"


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TRL_EXPERIMENTAL_SILENCE"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    return env


def ensure_env(name: str, build: bool) -> float | None:
    """Seconds spent building ``.envs/NAME`` (None if it existed); SystemExit if missing and no build."""
    if interpreter(name).exists():
        return None
    if not build:
        raise SystemExit(
            f"{name}: no environment at .envs/{name}; build it with `python tools/thirdparty_envs.py {name}`"
        )
    print(f"[{name}] building .envs/{name} with tools/thirdparty_envs.py ...", flush=True)
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(REPO / "tools" / "thirdparty_envs.py"), name], cwd=REPO)
    if done.returncode != 0 or not interpreter(name).exists():
        raise SystemExit(f"{name}: building the environment failed (see .envs/logs/{name}.log)")
    return time.monotonic() - start


def suite_command(name: str, stem: Path, examples: int | None, shrink: bool = False) -> list[str]:
    command = [str(interpreter(name)), "-m", "pytest", "conformance/", "-q", "-p", "no:cacheprovider"]
    command += [] if shrink else ["-p", PLUGIN]
    command += [f"--impl={name}", f"--conformance-report={stem}"]
    return command + ([f"--conformance-examples={examples}"] if examples is not None else [])


def pytest_configure(config: Any) -> None:
    """As a pytest plugin: the suite's Hypothesis profile (registered by conformance/hooks.py, which
    the suite's plugin imports in its tryfirst pytest_configure, before this one) without the shrink
    and explain phases."""
    from hypothesis import Phase, settings

    base = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
    settings.register_profile(NO_SHRINK_PROFILE, base, phases=(Phase.explicit, Phase.reuse, Phase.generate))
    settings.load_profile(NO_SHRINK_PROFILE)


def run_suite(
    name: str,
    examples: int | None,
    reports: Path,
    build_seconds: float | None = None,
    shrink: bool = False,
    metadata: bool = True,
) -> dict[str, Any]:
    """Run the suite for ``name``; return its report plus wall time, exit code and metadata."""
    reports.mkdir(parents=True, exist_ok=True)
    stem = reports / name
    for suffix in (".json", ".md"):
        stem.with_suffix(suffix).unlink(missing_ok=True)
    # The command runs in the repository root: a relative report path keeps the machine's absolute
    # path out of the reports and of the matrix rendered from them.
    shown_stem = stem.resolve().relative_to(REPO) if stem.resolve().is_relative_to(REPO) else stem
    command = suite_command(name, shown_stem, examples, shrink)
    print(f"[{name}] {' '.join(command[1:])}", flush=True)
    start = time.monotonic()
    with open(reports / f"{name}.log", "w", encoding="utf-8") as log:
        done = subprocess.run(command, cwd=REPO, env=child_env(), stdout=log, stderr=subprocess.STDOUT)
    wall = time.monotonic() - start
    report_file = stem.with_suffix(".json")
    if done.returncode not in (0, 1) or not report_file.exists():
        raise SystemExit(
            f"{name}: pytest exited with {done.returncode} and no usable report; see {reports / name}.log"
        )
    report: dict[str, Any] = json.loads(report_file.read_text(encoding="utf-8"))
    report["wall_seconds"] = round(wall, 1)
    report["exit_code"] = done.returncode
    report["examples"] = examples
    report["env_build_seconds"] = None if build_seconds is None else round(build_seconds, 1)
    report["metadata"] = describe_in_env(name) if metadata else {}
    summary = ", ".join(f"{n} {v}" for v, n in report["summary"].items() if n)
    print(f"[{name}] {wall:.1f} s, exit {done.returncode}: {summary}", flush=True)
    if metadata:  # a --check run (no metadata) must not replace the reports the docs are rendered from
        (reports / f"{name}.run.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def describe_in_env(name: str) -> dict[str, Any]:
    command = [str(interpreter(name)), str(Path(__file__).resolve()), "--describe", name]
    done = subprocess.run(command, cwd=REPO, env=child_env(), capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-600:]}
    metadata: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return metadata


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


# --- findings ---------------------------------------------------------------------------------------

REACHES = (
    "trainer-path",
    "non-default",
    "metrics-only",
    "latent",
    "robustness",
    "convention",
    "adapter",
    "fixed",
)
"""A finding's reach, most severe first (docs/findings.md says what each means). ``fixed``: the
column's release no longer computes the wrong number (the entry records the release that did and the
fix); a fixed entry explains no FAIL cell, whatever its ``Explains:`` ids."""
FIXED = "fixed"
UNEXPLAINED = "unexplained"
"""The reach of a FAIL cell with a failing test that no finding explains: ranked above every reach."""
SEVERITY = (UNEXPLAINED, *REACHES, "unknown")

REPRO_SCRIPT = re.compile(r"findings/repro/[\w.-]+\.py")
"""A ``Reproduction:`` line's script: the training-path reproduction of the finding."""
CLAUSE_ID = re.compile(r"^(?:CONTRACT|[A-Z]+(?:-[A-Z]+)*-\d+[a-z]?)$")
HEADER = re.compile(
    r"^\s*(?:[-*]\s+)?(Implementations|Reach|Explains|Version|Reproduction|Upstream)\s*:\s*(.*)$", re.I
)


class Finding(NamedTuple):
    """One entry of a findings file: ``<a id="ID"></a>`` and its header lines.

    ``explains`` holds the evidence: test ids (``conformance/test_gae.py::test_x[p]``, or the part
    after ``::``), test functions (``test_x``: every parametrization), hand-case ids
    (``GAE-2/c8-skip-holes``, the bracket part of ``test_hand_case[...]``), ``*`` as a wildcard, or a
    clause id (``GAE-2``: every failing test of that clause, the coarsest evidence)."""

    id: str
    implementations: tuple[str, ...]
    reach: str
    explains: tuple[str, ...]
    source: str = "findings.md"
    version: str = ""
    reproduction: str = ""


def _split_items(text: str) -> list[str]:
    return [item.strip().strip("`").strip() for item in text.split(",") if item.strip().strip("`").strip()]


def _finding(fid: str, fields: Mapping[str, str], source: str) -> Finding:
    impls = tuple(_split_items(fields.get("implementations", ""))) or (fid.split("-", 1)[0],)
    reach = fields.get("reach", "").strip().strip("`").split()
    script = REPRO_SCRIPT.search(fields.get("reproduction", ""))
    return Finding(
        id=fid,
        implementations=impls,
        reach=reach[0] if reach and reach[0] in REACHES else "unknown",
        explains=tuple(_split_items(fields.get("explains", ""))),
        source=source,
        version=fields.get("version", "").strip(),
        reproduction=script.group(0) if script else "",
    )


def parse_findings(texts: Iterable[str | tuple[str, str]]) -> dict[str, Finding]:
    """Finding id -> Finding, from ``(file name, text)`` pairs (a bare text is ``findings.md``).

    An entry starts at ``<a id="ID"></a>`` and ends at the next anchor; its header lines are
    ``Implementations: trl`` (adapter names; default: the id's prefix), ``Reach: one of REACHES``,
    ``Explains: id, id, ...`` (continued on the following indented lines), and optionally
    ``Version:``, ``Reproduction:``, ``Upstream:``. An unknown reach is kept as ``unknown``."""
    found: dict[str, Finding] = {}
    for item in texts:
        source, text = ("findings.md", item) if isinstance(item, str) else item
        current: str | None = None
        fields: dict[str, str] = {}
        collecting: str | None = None

        for line in text.splitlines():
            anchor = ANCHOR.search(line)
            if anchor:
                if current is not None:
                    found[current] = _finding(current, fields, source)
                current, fields, collecting = anchor.group(1), {}, None
                continue
            if current is None:
                continue
            header = HEADER.match(line)
            if header and header.group(1).lower() not in fields:
                key = header.group(1).lower()
                fields[key] = header.group(2)
                collecting = key if key == "explains" else None
            elif collecting and line[:1].isspace() and line.strip():
                fields[collecting] += "," + line
            else:
                collecting = None
        if current is not None:
            found[current] = _finding(current, fields, source)
    return found


def _pattern(item: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in item.split("*")))


def _test_forms(test: str) -> list[str]:
    """The names a finding may use for a failing test id."""
    tail = test.split("::", 1)[-1]
    forms = [test, tail, tail.split("[", 1)[0]]
    if "[" in tail and tail.endswith("]"):
        forms.append(tail[tail.index("[") + 1 : -1])
    return forms


def explains(finding: Finding, impl: str, clause: str, test: str | None) -> bool:
    """Whether ``finding`` explains the failure of ``test`` (None: the clause failed without a test
    id) in the FAIL cell (``impl``, ``clause``)."""
    if impl not in finding.implementations or finding.reach == FIXED:
        return False
    for item in finding.explains:
        if CLAUSE_ID.match(item):
            if item == clause:
                return True
            continue
        if test is not None and any(_pattern(item).fullmatch(form) for form in _test_forms(test)):
            return True
    return False


def link_failures(
    impl: str, clause: str, failing_tests: Iterable[str], findings: Mapping[str, Finding]
) -> tuple[list[str], list[str]]:
    """(ids of the findings that explain at least one failing test, failing tests none explains).

    A FAIL cell without failing test ids (a contract failure) is explained only by a clause id."""
    tests: list[str | None] = list(failing_tests) or [None]
    linked: list[str] = []
    unexplained: list[str] = []
    for test in tests:
        hits = [f.id for f in findings.values() if explains(f, impl, clause, test)]
        if not hits:
            unexplained.append(test if test is not None else f"{clause} (no failing test id)")
        linked += [h for h in hits if h not in linked]
    order = list(findings)
    return sorted(linked, key=order.index), unexplained


def cell_reach(
    finding_ids: Iterable[str], unexplained: Iterable[str], findings: Mapping[str, Finding]
) -> str:
    """The most severe reach among the linked findings; ``unexplained`` when any failing test has no
    finding (SEVERITY gives the order)."""
    reaches = [findings[i].reach if i in findings else "unknown" for i in finding_ids]
    if list(unexplained) or not reaches:
        reaches.append(UNEXPLAINED)
    return min(reaches, key=SEVERITY.index)


def load_findings(paths: Iterable[Path]) -> dict[str, Finding]:
    """The findings of the files that exist, each linked by its own file name."""
    return parse_findings([(p.name, p.read_text(encoding="utf-8")) for p in paths if p.exists()])


# --- the matrix -------------------------------------------------------------------------------------

_SITE_PACKAGES = re.compile(r"(?<![\w.])(?:[A-Za-z]:)?/(?:[^\s/'\"()\[\]]+/)*?site-packages/")
_ABSOLUTE = re.compile(r"(?<![\w.:/])/(?:work|home|tmp|root|usr|opt|var|Users|private)/[^\s'\"()\]]*")


def scrub(value: Any) -> Any:
    """``value`` (JSON data) with machine paths taken out: the checkout becomes relative, a
    site-packages prefix becomes ``site-packages/``, any other absolute path ``<path>``."""
    if isinstance(value, str):
        text = value.replace(str(REPO) + "/", "").replace(str(REPO), ".")
        text = _SITE_PACKAGES.sub("site-packages/", text)
        return _ABSOLUTE.sub("<path>", text)
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items()}
    return value


def _column(report: Mapping[str, Any]) -> dict[str, Any]:
    impl = report["implementation"]
    metadata = report.get("metadata", {})
    return {
        "name": impl["name"],
        "version": impl["version"],
        "versions": metadata.get("versions", {}),
        "test_versions": metadata.get("test_versions", {}),
        "report_date": report["date"],
        "python": report["python"],
        "wall_seconds": report.get("wall_seconds"),
        "env_build_seconds": report.get("env_build_seconds"),
        "exit_code": report.get("exit_code"),
        "inference": report.get("inference", {}),
        "summary": report["summary"],
        "provenance": impl["provenance"],
        "ops": impl["ops"],
        "declared_conventions": impl["declared_conventions"],
        "convention_sources": metadata.get("convention_sources", {}),
        "not_provided": metadata.get("not_provided", {}),
        "contract_problems": impl["contract_problems"],
        "command": report["command"],
    }


def _link(cell: dict[str, Any], impl: str, clause: str, findings: Mapping[str, Finding]) -> None:
    """Fill a FAIL cell's findings, their reaches, its unexplained tests and its reach, in place."""
    ids, unexplained = link_failures(impl, clause, cell.get("failing_tests", []), findings)
    cell["findings"] = ids
    cell["finding_reach"] = {i: findings[i].reach for i in ids}
    cell["unexplained"] = unexplained
    cell["reach"] = cell_reach(ids, unexplained, findings)


def spec_kind(clause: str) -> str:
    """A row's kind as the spec states it (an adapter that declares an edge input has that edge
    clause as a value clause: its cell's ``kind`` says so)."""
    if clause.startswith("ROB-"):
        return "robustness"
    if clause == "CONTRACT":
        return "contract"
    return "edge" if clause in EDGE_CLAUSES else "value"


def _cell(entry: Mapping[str, Any], impl: str, findings: Mapping[str, Finding]) -> dict[str, Any]:
    verdict = entry["verdict"]
    cell: dict[str, Any] = {"verdict": verdict, "kind": entry.get("kind") or spec_kind(entry["id"])}
    if verdict == "fail":
        cell["failing_tests"] = list(entry.get("failing_tests", []))
        _link(cell, impl, entry["id"], findings)
        cell["detail"] = entry.get("first_failure", "")
    elif verdict == "declared convention":
        cell["conventions"] = [d.split("=", 1)[0] for d in entry.get("declared_conventions", [])]
    elif verdict == MATCH:  # issue 20: the suite inferred a convention the adapter does not declare
        cell["declarations"] = list(entry.get("undeclared_conventions", []))
    elif verdict in ("not provided", "not applicable", "not run"):
        cell["detail"] = "; ".join(entry.get("skip_reasons", []))
    return cell


def reach_counts(matrix: Mapping[str, Any], impl: str, kind: str = "value") -> dict[str, int]:
    """FAIL cells of ``impl`` of ``kind`` (the cell's: ``value`` takes the contract row too), by
    reach, in SEVERITY order (only the reaches that occur)."""
    counts = {reach: 0 for reach in SEVERITY}
    for row in matrix["clauses"]:
        cell = row["verdicts"].get(impl)
        cell_kind = (cell or {}).get("kind") or row.get("kind") or "value"
        if (cell_kind if cell_kind in ("edge", "robustness") else "value") != kind:
            continue
        if cell and cell["verdict"] == "fail":
            reach = cell.get("reach", "unknown")
            counts[reach if reach in counts else "unknown"] += 1
    return {reach: n for reach, n in counts.items() if n}


def build_matrix(
    reports: Mapping[str, Mapping[str, Any]],
    findings: Mapping[str, Finding],
    previous: Mapping[str, Any] | None = None,
    command: str = "python tools/conformance_matrix.py",
    examples: int | None = None,
) -> dict[str, Any]:
    """The matrix as a JSON-ready dict; columns not in ``reports`` are kept from ``previous`` and
    re-linked to the current findings (by the failing tests they stored)."""
    columns: dict[str, Any] = dict((previous or {}).get("columns", {}))
    rows: dict[str, dict[str, Any]] = {}
    for row in (previous or {}).get("clauses", []):
        rows[row["id"]] = {k: v for k, v in row.items() if k != "verdicts"}
        rows[row["id"]]["verdicts"] = {impl: dict(cell) for impl, cell in row["verdicts"].items()}
    for impl, report in reports.items():
        columns[impl] = _column(report)
        for row in rows.values():  # a clause the new run no longer has leaves this column
            row["verdicts"].pop(impl, None)
        for entry in report["clauses"]:
            row = rows.setdefault(entry["id"], {"id": entry["id"], "title": entry["title"], "verdicts": {}})
            row["title"] = entry["title"]
            row["kind"] = spec_kind(entry["id"])
            row["verdicts"][impl] = _cell(entry, impl, findings)
    for row in rows.values():  # re-link kept columns to the current findings
        for impl, cell in row["verdicts"].items():
            if cell["verdict"] == "fail" and impl not in reports:
                _link(cell, impl, row["id"], findings)
    rows = {k: v for k, v in rows.items() if v["verdicts"]}
    order = [n for n in ALL_NAMES if n in columns] + sorted(set(columns) - set(ALL_NAMES))
    first = next(iter(reports.values()), None)
    clause_order = [e["id"] for e in first["clauses"]] if first else list(rows)
    clause_order += [c for c in rows if c not in clause_order]
    unexplained = [
        f"{impl} {row['id']}: {test}"
        for row in (rows[c] for c in clause_order)
        for impl, cell in row["verdicts"].items()
        if cell["verdict"] == "fail"
        for test in cell.get("unexplained", [])
    ]
    linked = {
        i for row in rows.values() for cell in row["verdicts"].values() for i in cell.get("findings", [])
    }
    matrix = {
        "generated": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "examples": examples,
        "implementations": order,
        "columns": {name: columns[name] for name in order},
        "clauses": [rows[c] for c in clause_order],
        "reach_counts": {},
        "edge_reach_counts": {},
        "robustness_reach_counts": {},
        "unexplained_failures": unexplained,
        "findings": {
            f.id: {
                "implementations": list(f.implementations),
                "reach": f.reach,
                "source": f.source,
                "version": f.version,
                "reproduction": f.reproduction,
                "explains": list(f.explains),
                "linked": f.id in linked,
            }
            for f in findings.values()
        },
    }
    matrix["reach_counts"] = {name: reach_counts(matrix, name) for name in order}
    matrix["edge_reach_counts"] = {name: reach_counts(matrix, name, "edge") for name in order}
    matrix["robustness_reach_counts"] = {name: reach_counts(matrix, name, "robustness") for name in order}
    return dict(scrub(matrix))


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def render_cell(
    impl: str, clause: str, cell: Mapping[str, Any] | None, sources: Mapping[str, str] | None = None
) -> str:
    """One cell of the Markdown table; ``sources`` maps a finding id to the file it is in."""
    if cell is None:
        return "—"
    verdict = cell["verdict"]
    if verdict == "fail":
        ids = cell.get("findings", [])
        reach = cell.get("reach", "unknown")
        reaches = cell.get("finding_reach", {})
        links = [
            f"[{i}]({(sources or {}).get(i, 'findings.md')}#{i})"
            + (f" ({reaches[i]})" if len(set(reaches.values())) > 1 and i in reaches else "")
            for i in ids
        ]
        unexplained = len(cell.get("unexplained", []))
        if unexplained:
            links.append(f"{unexplained} failing test{'s' if unexplained > 1 else ''} no finding explains")
        kind = cell.get("kind")
        declared = (
            " [value: the adapter declares this edge input]"
            if kind == "value" and clause_is_edge(clause)
            else ""
        )
        return f"**FAIL** ({reach}){declared}: " + ", ".join(links)
    if verdict == "declared convention":
        keys = cell.get("conventions", [])
        links_text = ", ".join(f"[{k}](#{_slug(f'{impl}-convention-{k}')})" for k in keys)
        return f"declared convention ({links_text})" if links_text else "declared convention"
    if verdict == MATCH:
        declared = ", ".join(f"`{d.rstrip(',')}`" for d in cell.get("declarations", []))
        return f"*matches undeclared convention* ({declared})" if declared else f"*{MATCH}*"
    if verdict == "not provided":
        return f"[not provided](#{_slug(f'{impl}-not-provided-{clause}')})"
    return str(verdict)


def _counts_text(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{reach} {n}" for reach, n in counts.items()) or "none"


def _summary_text(matrix: Mapping[str, Any], name: str) -> str:
    value = _counts_text(matrix.get("reach_counts", {}).get(name, {}))
    edge = matrix.get("edge_reach_counts", {}).get(name, {})
    robust = matrix.get("robustness_reach_counts", {}).get(name, {})
    text = f"value clauses: {value}"
    text += f"; edge clauses: {_counts_text(edge)}" if edge else ""
    return text + (f"; robustness clauses: {_counts_text(robust)}" if robust else "")


def render_markdown(matrix: Mapping[str, Any]) -> str:
    names: list[str] = matrix["implementations"]
    columns = matrix["columns"]
    sources = {fid: f.get("source", "findings.md") for fid, f in matrix.get("findings", {}).items()}
    lines = [
        "# Conformance matrix",
        "",
        f"Generated {matrix['generated']} by `{matrix['command']}` (`tools/conformance_matrix.py`): "
        "`pytest conformance/ --impl=NAME` for each implementation, each library in its own environment "
        "(`docs/thirdparty-envs.md`). Rows are the clauses of `spec/SPEC.md`. **FAIL** (reach) links to "
        "the findings whose `Explains:` ids failed in this run (`findings.md`, `findings-family.md`); the "
        "reach in brackets is the most severe of theirs: *trainer-path* (the library's own training "
        "path computes the wrong number with default settings), *non-default* (only under a named "
        "non-default setting), *metrics-only* (logged statistics), *latent* (inputs the library's own "
        "pipeline never produces), *robustness* (only NaN/inf/garbage in masked-out slots or extreme "
        "magnitudes), *convention* / *adapter* (withdrawn: a legitimate design or an artefact of the "
        "adapter, pending the contract key or adapter fix; entries fixed in the column's release, reach "
        "*fixed*, link no cell), *unexplained* (a failing test no finding "
        "explains). *declared convention* means the clause passed against the reference variant for a "
        "convention the adapter declares (linked to its source below); *matches undeclared convention*: "
        "the clause failed against what the adapter declares and passes, every test of it, against the "
        "variant of a convention it does not declare (the declaration is given; the suite's inference, "
        "`conformance/inference.py`); *not provided*: the adapter "
        "cannot reach that op or capability in the library (reasons below); *not applicable*: no op of "
        "the adapter contract computes the clause.",
        "",
        "| Implementation | Versions | Test tools | Report | Suite wall time | Result "
        "| FAIL cells by kind (value, edge, robustness) and reach |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names:
        col = columns[name]
        versions = ", ".join(f"{d} {v}" for d, v in col.get("versions", {}).items()) or col["version"]
        tools = ", ".join(f"{d} {v}" for d, v in col.get("test_versions", {}).items()) or "?"
        summary = ", ".join(f"{n} {v}" for v, n in col["summary"].items() if n)
        wall = f"{col['wall_seconds']:.0f} s" if col.get("wall_seconds") is not None else "?"
        inference = col.get("inference") or {}
        if inference.get("reruns"):
            wall += f" (inference {inference['seconds']:.0f} s, {inference['reruns']} re-runs)"
        counts = _summary_text(matrix, name)
        lines.append(
            f"| `{name}` | {_md(versions)} | {_md(tools)} | {col['report_date']} | {wall} | {_md(summary)} "
            f"| {_md(counts)} |"
        )
    lines += ["", "| Clause | Title | " + " | ".join(f"`{n}`" for n in names) + " |"]
    lines.append("|---|---|" + "---|" * len(names))
    for row in matrix["clauses"]:
        cells = [render_cell(n, row["id"], row["verdicts"].get(n), sources) for n in names]
        kind = row.get("kind", "value")
        label = f"{row['id']} ({kind})" if kind in ("edge", "robustness") else row["id"]
        lines.append(f"| {label} | {_md(row['title'])} | " + " | ".join(_md(c) for c in cells) + " |")
    lines += [
        "",
        "## Failures by reach",
        "",
        "FAIL cells per implementation, by the most severe reach of the findings linked to each: value "
        "clauses (inputs that obey the adapter's declared input conventions) apart from the edge clauses "
        "(EDGE-*, GAE-2, RWD-3, PG-6: holes, rows without action tokens and -inf logits, unless the "
        "adapter declares its pipeline produces them; a cell marked [value] is one it declares) and the "
        "robustness clauses (ROB-*: NaN, inf and junk in masked-out slots whatever is declared).",
        "",
    ]
    for name in names:
        lines.append(f"- `{name}`: {_summary_text(matrix, name)}")
    if matrix.get("unexplained_failures"):
        lines += ["", "Failing tests no finding explains:", ""]
        lines += [f"- {_md(u)}" for u in matrix["unexplained_failures"]]
    unlinked = [fid for fid, f in matrix.get("findings", {}).items() if not f.get("linked")]
    if unlinked:
        lines += [
            "",
            "Findings none of whose `Explains:` ids failed in this run: "
            + ", ".join(
                f"[{fid}]({sources.get(fid, 'findings.md')}#{fid}) ({matrix['findings'][fid]['reach']})"
                for fid in unlinked
            ),
        ]
    lines += ["", "## Declared conventions and their sources", ""]
    for name in names:
        col = columns[name]
        if not col["declared_conventions"]:
            continue
        lines += [f"### {name}", ""]
        for key, value in col["declared_conventions"].items():
            source = col["convention_sources"].get(key, "(the adapter gives no source for this key)")
            anchor = _slug(f"{name}-convention-{key}")
            lines.append(f'- <a id="{anchor}"></a>`{key}={value}`: {_md(source)}')
        lines.append("")
    lines += ["## Not provided", ""]
    for name in names:
        reasons = columns[name]["not_provided"]
        clauses = [
            (row["id"], row["verdicts"][name].get("detail", ""))
            for row in matrix["clauses"]
            if row["verdicts"].get(name, {}).get("verdict") == "not provided"
        ]
        if not reasons and not clauses:
            continue
        lines += [f'### {name} <a id="{_slug(f"{name}-not-provided")}"></a>', ""]
        lines += [f"- op `{op}`: {_md(why)}" for op, why in reasons.items()]
        for clause, detail in clauses:
            anchor = _slug(f"{name}-not-provided-{clause}")
            lines.append(f'- <a id="{anchor}"></a>{clause}: {_md(detail)}')
        lines.append("")
    lines += ["## Provenance", ""]
    for name in names:
        col = columns[name]
        lines += [f"### {name}", "", _md(col["provenance"]), "", f"Command: `{_md(col['command'])}`", ""]
    return "\n".join(lines).rstrip() + "\n"


CHECKED = ("verdict", "kind", "reach", "findings", "unexplained")
"""What --check compares in every cell of the implementations it runs."""


def check_differences(
    committed: Mapping[str, Any],
    reports: Mapping[str, Mapping[str, Any]],
    findings: Mapping[str, Finding] | None = None,
) -> list[str]:
    """Cells of ``reports`` whose verdict, reach, linked findings or unexplained tests differ from the
    ``committed`` matrix (empty: none). Without ``findings`` only verdicts are compared."""
    rows = {row["id"]: row["verdicts"] for row in committed.get("clauses", [])}
    fresh = build_matrix(reports, findings or {}) if findings is not None else None
    fresh_rows = {row["id"]: row["verdicts"] for row in (fresh or {}).get("clauses", [])}
    keys = CHECKED if findings is not None else ("verdict",)
    differences = []
    for impl, report in reports.items():
        if impl not in committed.get("columns", {}):
            differences.append(f"{impl}: not in the committed matrix")
            continue
        seen = set()
        for entry in report["clauses"]:
            seen.add(entry["id"])
            before = rows.get(entry["id"], {}).get(impl, {})
            after = fresh_rows[entry["id"]][impl] if fresh is not None else {"verdict": entry["verdict"]}
            for key in keys:
                if key != "verdict" and (before.get("verdict") != "fail" or after.get("verdict") != "fail"):
                    continue
                if before.get(key) != after.get(key):
                    detail = ""
                    if key == "verdict" and entry["verdict"] == "fail":
                        detail = f" ({entry.get('first_failure', '')[:200]})"
                    was, now = before.get(key), after.get(key)
                    differences.append(f"{impl} {entry['id']}: {key} committed {was!r}, now {now!r}{detail}")
        for clause, verdicts in rows.items():
            if impl in verdicts and clause not in seen:
                differences.append(f"{impl} {clause}: in the committed matrix, not in this run")
    return differences


def verdict_differences(matrix: Mapping[str, Any], reports: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Per-clause verdicts of ``reports`` that differ from the committed ``matrix`` (empty: none)."""
    return check_differences(matrix, reports)


# --- command line -----------------------------------------------------------------------------------


def _load_reports(names: Iterable[str], reports: Path) -> dict[str, dict[str, Any]]:
    loaded = {}
    for name in names:
        path = reports / f"{name}.run.json"
        if not path.exists():
            raise SystemExit(f"{name}: no report at {path}; run `python tools/conformance_matrix.py {name}`")
        loaded[name] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help=f"implementations (default: {' '.join(ALL_NAMES)})")
    parser.add_argument(
        "--check", action="store_true", help="compare with the committed matrix, write nothing"
    )
    parser.add_argument("--render-only", action="store_true", help="rebuild the docs from the last reports")
    parser.add_argument("--no-build", action="store_true", help="do not build a missing environment")
    parser.add_argument("--shrink", action="store_true", help="let Hypothesis shrink failing examples (slow)")
    parser.add_argument("--examples", type=int, default=None, help="Hypothesis examples per property")
    parser.add_argument("--reports", type=Path, default=REPORTS, help=f"report directory (default {REPORTS})")
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
    names = args.names or list(ALL_NAMES)
    previous = json.loads(MATRIX_JSON.read_text(encoding="utf-8")) if MATRIX_JSON.exists() else None
    # --check compares like with like: the committed matrix's example count unless one is given.
    examples = (
        args.examples if args.examples is not None or not args.check else (previous or {}).get("examples")
    )
    unknown = [n for n in names if n not in ALL_NAMES]
    if unknown:
        parser.error(f"unknown implementations {unknown}; known: {', '.join(ALL_NAMES)}")
    if args.render_only:
        reports = _load_reports(names, args.reports)
    else:
        reports = {}
        for name in names:
            build_seconds = ensure_env(name, build=not args.no_build) if name != "mine" else None
            reports[name] = run_suite(
                name, examples, args.reports, build_seconds, args.shrink, metadata=not args.check
            )
    findings = load_findings(args.findings or list(FINDINGS_FILES))
    if args.check:
        differences = check_differences(previous or {}, reports, findings)
        for line in differences:
            print(f"DIFFERS: {line}", file=sys.stderr)
        print(f"check: {len(differences)} difference(s) from {MATRIX_JSON.relative_to(REPO)}")
        return 1 if differences else 0
    shown = " ".join(names) if args.names else ""
    command = f"python tools/conformance_matrix.py {shown}".strip()
    matrix = build_matrix(reports, findings, previous, command, examples)
    DOCS.mkdir(exist_ok=True)
    MATRIX_JSON.write_text(json.dumps(matrix, indent=2) + "\n", encoding="utf-8")
    MATRIX_MD.write_text(render_markdown(matrix), encoding="utf-8")
    for line in matrix["unexplained_failures"]:
        print(f"warning: failing test no finding explains: {line}", file=sys.stderr)
    for name in matrix["implementations"]:
        print(f"{name}: FAIL cells by reach: {_summary_text(matrix, name)}")
    print(f"wrote {MATRIX_JSON.relative_to(REPO)} and {MATRIX_MD.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
