"""``ppo-ref step-check``: the trainer-step tier (spec STEP-1..5) at a user's own settings.

``ppo-ref step-check --impl trl116 --config grpo.json`` reads a TRL ``GRPOConfig`` (JSON or YAML, its
field names), ``--impl verl --config actor.yaml`` a verl actor config (``actor_rollout_ref.actor``,
or a whole trainer config holding it), and ``--model PATH`` a checkpoint's ``config.json`` (its
family built tiny, no weight read). It runs the library's own training step through the built-in
runner (:mod:`ppo_ref.adapters.thirdparty.trl_step`, :mod:`~ppo_ref.adapters.thirdparty.verl_step`)
at those settings: the loss type or aggregation, the clip range and every other field the step reads
are the user's; the fixed batch, its split into micro-batches and its padding are the check's (the
user's gradient accumulation is one of the splits). It prints each clause's verdict and, for a
failure, by how much in words; exit status 0 when every clause passes (a convention the library
documents counts as passing, and is named), 1 when one fails, 2 for a bad config or option (a
one-line error naming it). :func:`step_check` is the same from Python.

Example (TRL 1.16 installed)::

    report = step_check("trl116", {"loss_type": "bnpo"})
    print("\\n".join(report.lines()))   # STEP-2 declared convention: the gradient changes by ...
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ppo_ref.adapters.step import (
    RATIO_TOLERANCE,
    SUITE_BUDGET,
    SUITE_PROMPT_LENGTH,
    StepBatch,
    StepMove,
    StepResult,
    StepRunner,
    example_batch,
    truncation_convention,
    truncation_problems,
)

__all__ = ["IMPLS", "ClauseCheck", "StepCheck", "load_config", "main", "step_check"]

IMPLS: tuple[str, ...] = ("trl116", "verl")
"""The libraries whose configs the check reads: TRL >= 1.13 (``GRPOTrainer``; ``trl`` is accepted
as the same) and verl 0.9.1 (its FSDP engine's actor update)."""

VERL_APPLIED: frozenset[str] = frozenset(
    {"clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "policy_loss", "loss_scale_factor"}
    | {"tau_pos", "tau_neg"}
)
"""The verl actor fields the check applies besides the aggregation and the batch sizes: the ones
verl's ``ppo_loss`` reads for the policy loss (the KL loss needs a reference model the check has not)."""


@dataclass(frozen=True)
class ClauseCheck:
    """One clause at the user's settings: ``verdict`` pass, FAIL or declared convention; ``words``."""

    clause: str
    verdict: str
    words: str


@dataclass
class StepCheck:
    """The check's result: what ran (``header``), the clauses in order, and notes on the settings."""

    header: str
    clauses: list[ClauseCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[str]:
        """The clauses that fail at these settings."""
        return [c.clause for c in self.clauses if c.verdict == "FAIL"]

    def lines(self) -> list[str]:
        """The report as printed."""
        out = [self.header, *(f"  {note}" for note in self.notes)]
        out += [f"{c.clause} {c.verdict}: {c.words}" for c in self.clauses]
        fails = self.failed
        out.append(
            f"{len(fails)} of {len(self.clauses)} clauses fail at these settings"
            + (f" ({', '.join(fails)})" if fails else "")
        )
        return out


def load_config(path: str) -> dict[str, Any]:
    """The mapping in a JSON or YAML file (a one-line ValueError naming the file otherwise)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise ValueError(f"config: cannot read {path!r} ({error.strerror})") from None
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml  # type: ignore[import-untyped, unused-ignore]

            loaded = yaml.safe_load(text)
        else:
            loaded = json.loads(text)
    except Exception as error:  # json.JSONDecodeError, yaml.YAMLError: one line naming the file
        reason = " ".join(str(error).split())
        raise ValueError(
            f"config: {path!r} is not valid {'YAML' if path.endswith(('yaml', 'yml')) else 'JSON'} ({reason})"
        ) from None
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ValueError(f"config: {path!r} must hold a mapping of settings, got {type(loaded).__name__}")
    return loaded


def _listing(values: Sequence[int]) -> str:
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _percent(relative: float) -> str:
    return f"{100 * relative:.3g}%"


def _micro_batches(size: int, user: int | None) -> tuple[int, ...]:
    splits = {2, 4}
    if user is not None and 1 < user <= size and size % user == 0:
        splits.add(user)
    return tuple(sorted(splits))


def _trl(
    settings: Mapping[str, Any], family: Any, padding_side: str
) -> tuple[StepRunner, str, dict[str, Any], list[str], int | None]:
    trl = importlib.import_module("trl")
    step_module = importlib.import_module("ppo_ref.adapters.thirdparty.trl_step")
    version = str(trl.__version__)
    if tuple(int(p) for p in version.split(".")[:2]) < (1, 13):
        raise ValueError(
            f"impl: trl116 needs TRL >= 1.13 (GRPOTrainer with rollout_func), installed {version}"
        )
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    for key in settings:
        if key not in fields:
            raise ValueError(f"config: unknown GRPOConfig key {key!r} (TRL {version})")
    mode = settings.get("loss_type", _default(trl.GRPOConfig, "loss_type"))
    if mode not in step_module.LOSS_MODES:
        raise ValueError(f"config: loss_type {mode!r} is not one of TRL's {step_module.LOSS_MODES}")
    accumulation = settings.get("gradient_accumulation_steps", 1)
    if isinstance(accumulation, bool) or not isinstance(accumulation, int) or accumulation < 1:
        raise ValueError(f"config: gradient_accumulation_steps must be an int >= 1, got {accumulation!r}")
    read = ("loss_type", "gradient_accumulation_steps")  # the loss mode, and one of the splits
    owned = sorted(k for k in settings if k in step_module.OWNED and k not in read)
    applied = {k: v for k, v in settings.items() if k not in step_module.OWNED}
    try:
        trl.GRPOConfig(output_dir=os.devnull, use_cpu=True, report_to="none", **applied)
    except (TypeError, ValueError) as error:
        raise ValueError(f"config: GRPOConfig rejects it: {' '.join(str(error).split())}") from None
    notes = [f"set by the check, not read from the config: {', '.join(owned)}"] if owned else []
    runner = step_module.TrlGrpoStep(family=family, settings=applied, padding_side=padding_side)
    header = f"TRL {version} GRPOTrainer, loss_type {mode}"
    return runner, header, applied, notes, accumulation


def _default(config_class: Any, name: str) -> Any:
    for f in dataclasses.fields(config_class):
        if f.name == name:
            return f.default
    raise ValueError(f"config: {config_class.__name__} has no field {name!r}")


def _verl(
    settings: Mapping[str, Any], family: Any
) -> tuple[StepRunner, str, dict[str, Any], list[str], int | None]:
    verl = importlib.import_module("verl")
    config_module = importlib.import_module("verl.workers.config")
    step_module = importlib.import_module("ppo_ref.adapters.thirdparty.verl_step")
    actor = settings
    if "actor_rollout_ref" in actor:  # a whole trainer config
        actor = actor["actor_rollout_ref"]
        if not isinstance(actor, Mapping) or not isinstance(actor.get("actor"), Mapping):
            raise ValueError("config: actor_rollout_ref must hold an 'actor' mapping")
        rollout_n = actor.get("rollout", {}).get("n") if isinstance(actor.get("rollout"), Mapping) else None
        actor = actor["actor"]
    else:
        rollout_n = None
    fields = {f.name for f in dataclasses.fields(config_module.FSDPActorConfig)} | {"defaults"}
    for key in actor:
        if key not in fields:
            raise ValueError(f"config: unknown verl actor key {key!r} (verl {verl.__version__})")
    mode = actor.get("loss_agg_mode", "token-mean")
    if mode not in step_module.LOSS_MODES:
        raise ValueError(f"config: loss_agg_mode {mode!r} is not one of verl's {step_module.LOSS_MODES}")
    unresolved = sorted(k for k, v in actor.items() if isinstance(v, str) and v.startswith("${"))
    applied = {k: v for k, v in actor.items() if k in VERL_APPLIED and k not in unresolved}
    for key in ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c"):
        value = applied.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
        ):
            raise ValueError(f"config: {key} must be a number >= 0, got {value!r}")
    factor = applied.get("loss_scale_factor")
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, int) or factor < 1):
        raise ValueError(f"config: loss_scale_factor must be null or an int >= 1, got {factor!r}")
    mini, micro = actor.get("ppo_mini_batch_size"), actor.get("ppo_micro_batch_size_per_gpu")
    accumulation = None
    if all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (mini, micro, rollout_n)):
        accumulation = max(1, mini * rollout_n // micro)  # type: ignore[operator]
    read = {"loss_agg_mode", "defaults", "ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu"}
    ignored = sorted(k for k in actor if k not in VERL_APPLIED and k not in read)
    notes = []
    if ignored:
        notes.append(f"not read by the check (batch sizes, engine, optimizer, logging): {', '.join(ignored)}")
    if unresolved:
        notes.append(f"unresolved interpolations, verl's defaults used instead: {', '.join(unresolved)}")
    from ppo_ref.adapters.step_kit import tiny_config

    if not hasattr(tiny_config(family), "num_key_value_heads"):  # verl's apply_monkey_patch reads it
        raise ValueError(
            f"model: verl {verl.__version__} cannot load a {tiny_config(family).model_type} model"
        )
    runner = step_module.VerlStep(family=family, settings=applied)
    header = f"verl {verl.__version__} actor update, loss_agg_mode {mode}"
    return runner, header, {"loss_agg_mode": mode, **applied}, notes, accumulation


def _moves(base: StepResult, other: StepResult) -> tuple[bool, float]:
    move = StepMove.between(base, other)
    return move.beyond_tolerance, move.relative


def _clauses(
    runner: StepRunner, batch: StepBatch, mode: str, label: str, splits: tuple[int, ...]
) -> list[ClauseCheck]:
    base = runner.run(batch, loss_mode=mode)
    split_runs = {k: runner.run(batch, loss_mode=mode, micro_batches=k) for k in splits}
    out = []
    problems = []
    for k, result in ((1, base), *split_runs.items()):
        ratio, clip, kl = (result.stats.get(s) for s in ("max_abs_log_ratio", "clipfrac", "approx_kl"))
        where = f"with {k} micro-batch{'es' if k > 1 else ''}"
        if ratio is None:
            problems.append(f"the library reports no log-ratio {where}")
        elif not ratio <= RATIO_TOLERANCE:
            problems.append(f"max |logp - old_logp| is {ratio:.3g} before any update {where}")
        if clip is not None and clip == clip and clip != 0.0:
            problems.append(f"the clip fraction is {clip:.3g} before any update {where}")
        if kl is not None and kl == kl and abs(kl) > RATIO_TOLERANCE:
            problems.append(f"the approximate KL is {kl:.3g} before any update {where}")
    words = "; ".join(sorted(set(problems)))
    out.append(
        ClauseCheck(
            "STEP-1",
            "FAIL" if problems else "pass",
            f"{words} ({label})"
            if problems
            else f"the ratio is 1 before any update, with {_listing((1, *splits))} micro-batches",
        )
    )
    moved = [(k, *_moves(base, r)) for k, r in split_runs.items()]
    worst = max(moved, key=lambda m: m[2])
    if any(m[1] for m in moved):
        declared = runner.micro_batch_local.get(mode)
        text = f"the gradient changes by {_percent(worst[2])} between 1 and {worst[0]} micro-batches"
        text += f" with {label}"
        if declared:
            out.append(
                ClauseCheck("STEP-2", "declared convention", f"{text} (the library documents it: {declared})")
            )
        else:
            out.append(ClauseCheck("STEP-2", "FAIL", text))
    else:
        out.append(
            ClauseCheck(
                "STEP-2",
                "pass",
                f"the same gradient with {_listing((1, *splits))} micro-batches"
                f" (relative difference at most {worst[2]:.1e})",
            )
        )
    variants = [
        (
            f"{SUITE_PROMPT_LENGTH - SUITE_BUDGET} extra padding columns on the completions",
            {"pad_to": SUITE_PROMPT_LENGTH},
        ),
        ("one extra column of left padding on the prompts", {"pad_to": SUITE_PROMPT_LENGTH + 1}),
    ]
    failures = []
    for text, kwargs in variants:
        moves, relative = _moves(base, runner.run(batch, loss_mode=mode, **kwargs))
        if moves:
            failures.append(
                f"{text} change the gradient by {_percent(relative)}"
                if "columns on" in text
                else f"{text} changes the gradient by {_percent(relative)}"
            )
    out.append(
        ClauseCheck(
            "STEP-3",
            "FAIL" if failures else "pass",
            f"{'; '.join(failures)} with {label}"
            if failures
            else "extra padding of the completions and of the prompts changes nothing",
        )
    )
    fill = batch.vocab_size - 1
    moves, relative = _moves(base, runner.run(batch, loss_mode=mode, pad_fill=fill))
    out.append(
        ClauseCheck(
            "STEP-4",
            "FAIL" if moves else "pass",
            f"token {fill} written into the padding slots changes the gradient by {_percent(relative)}"
            f" with {label}"
            if moves
            else f"token {fill} in the padding slots changes nothing",
        )
    )
    probe = getattr(runner, "truncation_run", None)
    result = probe(batch) if probe is not None else base
    convention = truncation_convention(runner)
    problems = truncation_problems(batch, result, convention=convention)
    if problems and probe is not None:
        problems[-1] += " with the library's truncation handling switched on (the runner's truncation_run)"
    if problems:
        out.append(ClauseCheck("STEP-5", "FAIL", "; ".join(problems)))
    elif convention is not None and truncation_problems(batch, result):
        out.append(
            ClauseCheck(
                "STEP-5",
                "declared convention",
                f"every row's reward is its score plus a penalty of its length alone, EOS-ended or cut "
                f"({convention.source}; L_cache {convention.buffer}, L_max the budget {batch.budget})",
            )
        )
    else:
        out.append(
            ClauseCheck(
                "STEP-5",
                "pass",
                "only the rows cut at the budget are treated as truncated, not the EOS-ended row filling it",
            )
        )
    return out


def step_check(
    impl: str,
    config: Mapping[str, Any] | str | None = None,
    *,
    model: str | None = None,
    padding_side: str = "right",
) -> StepCheck:
    """Run STEP-1..5 for ``impl`` (:data:`IMPLS`) at the settings of ``config`` (a mapping, or a
    JSON/YAML path) with the tiny model of ``model``'s ``config.json`` (a checkpoint folder or the
    file; None: the runner's default family). Raises ValueError, naming the key, for a bad config."""
    from ppo_ref.adapters.step_kit import family_of

    if impl not in (*IMPLS, "trl"):
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side: expected 'left' or 'right', got {padding_side!r}")
    settings = load_config(config) if isinstance(config, str) else dict(config or {})
    family: Any = None
    if model is not None:
        path = os.path.join(model, "config.json") if os.path.isdir(model) else model
        family = load_config(path)
        family_of(family)
    if impl == "verl":
        runner, header, applied, notes, accumulation = _verl(settings, family or "qwen2")
        mode = str(applied["loss_agg_mode"])
        label = f"loss_agg_mode {mode}"
    else:
        runner, header, applied, notes, accumulation = _trl(settings, family or "gpt2", padding_side)
        mode = str(
            settings.get("loss_type", _default(importlib.import_module("trl").GRPOConfig, "loss_type"))
        )
        label = f"loss_type {mode}"
    family_name = family_of(family) if family is not None else ("qwen2" if impl == "verl" else "gpt2")
    header = f"ppo-ref step-check: {header}, model family {family_name} (tiny, random weights)"
    shown = {k: v for k, v in applied.items() if k not in ("loss_type", "loss_agg_mode")}
    if shown:
        notes.insert(0, "settings applied: " + ", ".join(f"{k}={v!r}" for k, v in sorted(shown.items())))
    batch = example_batch(budget=SUITE_BUDGET, prompt_length=SUITE_PROMPT_LENGTH)
    splits = _micro_batches(batch.size, accumulation)
    if accumulation is not None:
        notes.append(
            f"your settings accumulate {accumulation} micro-batch(es) per optimizer step; the check "
            f"splits its {batch.size}-row batch into {_listing((1, *splits))}"
        )
    report = StepCheck(header=header, notes=notes)
    report.clauses = _clauses(runner, batch, mode, label, splits)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``ppo-ref step-check``: print the report; exit 0 (all pass), 1 (a clause fails), 2 (bad input)."""
    parser = argparse.ArgumentParser(
        prog="ppo-ref step-check",
        description="Run the trainer-step tier (spec STEP-1..5) at your own TRL or verl settings.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--impl", required=True, choices=(*IMPLS, "trl"), help="the library whose config --config is"
    )
    parser.add_argument(
        "--config", metavar="FILE", help="a GRPOConfig (trl116) or actor config (verl), JSON or YAML"
    )
    parser.add_argument(
        "--model", metavar="PATH", help="a checkpoint folder or its config.json: the family, built tiny"
    )
    parser.add_argument(
        "--padding-side", default="right", choices=("left", "right"), help="the tokenizer's (default right)"
    )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    captured = io.StringIO()  # the libraries' own logs and progress bars, shown only on a crash
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
            report = step_check(args.impl, args.config, model=args.model, padding_side=args.padding_side)
    except ValueError as error:
        print(f"ppo-ref step-check: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    except ImportError as error:
        print(
            f"ppo-ref step-check: error: impl: {args.impl} is not installed here ({error})", file=sys.stderr
        )
        return 2
    except BaseException:
        sys.stderr.write(captured.getvalue()[-8000:])
        raise
    print("\n".join(report.lines()))
    return 1 if report.failed else 0
