"""The sections of ``bench/RESULTS.md`` on the PPO trainer against TRL 1.12's PPOTrainer: the
file's first line, the iteration's seconds and per-round ratios, its overhead over the bare compute
and the profile of a few iterations, each rendered from the run's ``trainer`` data."""

from __future__ import annotations

import statistics
from typing import Any

from bench.results_format import mib, quantile

__all__ = ["overhead_lines", "profile_lines", "summary_line", "trainer_lines", "trainer_summary"]


def trainer_summary(trainer: dict[str, Any]) -> dict[str, Any]:
    rounds = trainer["rounds"]
    ours = [x for r in rounds for x in r["ppo_ref"]]
    trl = [x for r in rounds for x in r["trl"]]
    ratios = [r["ratio_trl_over_ppo_ref"] for r in rounds]
    overheads = [r["overhead"] for r in rounds]
    bare = {
        k: statistics.median(r["bare"][k] for r in rounds) for k in ("generate", "forwards", "update", "bare")
    }
    info = trainer["info"]
    return {
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "ratio_of_medians": statistics.median(trl) / statistics.median(ours),
        "ratio_of_minima": min(trl) / min(ours),
        "ours": ours,
        "trl": trl,
        "overhead": statistics.median(overheads),
        "overheads": overheads,
        "bare": bare,
        "peak_ours": trainer.get("peak_rss_trainer_only", info["ppo_ref"]["peak_rss_bytes"]),
        "trl_over_bare": statistics.median(r["trl_over_bare"] for r in rounds),
        "ratio_of_minima_overhead": min(ours) / min(r["bare"]["bare"] for r in rounds),
        "peak_trl": info["trl"]["peak_rss_bytes"],
        "stages": info["ppo_ref"].get("stage_seconds_median", {}),
    }


def summary_line(trainer_run: dict[str, Any] | None) -> str:
    """The file's first line: the PPO trainer's ratio to TRL 1.12 (``n/a`` without that run)."""
    if trainer_run is None:
        return "Trainer vs TRL 1.12 PPOTrainer: not measured in this file"
    ratio = trainer_summary(trainer_run["trainer"])["ratio"]
    return f"Trainer vs TRL 1.12 PPOTrainer: {ratio:.2f}x iterations/s (same settings, same run)"


def trainer_lines(run: dict[str, Any]) -> list[str]:
    """The PPO iteration against TRL 1.12's PPOTrainer: settings, seconds, per-round ratios."""
    lines: list[str] = []
    add = lines.append
    t = trainer_summary(run["trainer"])
    tokens = 64 * 32
    add("## Trainer: one PPO iteration, ppo-ref against TRL 1.12's PPOTrainer")
    add("")
    add(
        "Settings (`bench/tiny_ppo.py`, those of issue 6): four separate "
        "random-init `GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=64, vocab_size=64)` models "
        "(policy, frozen reference, value, reward), dropout 0, float32; PAD and EOS outside the "
        "vocabulary, so every response has 32 tokens; 640 fixed random 8-token prompts; batch 64; "
        "temperature 1; 4 epochs x 4 minibatches of 16; no gradient accumulation or clipping; fused AdamW "
        "lr 3e-4, weight decay 0; KL 0.05 (k1), clip 0.2, value clip 0.2, vf_coef 0.1, gamma 1, lambda "
        "0.95. ppo-ref runs `PPOTrainer.train()` itself with every runtime check and metric on (step-0 "
        "log-prob check, reference fingerprint, non-finite guards, metrics.jsonl, rollouts.jsonl audit, "
        "TensorBoard, progress bar); TRL runs its own `train()` with `num_sample_generations=0`, "
        "`bf16=False`, `gradient_checkpointing=False`."
    )
    add("")
    r = run["trainer"]
    add(
        f"{len(r['rounds'])} rounds, each {r['block']} iterations of one trainer, the bare compute once, "
        f"then {r['block']} iterations of the other trainer (which goes first alternates), after "
        f"{len(r['warmup_seconds']['ppo_ref'])} warm-up iterations each."
    )
    add("")
    add("| | ppo-ref | TRL 1.12 |")
    add("|---|---|---|")
    add(
        f"| seconds per iteration, median (IQR) of {len(t['ours'])} | {statistics.median(t['ours']):.3f} "
        f"({quantile(t['ours'], 0.25):.3f}-{quantile(t['ours'], 0.75):.3f}) | "
        f"{statistics.median(t['trl']):.3f} "
        f"({quantile(t['trl'], 0.25):.3f}-{quantile(t['trl'], 0.75):.3f}) |"
    )
    add(f"| fastest iteration | {min(t['ours']):.3f} | {min(t['trl']):.3f} |")
    add(
        f"| response tokens per second (median) | {tokens / statistics.median(t['ours']):.0f} | "
        f"{tokens / statistics.median(t['trl']):.0f} |"
    )
    add(f"| peak RSS of the process | {mib(t['peak_ours'])} | {mib(t['peak_trl'])} |")
    add("")
    add(
        "Per-round ratios (TRL seconds / ppo-ref seconds): "
        + ", ".join(f"{x:.2f}" for x in t["ratios"])
        + f". Median {t['ratio']:.2f}x; ratio of the overall medians {t['ratio_of_medians']:.2f}x; "
        f"ratio of the fastest iterations {t['ratio_of_minima']:.2f}x."
    )
    add("")
    return lines


def overhead_lines(run: dict[str, Any]) -> list[str]:
    """The PPO iteration over its bare compute in the same rounds, and ppo-ref's stage seconds."""
    lines: list[str] = []
    add = lines.append
    t = trainer_summary(run["trainer"])
    add("### Overhead over the bare compute")
    add("")
    b = t["bare"]
    add(
        "Bare compute, timed in ppo-ref's process between its blocks of iterations, with copies of the "
        f"same models and the same sampler, once per round (medians): generation {b['generate']:.3f} s, the "
        f"four no-grad forwards {b['forwards']:.3f} s, the 16 minibatch forward/backward/AdamW steps "
        f"{b['update']:.3f} s; sum {b['bare']:.3f} s. ppo-ref's iteration over it, per round: "
        + ", ".join(f"{x:.2f}" for x in t["overheads"])
        + f"; median **{t['overhead']:.2f}x** (fastest iteration over fastest bare sum: "
        f"{t['ratio_of_minima_overhead']:.2f}x). TRL's iteration over the same bare compute: "
        f"{t['trl_over_bare']:.2f}x (median per round), which bounds the trainer ratio any loop doing this "
        "model work could reach in this run."
    )
    add("")
    rounds = run["trainer"]["rounds"]
    if all("overhead_cpu" in r for r in rounds):
        cpu = [r["overhead_cpu"] for r in rounds]
        add(
            f"In process CPU seconds (the load of other jobs disturbs them less): "
            f"{', '.join(f'{x:.2f}' for x in cpu)}; median **{statistics.median(cpu):.2f}x** (target <= "
            f"1.05, issue 12); TRL 1.12 / ppo-ref in CPU seconds: median "
            f"{statistics.median(r['ratio_cpu'] for r in rounds):.2f}x."
        )
        add("")
    stages = t["stages"]
    if stages:
        add(
            "ppo-ref's own per-stage seconds (metrics.jsonl, median over the timed iterations) beside the "
            "bare work:"
        )
        add("")
        add("| stage | ppo-ref | bare |")
        add("|---|---|---|")
        pairs = [
            ("seconds_generate", "generate"),
            ("seconds_forward", "forwards"),
            ("seconds_update", "update"),
        ]
        shown = set()
        for stage, part in pairs:
            if stage in stages:
                add(f"| {stage} | {stages[stage]:.3f} | {b[part]:.3f} |")
                shown.add(stage)
        for stage, value in stages.items():
            # seconds_iteration is left out: the trainer's own clock also counts the stepper's pause.
            if stage not in shown and stage != "seconds_iteration":
                add(f"| {stage} | {value:.3f} | |")
        add("")
    return lines


def profile_lines(run: dict[str, Any]) -> list[str]:
    """The cProfile of a few ppo-ref iterations (none if the run has no profile)."""
    lines: list[str] = []
    add = lines.append
    profile = run["trainer"].get("profile")
    if profile:
        add(
            f"### Profile of ppo-ref's iteration (cProfile, {profile['iterations']} iterations, self "
            "seconds per iteration)"
        )
        add("")
        add("cProfile slows Python-heavy code; read the shares, not the totals.")
        add("")
        add("| where | self s / iteration |")
        add("|---|---|")
        for area, seconds in profile["self_seconds_per_iteration_by_area"].items():
            add(f"| {area} | {seconds:.3f} |")
        add("")
        add("| function | self s | cumulative s | calls / iteration |")
        add("|---|---|---|---|")
        for row in profile["top_self_seconds_per_iteration"][:15]:
            add(f"| `{row['function']}` | {row['self_s']:.4f} | {row['cumulative_s']:.4f} | {row['calls']} |")
        add("")
    return lines
