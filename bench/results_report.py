"""The sections of ``bench/RESULTS.md``, each rendered from the raw data of the run that measured
it (``bench/results/*.json``); :mod:`bench.results_document` puts them together with the notes of
``bench/RESULTS-notes.md``. Every number comes from the data handed in.

This module renders the sections about a run as a whole (its setting, the targets of issue 6, the
conformance timing, how it is measured) and re-exports the others, so it is the one place the
document takes every section from: the trainer (:mod:`bench.results_trainer`), the primitives and
memory (:mod:`bench.results_primitives`), GRPO (:mod:`bench.results_grpo`), the thread policy
(:mod:`bench.results_threads`) and the sampler modes (:mod:`bench.results_sampler`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.results_format import met, mib
from bench.results_grpo import (
    GRPO_TARGET,
    grpo_met,
    grpo_results,
    grpo_run_overhead_lines,
    grpo_section,
    grpo_summary,
)
from bench.results_primitives import adapter_versions, memory_lines, primitive_table, primitives_lines
from bench.results_sampler import SAMPLER_TARGETS, sampler_lines
from bench.results_threads import THREAD_ROLES, THREAD_TARGETS, thread_policy_lines
from bench.results_trainer import overhead_lines, profile_lines, summary_line, trainer_lines, trainer_summary

__all__ = [
    "GRPO_TARGET",
    "LARGE_GROUPS",
    "SAMPLER_TARGETS",
    "TARGETS",
    "THREAD_ROLES",
    "THREAD_TARGETS",
    "conformance_lines",
    "grpo_met",
    "grpo_results",
    "grpo_run_overhead_lines",
    "grpo_section",
    "grpo_summary",
    "memory_lines",
    "method_lines",
    "overhead_lines",
    "primitive_table",
    "primitives_lines",
    "profile_lines",
    "sampler_lines",
    "setting_lines",
    "summary_line",
    "targets_lines",
    "thread_policy_lines",
    "trainer_lines",
    "trainer_summary",
]

LARGE_GROUPS = (
    "gae B256 T2048",
    "policy_loss B256 T2048",
    "masked_whiten B256 T2048",
    "token_logprobs B4 L512 V150k",
)
TARGETS = {"trainer_ratio": 2.0, "overhead": 1.10, "primitive_ratio": 1.10, "logprobs_memory": 1.2}


def setting_lines(run: dict[str, Any], results_dir: Path) -> list[str]:
    """Machine, load, threads and versions of one ``tools/run_bench.py`` run, as a bullet list."""
    lines: list[str] = []
    add = lines.append
    machine = run["machine"]
    add(
        f"- Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, "
        f"{machine['platform']}, Python {machine['python']}."
    )
    loads = [
        ("start", run.get("loadavg_start")),
        ("after the trainer comparison", run.get("loadavg_after_trainer")),
        ("after the GRPO comparison", run.get("loadavg_after_grpo")),
        ("after the primitives", run.get("loadavg_after_primitives")),
        ("after the family ops", run.get("loadavg_after_family")),
        ("after the thread policy", run.get("loadavg_after_threads")),
        ("end", run.get("loadavg_end")),
    ]
    add(
        "- Load average (1, 5, 15 min): "
        + "; ".join(f"{label} {' / '.join(f'{x:.1f}' for x in value)}" for label, value in loads if value)
        + ". The machine is shared with other jobs: absolute times vary several-fold between minutes; "
        "only ratios measured side by side in this run are meaningful."
    )
    policy = run["omp_wait_policy"] or "(unset)"
    add(
        f"- Every process: {run.get('threads', 2)} torch threads, `OMP_WAIT_POLICY={policy}`. With the "
        "default (spinning) policy, two-thread ops on cores busy with other jobs wait for descheduled "
        "threads: a tiny GPT-2 forward took 0.15-1.0 s instead of 0.03 s, and TRL's iterations 5-10x "
        "longer than ppo-ref's, which says more about the machine than about either trainer."
    )
    if "trainer" in run:
        info = run["trainer"]["info"]
        versions = {
            **info["ppo_ref"]["versions"],
            **{f"TRL env {k}": v for k, v in info["trl"]["versions"].items()},
        }
        add("- Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".")
    if "primitives" in run:
        add(
            "- Adapters in the primitive benchmarks: "
            + ", ".join(f"{k} {v}" for k, v in adapter_versions(results_dir, run["primitives"]).items())
            + "."
        )
    return lines


def conformance_lines(run: dict[str, Any]) -> list[str]:
    c = run["conformance"]
    return [
        "## Conformance suite against `mine`",
        "",
        f"`{c['command']}`: {c['wall_seconds']:.1f} s wall ({c['summary']}).",
        "",
    ]


def targets_lines(
    trainer_run: dict[str, Any] | None,
    primitives_run: dict[str, Any] | None,
    memory_run: dict[str, Any] | None,
    results_dir: Path,
) -> list[str]:
    """The targets of issue 6 (the runs that measured the trainer, the primitives and the memory:
    one run, or the latest run of each)."""
    lines: list[str] = []
    add = lines.append
    trainer = trainer_summary(trainer_run["trainer"]) if trainer_run else None
    add("## Targets (issue 6)")
    add("")
    add("| target | measured in this run | |")
    add("|---|---|---|")
    if trainer:
        add(
            f"| trainer >= {TARGETS['trainer_ratio']:.1f}x TRL's iterations/s | {trainer['ratio']:.2f}x "
            f"(median of {len(trainer['ratios'])} per-round ratios; ratio of medians "
            f"{trainer['ratio_of_medians']:.2f}x). TRL's own iteration is {trainer['trl_over_bare']:.2f}x "
            "the bare compute in the same rounds: no loop that does this model work can exceed that ratio "
            f"here | {met(trainer['ratio'] >= TARGETS['trainer_ratio'])} |"
        )
        add(
            f"| trainer peak memory <= TRL's | {mib(trainer['peak_ours'])} vs {mib(trainer['peak_trl'])} "
            f"(peak RSS of each process) | {met(trainer['peak_ours'] <= trainer['peak_trl'])} |"
        )
        add(
            f"| overhead <= {TARGETS['overhead']:.2f}x bare compute | {trainer['overhead']:.2f}x (median of "
            f"per-round ratios) | {met(trainer['overhead'] <= TARGETS['overhead'])} |"
        )
    if primitives_run:
        table = primitive_table(results_dir, primitives_run["primitives"])
        for group in LARGE_GROUPS:
            row = table.get(group, {})
            others = {k: v["median"] for k, v in row.items() if k != "mine"}
            if "mine" not in row or not others:
                add(
                    f"| {group}: within {TARGETS['primitive_ratio']:.1f}x of the fastest third party | no "
                    "third-party equivalent measured | n/a |"
                )
                continue
            fastest = min(others, key=lambda k: others[k])
            ratio = row["mine"]["median"] / others[fastest]
            add(
                f"| {group}: within {TARGETS['primitive_ratio']:.1f}x of the fastest third party | "
                f"{ratio:.2f}x of {fastest} (median {row['mine']['median'] * 1e3:.2f} vs "
                f"{others[fastest] * 1e3:.2f} ms) | {met(ratio <= TARGETS['primitive_ratio'])} |"
            )
    if memory_run:
        for entry in memory_run["memory"]:
            if entry.get("impl") == "mine" and "extra_over_logits" in entry:
                value = entry["extra_over_logits"]
                add(
                    f"| token_logprobs V={entry['vocab'] // 1000}k peak extra memory <= "
                    f"{TARGETS['logprobs_memory']:.1f}x logits | {value:.3f}x "
                    f"({mib(entry['extra_peak_bytes'])} over {mib(entry['logits_bytes'])}) | "
                    f"{met(value <= TARGETS['logprobs_memory'])} |"
                )
    add("")
    return lines


def method_lines() -> list[str]:
    lines: list[str] = []
    add = lines.append
    add("## How it is measured")
    add("")
    add(
        "- Each trainer runs in its own long-lived process; `train()` runs in a background thread that "
        "pauses at each iteration boundary (ppo-ref: entry of `collect_rollout`; TRL: a `TrainerCallback` "
        "at `on_step_end`), so one timed step is exactly one iteration of the library's own loop, its "
        "logging, checks and TRL's per-iteration `gc.collect()` calls included. The coordinator alternates "
        "blocks of iterations between the two processes and reports the median of the per-round ratios, so "
        "load from other jobs hits both alike."
    )
    add(
        "- Bare compute: `bench/ppo_ref_side.py::BareCompute` on copies of the trainer's models: the "
        "trainer's sampler (`ppo_ref.trainer.generation.generate`), the policy/reference/critic/reward "
        "forwards, and 16 steps of policy+critic forward, a plain clipped loss, backward and fused AdamW; "
        "nothing else."
    )
    add(
        "- Primitives: `pytest bench/test_primitives.py --bench-impl=NAME` in each library's environment "
        "(`.envs/NAME`), one after the other; the raw JSON is in `bench/results/`."
    )
    add(
        "- Peak memory: `ru_maxrss` of each trainer process (the trainer's process runs nothing else); "
        "token_logprobs: see its section."
    )
    add("")
    return lines
