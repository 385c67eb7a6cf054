#!/usr/bin/env python3
"""Run the conformance suite against ppo-ref and the third-party PPO libraries; publish the matrix.

    python tools/conformance_matrix.py                       # mine + all six libraries, back to back
    python tools/conformance_matrix.py trl torchrl sb3       # only these; the other columns are kept
    python tools/conformance_matrix.py --check mine torchrl  # CI: exit 1 if verdicts differ from the
                                                             # committed docs/conformance-matrix.json
    python tools/conformance_matrix.py --render-only         # rebuild the docs from the last reports

For each name it runs ``pytest conformance/ --impl=NAME --conformance-report=...`` with that
implementation's interpreter: ``mine`` in the main ``.venv``, a library in ``.envs/NAME/bin/python``
(built first with ``tools/thirdparty_envs.py NAME`` when missing, unless ``--no-build``). Reports and
logs go to ``build/conformance-matrix/``. Then it writes ``docs/conformance-matrix.json`` and
``docs/conformance-matrix.md``: clauses as rows, implementations as columns, every FAIL cell linked
to its entry in ``docs/findings.md`` and every declared-convention cell to its source citation.

Findings are matched to cells through the findings file itself: an entry starts with an anchor
``<a id="FINDING-ID"></a>`` and holds a line ``Matrix cells: trl GAE-2, trl IN-1``. A FAIL cell
without an entry is rendered "FAIL (no findings entry)" and listed on stderr.

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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
MATRIX_JSON = DOCS / "conformance-matrix.json"
MATRIX_MD = DOCS / "conformance-matrix.md"
FINDINGS = DOCS / "findings.md"
REPORTS = REPO / "build" / "conformance-matrix"
ALL_NAMES = ("mine", "trl", "verl", "openrlhf", "torchrl", "sb3", "skyrl")
DISTRIBUTIONS: Mapping[str, tuple[str, ...]] = {
    "mine": ("ppo-ref", "torch"),
    "trl": ("trl", "transformers", "torch"),
    "verl": ("verl", "tensordict", "torch"),
    "openrlhf": ("openrlhf", "deepspeed", "torch"),
    "torchrl": ("torchrl", "tensordict", "torch"),
    "sb3": ("stable-baselines3", "gymnasium", "torch"),
    "skyrl": ("skyrl-train", "torch"),
}
"""Distributions whose versions the matrix shows for each implementation."""

NO_SHRINK_PROFILE = "ppo-ref-matrix"
PLUGIN = "tools.conformance_matrix"

CELL_CLAUSE = re.compile(r"\b([a-z0-9_]+) (CONTRACT|[A-Z]+-\d+)\b")
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
    declared = getattr(adapter, "conventions", {}) or {}
    return {
        "versions": versions,
        "conventions": {key: describe_value(value) for key, value in declared.items()},
        "convention_sources": dict(getattr(adapter, "convention_sources", {}) or {}),
        "not_provided": dict(getattr(adapter, "not_provided", {}) or {}),
    }


# --- findings ---------------------------------------------------------------------------------------


def parse_findings(texts: Iterable[str]) -> dict[tuple[str, str], list[str]]:
    """(implementation, clause) -> finding ids, from ``<a id="ID"></a>`` anchors and their
    ``Matrix cells: impl CLAUSE, ...`` lines (a line may continue over the next lines)."""
    cells: dict[tuple[str, str], list[str]] = {}
    for text in texts:
        current: str | None = None
        collecting = False
        for line in text.splitlines():
            anchor = ANCHOR.search(line)
            if anchor:
                current, collecting = anchor.group(1), False
                continue
            if current is None:
                continue
            if line.strip().lower().startswith("matrix cells:"):
                collecting = True
                line = line.split(":", 1)[1]
            elif collecting and (not line.strip() or line.lstrip().startswith(("#", "```"))):
                collecting = False
            if collecting:
                for impl, clause in CELL_CLAUSE.findall(line):
                    ids = cells.setdefault((impl, clause), [])
                    if current not in ids:
                        ids.append(current)
    return cells


# --- the matrix -------------------------------------------------------------------------------------


def _column(report: Mapping[str, Any]) -> dict[str, Any]:
    impl = report["implementation"]
    metadata = report.get("metadata", {})
    return {
        "name": impl["name"],
        "version": impl["version"],
        "versions": metadata.get("versions", {}),
        "report_date": report["date"],
        "python": report["python"],
        "wall_seconds": report.get("wall_seconds"),
        "env_build_seconds": report.get("env_build_seconds"),
        "exit_code": report.get("exit_code"),
        "summary": report["summary"],
        "provenance": impl["provenance"],
        "ops": impl["ops"],
        "declared_conventions": impl["declared_conventions"],
        "convention_sources": metadata.get("convention_sources", {}),
        "not_provided": metadata.get("not_provided", {}),
        "contract_problems": impl["contract_problems"],
        "command": report["command"],
    }


def _cell(
    entry: Mapping[str, Any], impl: str, findings: Mapping[tuple[str, str], list[str]]
) -> dict[str, Any]:
    verdict = entry["verdict"]
    cell: dict[str, Any] = {"verdict": verdict}
    if verdict == "fail":
        cell["findings"] = findings.get((impl, entry["id"]), [])
        cell["detail"] = entry.get("first_failure", "")
    elif verdict == "declared convention":
        cell["conventions"] = [d.split("=", 1)[0] for d in entry.get("declared_conventions", [])]
    elif verdict in ("not provided", "not applicable", "not run"):
        cell["detail"] = "; ".join(entry.get("skip_reasons", []))
    return cell


def build_matrix(
    reports: Mapping[str, Mapping[str, Any]],
    findings: Mapping[tuple[str, str], list[str]],
    previous: Mapping[str, Any] | None = None,
    command: str = "python tools/conformance_matrix.py",
    examples: int | None = None,
) -> dict[str, Any]:
    """The matrix as a JSON-ready dict; columns not in ``reports`` are kept from ``previous``."""
    columns: dict[str, Any] = dict((previous or {}).get("columns", {}))
    rows: dict[str, dict[str, Any]] = {
        row["id"]: {"id": row["id"], "title": row["title"], "verdicts": dict(row["verdicts"])}
        for row in (previous or {}).get("clauses", [])
    }
    for impl, report in reports.items():
        columns[impl] = _column(report)
        for entry in report["clauses"]:
            row = rows.setdefault(entry["id"], {"id": entry["id"], "title": entry["title"], "verdicts": {}})
            row["title"] = entry["title"]
            row["verdicts"][impl] = _cell(entry, impl, findings)
    for row in rows.values():  # re-link kept columns to the current findings
        for impl, cell in row["verdicts"].items():
            if cell["verdict"] == "fail":
                cell["findings"] = findings.get((impl, row["id"]), [])
    order = [n for n in ALL_NAMES if n in columns] + sorted(set(columns) - set(ALL_NAMES))
    first = next(iter(reports.values()), None)
    clause_order = [e["id"] for e in first["clauses"]] if first else list(rows)
    clause_order += [c for c in rows if c not in clause_order]
    unexplained = [
        f"{impl} {row['id']}"
        for row in (rows[c] for c in clause_order)
        for impl, cell in row["verdicts"].items()
        if cell["verdict"] == "fail" and not cell["findings"]
    ]
    return {
        "generated": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "examples": examples,
        "implementations": order,
        "columns": {name: columns[name] for name in order},
        "clauses": [rows[c] for c in clause_order],
        "unexplained_failures": unexplained,
    }


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def render_cell(
    impl: str, clause: str, cell: Mapping[str, Any] | None, findings_link: str = "findings.md"
) -> str:
    if cell is None:
        return "—"
    verdict = cell["verdict"]
    if verdict == "fail":
        ids = cell.get("findings", [])
        if not ids:
            return "**FAIL** (no findings entry)"
        return "**FAIL**: " + ", ".join(f"[{i}]({findings_link}#{i})" for i in ids)
    if verdict == "declared convention":
        keys = cell.get("conventions", [])
        links = ", ".join(f"[{k}](#{_slug(f'{impl}-convention-{k}')})" for k in keys)
        return f"declared convention ({links})" if links else "declared convention"
    if verdict == "not provided":
        return f"[not provided](#{_slug(f'{impl}-not-provided-{clause}')})"
    return str(verdict)


def render_markdown(matrix: Mapping[str, Any]) -> str:
    names: list[str] = matrix["implementations"]
    columns = matrix["columns"]
    lines = [
        "# Conformance matrix",
        "",
        f"Generated {matrix['generated']} by `{matrix['command']}` (`tools/conformance_matrix.py`): "
        "`pytest conformance/ --impl=NAME` for each implementation, each library in its own environment "
        "(`docs/thirdparty-envs.md`). Rows are the clauses of `spec/SPEC.md`. **FAIL** links to the "
        "finding in `findings.md`; *declared convention* means the clause passed against the reference "
        "variant for a convention the adapter declares (linked to its source below); *not provided*: the "
        "adapter cannot reach that op or capability in the library (reasons below); *not applicable*: no "
        "op of the adapter contract computes the clause.",
        "",
        "| Implementation | Versions | Report | Suite wall time | Result |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        col = columns[name]
        versions = ", ".join(f"{d} {v}" for d, v in col.get("versions", {}).items()) or col["version"]
        summary = ", ".join(f"{n} {v}" for v, n in col["summary"].items() if n)
        wall = f"{col['wall_seconds']:.0f} s" if col.get("wall_seconds") is not None else "?"
        lines.append(f"| `{name}` | {_md(versions)} | {col['report_date']} | {wall} | {_md(summary)} |")
    lines += ["", "| Clause | Title | " + " | ".join(f"`{n}`" for n in names) + " |"]
    lines.append("|---|---|" + "---|" * len(names))
    for row in matrix["clauses"]:
        cells = [render_cell(n, row["id"], row["verdicts"].get(n)) for n in names]
        lines.append(f"| {row['id']} | {_md(row['title'])} | " + " | ".join(_md(c) for c in cells) + " |")
    if matrix.get("unexplained_failures"):
        lines += ["", "FAIL cells without a findings entry: " + ", ".join(matrix["unexplained_failures"])]
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


def verdict_differences(matrix: Mapping[str, Any], reports: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Per-clause verdicts of ``reports`` that differ from the committed ``matrix`` (empty: none)."""
    committed = {row["id"]: row["verdicts"] for row in matrix.get("clauses", [])}
    differences = []
    for impl, report in reports.items():
        if impl not in matrix.get("columns", {}):
            differences.append(f"{impl}: not in the committed matrix")
            continue
        seen = set()
        for entry in report["clauses"]:
            seen.add(entry["id"])
            before = committed.get(entry["id"], {}).get(impl, {}).get("verdict")
            if before != entry["verdict"]:
                detail = f" ({entry['first_failure'][:200]})" if entry["verdict"] == "fail" else ""
                differences.append(
                    f"{impl} {entry['id']}: committed {before!r}, now {entry['verdict']!r}{detail}"
                )
        for clause, verdicts in committed.items():
            if impl in verdicts and clause not in seen:
                differences.append(f"{impl} {clause}: in the committed matrix, not in this run")
    return differences


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
        "--findings", type=Path, action="append", help=f"findings file(s) to link (default {FINDINGS})"
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
    if args.check:
        differences = verdict_differences(previous or {}, reports)
        for line in differences:
            print(f"DIFFERS: {line}", file=sys.stderr)
        print(f"check: {len(differences)} difference(s) from {MATRIX_JSON.relative_to(REPO)}")
        return 1 if differences else 0
    finding_files = args.findings or [FINDINGS]
    texts = [f.read_text(encoding="utf-8") for f in finding_files if f.exists()]
    shown = " ".join(names) if args.names else ""
    command = f"python tools/conformance_matrix.py {shown}".strip()
    matrix = build_matrix(reports, parse_findings(texts), previous, command, examples)
    DOCS.mkdir(exist_ok=True)
    MATRIX_JSON.write_text(json.dumps(matrix, indent=2) + "\n", encoding="utf-8")
    MATRIX_MD.write_text(render_markdown(matrix), encoding="utf-8")
    for cell in matrix["unexplained_failures"]:
        print(f"warning: FAIL without a findings entry: {cell}", file=sys.stderr)
    print(f"wrote {MATRIX_JSON.relative_to(REPO)} and {MATRIX_MD.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
