"""The sections of ``bench/RESULTS.md`` on the primitives (pytest-benchmark, each library in its
own environment) and on token_logprobs' peak memory, rendered from the run's ``primitives`` and
``memory`` data."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bench.results_format import mib

__all__ = ["adapter_versions", "memory_lines", "primitive_table", "primitives_lines"]


def primitive_table(results_dir: Path, primitives: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """group -> impl -> {median, min} in seconds: the better median (and minimum) over the passes."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for impl, entry in primitives.items():
        for name in entry["json"]:
            path = results_dir / name
            if not path.exists():
                continue
            for bench in json.loads(path.read_text())["benchmarks"]:
                stats = bench["stats"]
                cell = table.setdefault(bench["group"], {}).setdefault(
                    impl, {"median": math.inf, "min": math.inf}
                )
                cell["median"] = min(cell["median"], stats["median"])
                cell["min"] = min(cell["min"], stats["min"])
    return table


def adapter_versions(results_dir: Path, primitives: dict[str, Any]) -> dict[str, str]:
    versions = {}
    for impl, entry in primitives.items():
        path = results_dir / entry["json"][0]
        if path.exists():
            benches = json.loads(path.read_text())["benchmarks"]
            if benches:
                versions[impl] = str(benches[0]["extra_info"].get("version"))
    return versions


def primitives_lines(run: dict[str, Any], results_dir: Path) -> list[str]:
    lines: list[str] = []
    add = lines.append
    table = primitive_table(results_dir, run["primitives"])
    impls = list(run["primitives"])
    add("## Primitives (pytest-benchmark, each library in its own environment, back to back)")
    add("")
    add(
        "Median milliseconds per call (warm-up call excluded), through each library's adapter "
        "(`bench/test_primitives.py`; `policy_loss` includes the backward pass). `mine` is ppo-ref's "
        "public, validating function. Every implementation ran once through all shapes, then the large "
        "shapes (B256 T2048, V150k) twice more, in the reverse order and then in the first order; each "
        "cell is the best median over the passes (the machine's load changes within seconds). Ratio: "
        "`mine` over the fastest third party (by median; by minimum in brackets)."
    )
    add("")
    add("| op and shape | " + " | ".join(impls) + " | mine / fastest |")
    add("|---|" + "---|" * (len(impls) + 1))
    for group in sorted(table):
        row = table[group]
        cells = [f"{row[i]['median'] * 1e3:.2f}" if i in row else "-" for i in impls]
        others = {k: v for k, v in row.items() if k != "mine"}
        if "mine" in row and others:
            fastest = min(others, key=lambda k: others[k]["median"])
            fastest_min = min(v["min"] for v in others.values())
            ratio = (
                f"{row['mine']['median'] / others[fastest]['median']:.2f} vs {fastest} "
                f"({row['mine']['min'] / fastest_min:.2f})"
            )
        else:
            ratio = "no third-party equivalent"
        add(f"| {group} | " + " | ".join(cells) + f" | {ratio} |")
    failed = {k: v["summary"] for k, v in run["primitives"].items() if v["returncode"] != 0}
    if failed:
        add("")
        add(
            "Runs that failed: "
            + "; ".join(f"{k}: {v}" for k, v in failed.items())
            + " (logs in the run's temporary log directory, printed by run_bench)."
        )
    add("")
    return lines


def memory_lines(run: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    add = lines.append
    add("## token_logprobs peak memory (B = 4, L = 512)")
    add("")
    add(
        "One fresh process per measurement (`bench/logprobs_memory.py`): the RSS high-water mark is reset "
        "after the logits are allocated and the op has run once on a small input; extra = new high-water "
        "mark minus the RSS before the call. Adapter-level work (slicing, temperature scaling) is included."
    )
    add("")
    add("| impl | V | logits | extra peak | extra / logits |")
    add("|---|---|---|---|---|")
    for e in run["memory"]:
        if "extra_over_logits" in e:
            add(
                f"| {e['impl']} | {e['vocab']} | {mib(e['logits_bytes'])} | {mib(e['extra_peak_bytes'])} "
                f"| {e['extra_over_logits']:.3f} |"
            )
        else:
            add(f"| {e['impl']} | {e['vocab']} | | | {e.get('skipped') or 'failed'} |")
    add("")
    return lines
