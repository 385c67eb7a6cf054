"""The section of ``bench/RESULTS.md`` on the ppo-ref command's thread policy, idle and beside a
two-thread job, rendered from ``bench/thread_policy.py``'s JSON."""

from __future__ import annotations

from typing import Any

from bench import thread_policy
from bench.results_format import met

__all__ = ["THREAD_ROLES", "THREAD_TARGETS", "thread_policy_lines"]


THREAD_TARGETS = {"loaded_over_idle": 2.0, "idle_over_two_spinning_idle": 1.10}
"""Issue 24, part 2, for the command's own policy: beside a two-thread job within 2x of idle, and
idle no more than 10% slower than the command before the policy (two spinning threads)."""
THREAD_ROLES = {
    "default": "the command as typed: its own policy",
    "two-spinning": "the command before the policy",
    "two-passive": "two threads with the wait policy the benchmarks set",
    "two-spin-10k": "two threads that spin briefly, then sleep",
}


def _policy_flags(policy: str) -> str:
    flags, env = thread_policy.POLICIES.get(policy, ([], {}))
    parts = [f"`{' '.join(flags)}`"] if flags else []
    parts += [f"`{k}={v}`" for k, v in env.items()]
    return ", ".join(parts) or "none"


def _bound(cell: str, lower: bool, stopped: int) -> str:
    """A median cell, marked a lower bound with its count of stopped runs where any was stopped."""
    return f">= {cell} ({stopped} stopped)" if lower else cell


def thread_policy_lines(data: dict[str, Any] | None) -> list[str]:
    """The ``ppo-ref`` command's default run under each thread policy, idle and beside a two-thread
    CPU-bound job (``bench/thread_policy.py``'s JSON; a placeholder without it)."""
    lines = ["## The ppo-ref command's thread policy: idle and beside a two-thread job", ""]
    add = lines.append
    if data is None:
        add(
            "Not measured yet: `python bench/thread_policy.py` writes `bench/results/thread-policy.json` "
            "(`python tools/run_bench.py` runs it with the other benchmarks)."
        )
        add("")
        return lines
    summary = thread_policy.summarise(data)
    rounds = len(data["times"]["default"]["idle"])
    loads = [load[0] for load in data["loadavg"]]
    if data.get("quick"):
        add(
            "**A `--quick` run (one iteration per command): it checks the pipeline; these are not the "
            "policy's figures.**"
        )
        add("")
    add(
        "`ppo-ref train` at the README's defaults (what `./dev train` runs; wall time of the whole "
        "command, task build included) under each policy, idle and beside a two-thread CPU-bound job "
        "(another process multiplying 512x512 float32 matrices on two torch threads with OpenMP's "
        f"spinning wait), in {rounds} interleaved round{'s' if rounds != 1 else ''}; medians over the "
        f"rounds. {data['cpu']}, {data['cores']} cores; load average (1 min) at the start {loads[0]:.1f}, "
        "after each round "
        + ", ".join(f"{x:.1f}" for x in loads[1:])
        + "."
        + (
            f" A run still going after {data['limit']:g} s was stopped and counted at that limit: a cell "
            "marked >= holds a lower bound (stopped runs in brackets)."
            if "limit" in data
            else ""
        )
    )
    add("")
    add(
        "| policy | flags, environment | idle s | beside the job s | beside / idle "
        "| idle / two-spinning idle |"
    )
    add("|---|---|---|---|---|---|")
    base_stopped = summary.get("two-spinning", {}).get("idle_stopped", 0)
    for policy, row in summary.items():
        role = THREAD_ROLES.get(policy)
        idle_low, loaded_low = row["idle_stopped"] > 0, row["loaded_stopped"] > 0
        idle_cell = _bound(f"{row['idle_s']:.1f}", idle_low, int(row["idle_stopped"]))
        loaded_cell = _bound(f"{row['loaded_s']:.1f}", loaded_low, int(row["loaded_stopped"]))
        ratio = f"{row['loaded_over_idle']:.2f}x"
        ratio = (
            ratio if not (loaded_low or idle_low) else (f">= {ratio}" if not idle_low else f"{ratio} (n/a)")
        )
        versus = f"{row['idle_over_two_spinning_idle']:.2f}x"
        versus = versus if not (idle_low or base_stopped) else f"{versus} (n/a)"
        add(
            f"| `{policy}`{f' ({role})' if role else ''} | {_policy_flags(policy)} | {idle_cell} | "
            f"{loaded_cell} | {ratio} | {versus} |"
        )
    add("")
    if "default" in summary:
        mine = summary["default"]
        loaded, idle = mine["loaded_over_idle"], mine["idle_over_two_spinning_idle"]
        if mine["idle_stopped"] or mine["loaded_stopped"] or summary["two-spinning"]["idle_stopped"]:
            add("Targets (issue 24) for `default`: not judged, a run it rests on was stopped at the limit.")
            add("")
            return lines
        add(
            f"Targets (issue 24) for `default`: beside the job within "
            f"{THREAD_TARGETS['loaded_over_idle']:.0f}x of idle: {loaded:.2f}x "
            f"({met(loaded <= THREAD_TARGETS['loaded_over_idle'])}); idle no more than "
            f"{(THREAD_TARGETS['idle_over_two_spinning_idle'] - 1) * 100:.0f}% slower than the command "
            f"before the policy (`two-spinning` idle): {idle:.2f}x "
            f"({met(idle <= THREAD_TARGETS['idle_over_two_spinning_idle'])})."
        )
        add("")
    return lines
