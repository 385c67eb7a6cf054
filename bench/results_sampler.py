"""The section of ``bench/RESULTS.md`` on the sampler modes (issue 26): the compiled decode against
``model.generate``, the GRPO iteration with it against TRL 1.16, the floor each target meets, and
the SmolLM2-135M preset's iteration, rendered from ``bench/sampler_compare.py``'s JSON; the PPO
target's floor comes from the trainer section's data of the same file."""

from __future__ import annotations

import statistics
from typing import Any

from bench.results_format import met, mib
from bench.results_trainer import trainer_summary

__all__ = ["SAMPLER_TARGETS", "sampler_lines", "sampler_summary"]

SAMPLER_TARGETS = {"grpo": 1.5, "ppo": 2.0, "smollm2": 0.5}
"""Issue 26: the GRPO iteration with the compiled decode >= 1.5x TRL 1.16's iterations per second at
both betas, the PPO iteration >= 2.0x TRL 1.12's, the SmolLM2-135M iteration at most half of
today's (and peak memory <= TRL's)."""


def sampler_summary(beta_run: dict[str, Any]) -> dict[str, Any]:
    """One beta's figures: medians of the iterations and decodes over its rounds, the per-round ratios,
    the compile cost, the peak RSS of each trainer and the floor."""
    rounds = beta_run["rounds"]
    decode = {k: statistics.median([r["decode"][k] for r in rounds]) for k in rounds[0]["decode"]}
    ready = beta_run["ready"]
    return {
        "beta": beta_run["beta"],
        "seconds": {
            k: statistics.median([x for r in rounds for x in r[k]])
            for k in ("dynamic", "static-compiled", "trl")
        },
        "ratios": [r["trl_over_static_compiled"] for r in rounds],
        "ratio": beta_run["median_ratios"]["trl_over_static_compiled"],
        "ratio_dynamic": beta_run["median_ratios"]["trl_over_dynamic"],
        "decode": decode,
        "compile_seconds": ready["decode"]["first_call_seconds"]["static-compiled"]
        - decode["static-compiled"],
        "build_seconds": {k: ready[k]["build_seconds"] for k in ("dynamic", "static-compiled")},
        "peak": {k: ready[k]["peak_rss_bytes"] for k in ("dynamic", "static-compiled", "trl")},
        "same_tokens": ready["decode"]["same_tokens_as_dynamic"],
        "floor": beta_run["floor"],
    }


def _smollm2_lines(runs: dict[str, Any]) -> list[str]:
    lines = [
        "SmolLM2-135M-Instruct (`smollm2-sentiment`, 16 responses of up to 32 tokens per iteration, PPO "
        "with a critic, 2 epochs x 2 minibatches): the command as a user types it, once per mode, each in "
        "a fresh process with a cold inductor cache and the command's own thread policy; `"
        + runs["dynamic"]["command"]
        + "`.",
        "",
        "| | " + " | ".join(f"`{mode}`" for mode in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    steady = {mode: run["iterations"][1:] or run["iterations"] for mode, run in runs.items()}

    def row(label: str, cell: Any) -> None:
        lines.append(f"| {label} | " + " | ".join(cell(mode) for mode in runs) + " |")

    row(
        "the whole command, s (model load, both evaluations, compiles included)",
        lambda m: f"{runs[m]['wall_seconds']:.0f}",
    )
    row("first iteration, s", lambda m: f"{runs[m]['iterations'][0]['seconds_iteration']:.1f}")
    for key, label in (
        ("seconds_iteration", "later iterations, s (median)"),
        ("seconds_generate", "of which generation"),
        ("seconds_forward", "of which the no-grad forwards"),
        ("seconds_update", "of which the update"),
    ):
        row(label, lambda m, key=key: f"{statistics.median([it[key] for it in steady[m]]):.1f}")
    row("peak RSS", lambda m: mib(runs[m]["peak_rss_bytes"]))
    lines.append("")
    if "dynamic" in runs and "static-compiled" in runs:
        before = statistics.median([it["seconds_iteration"] for it in steady["dynamic"]])
        after = statistics.median([it["seconds_iteration"] for it in steady["static-compiled"]])
        floor = statistics.median(
            [it["seconds_forward"] + it["seconds_update"] for it in steady["static-compiled"]]
        )
        target = SAMPLER_TARGETS["smollm2"] * before
        lines.append(
            f"Target (issue 26): the iteration halved, at most {target:.1f} s: `static-compiled` takes "
            f"{after:.1f} s, {after / before:.2f}x of `dynamic`'s {before:.1f} s "
            f"({met(after <= target)}). Its forwards and update alone take {floor:.1f} s"
            + (
                ", above the target: no decode, however fast, halves this iteration."
                if floor > target
                else "."
            )
        )
        lines.append("")
    return lines


def _ppo_lines(trainer_run: dict[str, Any] | None) -> list[str]:
    if trainer_run is None or "trainer" not in trainer_run:
        return ["PPO against TRL 1.12: no trainer comparison in this file's data.", ""]
    t = trainer_summary(trainer_run["trainer"])
    trl = statistics.median(t["trl"])
    stages = t["stages"]
    rest = stages.get("seconds_forward", 0.0) + stages.get("seconds_update", 0.0)
    target = SAMPLER_TARGETS["ppo"]
    return [
        f"PPO against TRL 1.12 (the trainer section's run, the default `dynamic` sampler): TRL's median "
        f"iteration is {trl:.3f} s, so {target:.1f}x asks for at most {trl / target:.3f} s; ppo-ref's "
        f"no-grad forwards and update stages alone take {stages.get('seconds_forward', 0.0):.3f} + "
        f"{stages.get('seconds_update', 0.0):.3f} = {rest:.3f} s (generation "
        f"{stages.get('seconds_generate', 0.0):.3f} s): with a decode of no time at all the iteration "
        f"would be {trl / rest:.2f}x TRL's, "
        + ("so the target is out of reach of any sampler." if trl / rest < target else "within reach."),
        "",
    ]


def sampler_lines(data: dict[str, Any] | None, trainer_run: dict[str, Any] | None) -> list[str]:
    """The sampler section (a placeholder without its JSON)."""
    lines = ["## Sampler modes: the compiled decode against `model.generate` and TRL (issue 26)", ""]
    add = lines.append
    if data is None:
        add(
            "Not measured yet: `python bench/sampler_compare.py` writes `bench/results/sampler.json` "
            "(`python tools/run_bench.py` runs it with the other benchmarks)."
        )
        add("")
        return lines
    runs = [sampler_summary(run) for run in data["betas"]]
    settings = data["settings"]
    loads = [load[0] for load in data["loadavg"]]
    add(
        "At the GRPO benchmark's settings (the critic-free section's: tiny GPT-2, 8 prompts x 8 responses of "
        "up to 32 tokens, every check on), four processes per beta: ppo-ref's trainer with `--sampler "
        "dynamic` (the default) and with `--sampler static-compiled`, TRL 1.16's `GRPOTrainer`, and a decode "
        "worker that times `model.generate` and each sampler mode on the same 64 prompts (its fastest of 3 "
        f"per round). {settings['rounds']} rounds of {settings['block']} iterations per trainer after "
        f"{settings['warmup']} warm-up iterations, the order rotating; medians over the rounds; "
        f"{settings['threads']} torch threads per process. {data['cpu']}, {data['cores']} cores; load "
        f"average (1 min) at the start {loads[0]:.1f}, then " + ", ".join(f"{x:.1f}" for x in loads[1:]) + "."
    )
    add("")
    add("| | " + " | ".join(f"beta = {r['beta']:g}" for r in runs) + " |")
    add("|---|" + "---|" * len(runs))

    def row(label: str, cell: Any) -> None:
        add(f"| {label} | " + " | ".join(cell(r) for r in runs) + " |")

    row(
        "decode s: `model.generate`; `dynamic`; `static`; `static-compiled`",
        lambda r: "; ".join(
            f"{r['decode'][k]:.3f}" for k in ("generate", "dynamic", "static", "static-compiled")
        ),
    )
    row(
        "`model.generate` / compiled decode",
        lambda r: f"{r['decode']['generate'] / r['decode']['static-compiled']:.2f}x",
    )
    row(
        "s/iteration: ppo-ref `dynamic`; ppo-ref `static-compiled`; TRL 1.16",
        lambda r: "; ".join(f"{r['seconds'][k]:.3f}" for k in ("dynamic", "static-compiled", "trl")),
    )
    target = SAMPLER_TARGETS["grpo"]
    row(
        f"**TRL / ppo-ref `static-compiled`** (iterations/s, median of per-round ratios; target >= "
        f"{target:g})",
        lambda r: f"**{r['ratio']:.2f}x** ({met(r['ratio'] >= target)})",
    )
    row("per-round ratios", lambda r: ", ".join(f"{x:.2f}" for x in r["ratios"]))
    row("TRL / ppo-ref `dynamic`", lambda r: f"{r['ratio_dynamic']:.2f}x")
    row(
        "floor s: compiled decode + forwards + update (the compiled trainer's stages)",
        lambda r: (
            f"{r['floor']['seconds']:.3f} = {r['floor']['decode_seconds']:.3f} + "
            f"{r['floor']['forward_seconds']:.3f} + {r['floor']['update_seconds']:.3f}"
        ),
    )
    row("TRL / floor: the most this decode allows", lambda r: f"{r['floor']['trl_over_floor']:.2f}x")
    row(
        "compile s (first compiled decode minus a steady one; cold inductor cache)",
        lambda r: f"{r['compile_seconds']:.0f}",
    )
    row(
        "trainer build s, initial evaluation included: `dynamic`; `static-compiled`",
        lambda r: f"{r['build_seconds']['dynamic']:.0f}; {r['build_seconds']['static-compiled']:.0f}",
    )
    row(
        "peak RSS: ppo-ref `dynamic`; `static-compiled`; TRL (target: `static-compiled` <= TRL)",
        lambda r: (
            f"{mib(r['peak']['dynamic'])}; {mib(r['peak']['static-compiled'])}; {mib(r['peak']['trl'])} "
            f"({met(r['peak']['static-compiled'] <= r['peak']['trl'])})"
        ),
    )
    row(
        "same tokens as `dynamic` (decode worker): `static`; `static-compiled`",
        lambda r: "; ".join(
            "yes" if r["same_tokens"][k] else "**no**" for k in ("static", "static-compiled")
        ),
    )
    add("")
    lines.extend(_ppo_lines(trainer_run))
    if "smollm2" in data:
        lines.extend(_smollm2_lines(data["smollm2"]))
    return lines
