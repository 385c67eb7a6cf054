"""The PPO-family benchmark's Markdown: the ``bench/RESULTS.md`` section of one or more reports.

A report is what :func:`bench.family.compare.compare` returns (``bench/results/family*.json``);
:mod:`bench.results_document` puts the section into the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

LABELS = ("mine", "verl", "verl-loop", "openrlhf", "skyrl", "trl116")
TARGET = 1.1
"""Issue 14's target: ppo-ref within 1.1x of the fastest library."""


def _ratio_cell(result: dict[str, Any], metric: str) -> str:
    ratio = result.get(f"ratio_{metric}")
    if not ratio:
        return "-"
    return f"{ratio['median']:.2f} vs {ratio['fastest']} ({ratio['min']:.2f}-{ratio['max']:.2f})"


def table(reports: list[dict[str, Any]]) -> str:
    """Markdown table of the first report's median milliseconds (wall), and mine / fastest library
    per report in process CPU time and in wall time (median of the per-round ratios, min-max in
    brackets). The verdict reads the CPU-time ratios: met when every run's median is within 1.1."""
    first = reports[0]
    runs = []
    for i in range(len(reports)):
        runs += [f"run {i + 1}: mine / fastest, CPU time", f"run {i + 1}: wall time"]
    lines = [
        "| op / variant / pass | " + " | ".join(LABELS) + " | " + " | ".join(runs) + " | target 1.1x |",
        "|---|" + "---|" * (len(LABELS) + len(runs) + 1),
    ]
    for key, result in first["results"].items():
        cells = [
            f"{result['impls'][label]['median_ms']:.2f}" if label in result["impls"] else "-"
            for label in LABELS
        ]
        ratios = []
        for report in reports:
            other = report["results"].get(key, {})
            ratios += [_ratio_cell(other, "cpu"), _ratio_cell(other, "wall")]
        medians = [
            r["results"][key]["ratio_cpu"]["median"]
            for r in reports
            if "ratio_cpu" in r["results"].get(key, {})
        ]
        verdict = "-" if not medians else ("met" if max(medians) <= TARGET else "**missed**")
        lines.append(f"| {key} | " + " | ".join(cells) + " | " + " | ".join(ratios) + f" | {verdict} |")
    return "\n".join(lines)


def section(reports: list[dict[str, Any]], notes: Sequence[str] = ()) -> str:
    """The RESULTS.md section for one or more :func:`compare` reports (the first gives the times);
    ``notes`` (markdown list items, from ``bench/RESULTS-notes.md``) go at the end of its list."""
    first = reports[0]
    shapes = first["shapes"]
    runs = []
    for i, report in enumerate(reports):
        load = report["load"]
        runs.append(
            f"run {i + 1} {report['when']} ({report.get('commit', '?')}), {report['rounds']} rounds, "
            f"{report['seconds']:.0f} s, load average (1/5/15 min) at the start "
            f"{'/'.join(f'{v:.1f}' for v in load['start'])}, at "
            f"the end {'/'.join(f'{v:.1f}' for v in load['end'])}"
            + (
                ", `--malloc-keep` (glibc keeps freed memory: no page faults for fresh temporaries)"
                if report.get("malloc_keep")
                else ""
            )
        )
    differences: dict[str, float] = {}
    for result in first["results"].values():
        for label, check in result["checks"].items():
            differences[label] = max([differences.get(label, 0.0), *check.values()])
    lines = [
        "## PPO-family ops at large shapes, side by side (issue 14, part 4)",
        "",
        "`python bench/family_side.py --compare --rounds "
        f"{first['rounds']} --write-results` (from `.venv`; each "
        "library in its own `.envs/NAME`, one long-lived worker process per implementation, "
        f"{first['threads']} torch threads, `OMP_WAIT_POLICY={first['omp_wait_policy']}`). Raw data: "
        "`bench/results/family*.json`. Group advantages: B = "
        f"{shapes['group_rows']:,} scores in groups of "
        f"{shapes['group_size']}; the rest: B = {shapes['rows']}, "
        f"T = {shapes['steps']}, right padding (each row keeps "
        "T/2 to T tokens). `fwd` runs without autograd, "
        "`fwd+bwd` builds the graph and calls `backward()`. Each round times a block of calls of every "
        "implementation, in an order that alternates between rounds; the ratio is ppo-ref's median over the "
        "fastest library's median in the same round, and the "
        "table gives the median over the rounds (min-max). "
        "Milliseconds are run 1's medians over all its calls. The machine (2 cores) was shared with other "
        "jobs throughout: absolute times vary several-fold; only the ratios within a round compare.",
        "",
        *[f"- {line}" for line in runs],
        f"- {first['machine']}, torch {first['torch']}.",
        "- What each side calls (arguments converted once, "
        "outside the timed call; ppo-ref gets bool masks and "
        "(B,) group ids, the libraries float masks, width-1 token rewards with a numpy index, per-token "
        "advantages for the sequence losses): verl 0.9.1 `compute_grpo_vectorized_outcome_advantage`, "
        "`compute_rloo_vectorized_outcome_advantage` (`verl-loop`: `compute_grpo_outcome_advantage` and "
        "`compute_rloo_outcome_advantage`, the ones the "
        "`grpo`/`rloo` estimator names select), `agg_loss`, the "
        "registered `vanilla`/`gspo`/`cispo` policy losses with an `ActorConfig`, `kl_penalty` + `agg_loss`, "
        "`compute_rollout_correction_weights` (its metrics "
        "included); OpenRLHF 0.11.2 the pinned group block of "
        "`compute_advantages_and_returns` (equal contiguous groups "
        "only), `PolicyLoss` (ppo with `dual_clip`, gspo), "
        "`aggregate_loss`, `compute_approx_kl` + `aggregate_loss`; skyrl 0.4.0 "
        "`compute_grpo_outcome_advantage`, `compute_rloo_outcome_advantage`, "
        "`apply_loss_reduction_to_advantages_minibatch` + `reduce_loss` (a masked sum: its losses no longer "
        "reduce, the trainer scales the advantages), the registered `dual_clip`/`gspo`/`cispo` losses after "
        "that scaling, `compute_approx_kl` + the worker's sequence mean (with its gradient since 0.4.0; "
        "0.3.1's was `@torch.no_grad`, SkyRL #1340); TRL 1.16 GRPOTrainer's pinned group block (its losses "
        "are inline in "
        "`_compute_loss` and not benchmarked). A `-` is an "
        "op the library has no function for (OpenRLHF's and "
        "skyrl's rollout corrections live inside their policy losses).",
        "- Same numbers: every case's value (and gradient) minus ppo-ref's under the library's conventions "
        "(epsilon, aggregation), largest over the cases: "
        + ", ".join(f"{label} {diff:.1e}" for label, diff in sorted(differences.items()))
        + ".",
    ]
    lines += notes
    lines.append(
        "- Where ppo-ref misses the target, and why: `bench/PERF-NOTES.md`, section "
        '"PPO-family ops (issue 14)".'
    )
    if first["skipped"]:
        lines.append("- Not run: " + "; ".join(f"{k} ({v})" for k, v in first["skipped"].items()) + ".")
    lines += ["", table(reports)]
    return "\n".join(lines) + "\n"
