"""The section of ``bench/RESULTS.md`` on the critic-free iteration: ppo-ref's ``grpo`` against TRL
1.16's GRPOTrainer, every repeat of each beta merged, and its target (:func:`grpo_met`); rendered
from the run's ``grpo`` data."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from bench.results_format import met, mib, quantile

__all__ = [
    "GRPO_TARGET",
    "grpo_met",
    "grpo_results",
    "grpo_run_overhead_lines",
    "grpo_section",
    "grpo_summary",
]


GRPO_TARGET = 1.15


def grpo_summary(result: dict[str, Any]) -> dict[str, Any]:
    """Medians and per-round ratios of one beta's GRPO comparison (``run["grpo"][i]``)."""
    rounds = result["rounds"]
    ours = [x for r in rounds for x in r["ppo_ref"]]
    trl = [x for r in rounds for x in r["trl"]]
    per_round = [r["ratio_trl_over_ppo_ref"] for r in rounds]
    over_bare = [r["ppo_ref_over_bare"] for r in rounds]
    over_bare_own = [r["ppo_ref_over_bare_own"] for r in rounds]
    trl_over_bare = [r["trl_over_bare"] for r in rounds]
    bare_parts = {
        key: statistics.median(r["bare"][key] for r in rounds)
        for key in ("generate", "generate_own", "reference", "update", "bare", "bare_own")
    }
    info = result["info"]
    return {
        "beta": result["beta"],
        "ours_median": statistics.median(ours),
        "ours_iqr": (quantile(ours, 0.25), quantile(ours, 0.75)),
        "trl_median": statistics.median(trl),
        "trl_iqr": (quantile(trl, 0.25), quantile(trl, 0.75)),
        "ratio": statistics.median(per_round),
        "per_round": per_round,
        "over_bare": statistics.median(over_bare),
        "over_bare_own": statistics.median(over_bare_own),
        "trl_over_bare": statistics.median(trl_over_bare),
        "bare": bare_parts,
        "rss_ours": info["ppo_ref"]["peak_rss_bytes"],
        "rss_trl": info["trl"]["peak_rss_bytes"],
        "rss_bare": info["bare"]["peak_rss_bytes"],
        "stages": info["ppo_ref"].get("stage_seconds_median", {}),
        "loads": [r["loadavg_1min"] for r in rounds],
        **{
            key: statistics.median(r[key] for r in rounds) if all(key in r for r in rounds) else math.nan
            for key in (
                "ratio_cpu",
                "ppo_ref_over_bare_cpu",
                "ppo_ref_over_bare_own_cpu",
                "trl_over_bare_cpu",
            )
        },
    }


def _merge_repeats(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per beta: the rounds of every repeat together, the last repeat's process info, and
    each repeat's median per-round ratios (wall and CPU seconds) as ``repeat_ratios``."""
    merged: dict[float, dict[str, Any]] = {}
    for entry in entries:
        into = merged.setdefault(entry["beta"], {**entry, "rounds": [], "repeat_ratios": []})
        into["rounds"] = into["rounds"] + entry["rounds"]
        previous = into["info"]
        into["info"] = {
            role: {**info, "peak_rss_bytes": max(info["peak_rss_bytes"], previous[role]["peak_rss_bytes"])}
            for role, info in entry["info"].items()
        }
        into["repeat_ratios"].append(
            (
                statistics.median(r["ratio_trl_over_ppo_ref"] for r in entry["rounds"]),
                statistics.median(r.get("ratio_cpu", math.nan) for r in entry["rounds"]),
                statistics.median(r.get("ppo_ref_over_bare_cpu", math.nan) for r in entry["rounds"]),
            )
        )
    return list(merged.values())


def grpo_results(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One :func:`grpo_summary` per beta over every repeat of ``run``, with ``repeat_ratios``."""
    return [{**grpo_summary(r), "repeat_ratios": r["repeat_ratios"]} for r in _merge_repeats(run["grpo"])]


def grpo_met(result: dict[str, Any]) -> bool:
    """The GRPO target, met only if every repeat's median and the CPU-seconds median reach it: one
    noisy median over a loaded machine's rounds is not a measurement of the target."""
    every_repeat = min(a for a, _, _ in result["repeat_ratios"]) >= GRPO_TARGET
    return bool(every_repeat and result["ratio_cpu"] >= GRPO_TARGET)


def grpo_section(run: dict[str, Any]) -> list[str]:
    """The markdown of the GRPO comparison of ``run`` (every figure from that run)."""
    merged = _merge_repeats(run["grpo"])
    results = grpo_results(run)
    machine = run["machine"]
    first = run["grpo"][0]["info"]
    trl_info = first["trl"]
    lines = ["## Critic-free iteration: ppo-ref's `grpo` against TRL 1.16's GRPOTrainer", ""]
    add = lines.append
    add(
        f"Produced by `{run['command']}` on {run['date_utc']} (commit {machine['git_commit']}"
        f"{', with uncommitted changes' if machine['git_worktree_dirty'] else ''}); raw data in "
        "`bench/results/run*.json` (`grpo`). Load average (1 min) during the rounds: "
        + ", ".join(f"beta {r['beta']:g} {min(r['loads']):.1f}-{max(r['loads']):.1f}" for r in results)
        + f"; at the start {run['loadavg_start'][0]:.1f}, at the end {run['loadavg_end'][0]:.1f}."
    )
    add("")
    add(
        "Settings (`bench/tiny_grpo.py`): one random-init `GPT2Config(n_layer=2, n_head=2, n_embd=64, "
        "n_positions=64, vocab_size=64)`, dropout 0, float32; PAD (0) and EOS (1) in the vocabulary, so "
        "responses end at their first EOS, up to 32 new tokens; 8 fixed 8-token prompts x 8 responses "
        "(group size 8, 64 per iteration); temperature 1; one epoch, one optimizer step over one "
        "micro-batch of 64; clip 0.2; token-mean loss (TRL's `dapo`); fused AdamW lr 1e-4, weight decay 0, "
        "no gradient clipping; KL to the initial policy as a k3 loss term with coefficient beta; reward: "
        "the fraction of `t5` tokens. ppo-ref runs `PPOTrainer.train()` with `--advantage-estimator grpo "
        "--group-size 8 --kl-in loss` and every runtime check and metric on (step-0 log-prob check, "
        "reference fingerprint, non-finite guards, metrics.jsonl, rollouts.jsonl audit, TensorBoard, "
        "progress bar). TRL runs its own `train()`; the settings it reported back: "
        + ", ".join(f"`{k}={v}`" for k, v in trl_info.get("settings", {}).items())
        + "."
    )
    add("")
    add(
        "Versions: ppo-ref side "
        + ", ".join(f"{k} {v}" for k, v in first["ppo_ref"].get("versions", {}).items())
        + "; TRL side "
        + ", ".join(f"{k} {v}" for k, v in trl_info.get("versions", {}).items())
        + "."
    )
    add("")
    add(
        "Three processes (ppo-ref's trainer, TRL's trainer, the bare model work), "
        f"{len(merged[0]['repeat_ratios'])} repeats per beta (fresh processes each), each "
        f"{len(run['grpo'][0]['rounds'])} rounds of {run['grpo'][0]['block']} iterations per process after "
        f"{run['settings']['warmup']} warm-up iterations; the order of the three rotates every round; "
        "medians below are over all rounds of all repeats. Wall-clock ratios are the target's measure; on "
        "a machine this loaded they scatter widely, so the same ratios in process CPU seconds (every "
        "thread of the process; the load of other jobs disturbs them less) are given beside them. Peak "
        "memory: `ru_maxrss` of each process (each runs nothing else; imports included; the largest repeat)."
    )
    add("")
    add("| | " + " | ".join(f"beta = {r['beta']:g}" for r in results) + " |")
    add("|---|" + "---|" * len(results))
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        (
            "ppo-ref s/iteration, median (IQR)",
            lambda r: f"{r['ours_median']:.3f} ({r['ours_iqr'][0]:.3f}-{r['ours_iqr'][1]:.3f})",
        ),
        (
            "TRL 1.16 s/iteration, median (IQR)",
            lambda r: f"{r['trl_median']:.3f} ({r['trl_iqr'][0]:.3f}-{r['trl_iqr'][1]:.3f})",
        ),
        (
            f"**TRL / ppo-ref** (iterations/s; median of per-round ratios; target >= {GRPO_TARGET} in "
            "every repeat and in CPU seconds)",
            lambda r: f"**{r['ratio']:.2f}x** ({met(grpo_met(r))})",
        ),
        ("per-round ratios", lambda r: ", ".join(f"{x:.2f}" for x in r["per_round"])),
        (
            "each repeat's median: TRL / ppo-ref wall; CPU; ppo-ref / bare CPU",
            lambda r: " / ".join(f"{a:.2f}; {b:.2f}; {c:.2f}" for a, b, c in r["repeat_ratios"]),
        ),
        (
            "peak RSS ppo-ref / TRL (target <=)",
            lambda r: f"{mib(r['rss_ours'])} / {mib(r['rss_trl'])} ({met(r['rss_ours'] <= r['rss_trl'])})",
        ),
        (
            "bare compute s: generate (`model.generate`) + reference + update",
            lambda r: (
                f"{r['bare']['bare']:.3f} = {r['bare']['generate']:.3f} + {r['bare']['reference']:.3f} "
                f"+ {r['bare']['update']:.3f}"
            ),
        ),
        ("ppo-ref's sampler on the same prompts, s", lambda r: f"{r['bare']['generate_own']:.3f}"),
        ("ppo-ref / bare (with `model.generate`)", lambda r: f"{r['over_bare']:.2f}x"),
        ("ppo-ref / bare (with ppo-ref's sampler)", lambda r: f"{r['over_bare_own']:.2f}x"),
        ("TRL / bare (with `model.generate`)", lambda r: f"{r['trl_over_bare']:.2f}x"),
        (
            "CPU seconds: TRL / ppo-ref; ppo-ref / bare (`model.generate`; own sampler); TRL / bare",
            lambda r: (
                f"{r['ratio_cpu']:.2f}x; {r['ppo_ref_over_bare_cpu']:.2f}x; "
                f"{r['ppo_ref_over_bare_own_cpu']:.2f}x; {r['trl_over_bare_cpu']:.2f}x"
            ),
        ),
        ("peak RSS of the bare process", lambda r: mib(r["rss_bare"])),
    ]
    for label, cell in rows:
        add(f"| {label} | " + " | ".join(cell(r) for r in results) + " |")
    add("")
    stage_keys = sorted({k for r in results for k in r["stages"] if k != "seconds_iteration"})
    if stage_keys:
        add("ppo-ref's own stage seconds (metrics.jsonl, medians of the timed iterations):")
        add("")
        add("| stage | " + " | ".join(f"beta = {r['beta']:g}" for r in results) + " |")
        add("|---|" + "---|" * len(results))
        for key in stage_keys:
            add(f"| {key} | " + " | ".join(f"{r['stages'].get(key, math.nan):.3f}" for r in results) + " |")
        add("")
    return lines


def grpo_run_overhead_lines(run: dict[str, Any]) -> list[str]:
    """The PPO iteration's overhead over its bare compute in a run whose trainer comparison is not
    the one the trainer section shows (e.g. ``--only trainer grpo``): one fact, kept beside the GRPO
    figures it was measured with."""
    rounds = run["trainer"]["rounds"]
    wall = [r["overhead"] for r in rounds]
    cpu = [r["overhead_cpu"] for r in rounds if "overhead_cpu" in r]
    ratio = [r["ratio_trl_over_ppo_ref"] for r in rounds]
    ratio_cpu = [r["ratio_cpu"] for r in rounds if "ratio_cpu" in r]
    loads = [r["loadavg_1min"] for r in rounds]
    lines = [
        "",
        f"### PPO iteration over its bare compute (`{run['command']}`, {run['date_utc']})",
        "",
        f"{len(rounds)} rounds (load average {min(loads):.1f}-{max(loads):.1f}); per-round overhead "
        f"(wall): {', '.join(f'{x:.2f}' for x in wall)}; median **{statistics.median(wall):.2f}x**.",
    ]
    if cpu:
        lines.append(
            f"In process CPU seconds: {', '.join(f'{x:.2f}' for x in cpu)}; median "
            f"**{statistics.median(cpu):.2f}x** (target <= 1.05)."
        )
    lines.append(
        f"TRL 1.12 / ppo-ref in the same rounds: median {statistics.median(ratio):.2f}x (wall)"
        + (f", {statistics.median(ratio_cpu):.2f}x (CPU seconds)." if ratio_cpu else ".")
    )
    return lines
