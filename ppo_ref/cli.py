"""The ``ppo-ref`` command line: ``ppo-ref train [--task NAME] [--config FILE.toml] [--FIELD VALUE ...]``.

Every field of :class:`~ppo_ref.trainer.config.TrainerConfig` has an override flag (``--max-new-tokens``
for ``max_new_tokens``; ``--tensorboard``/``--no-tensorboard`` for booleans; ``none`` for an optional
value). Priority: flags > TOML file > the task's overrides > defaults. Every value is checked
before any work starts; a bad one is an error naming the field, with exit status 2.

``--resume PATH`` continues a run from a checkpoint (a run directory: its newest complete one; or
one ``checkpoints/iter-NNNNNN`` directory) with the checkpoint's config; flags may change only the
fields that do not determine the run's math (``--iterations`` is the run's total, ``--out`` may be
a new directory and defaults to the checkpoint's run directory).

Exit status: 0 done; 1 the run stopped on an error of its own (a bad score, a failed runtime check);
2 a bad command line, config or input file; 130 stopped by SIGINT/SIGTERM after writing a checkpoint.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import MISSING, fields
from typing import Any, Literal

from ppo_ref.trainer.config import TrainerConfig, config_from_toml, field_docs, field_types

__all__ = ["build_parser", "main", "resolve_config"]

_METAVARS = {"task": "NAME", "iterations": "N", "seed": "S", "out": "DIR", "prompts": "FILE.jsonl"}
_METAVARS.update({"policy": "PATH", "reference": "PATH", "reward": "PATH"})


def _scalar_parser(kind: object, name: str) -> Callable[[str], object]:
    def parse(text: str) -> object:
        try:
            if kind is int:
                return int(text)
            if kind is float:
                number = float(text)
                if not math.isfinite(number):
                    raise ValueError
                return number
        except ValueError:
            expected = "an integer" if kind is int else "a finite number"
            raise argparse.ArgumentTypeError(f"expected {expected} for {name}, got {text!r}") from None
        return text

    return parse


def _value_parser(annotation: object, name: str) -> tuple[Callable[[str], object], list[str] | None]:
    """A converter for one field's flag, and its choices (for Literal fields)."""
    members = typing.get_args(annotation) if type(None) in typing.get_args(annotation) else (annotation,)
    optional = type(None) in members
    base = next(m for m in members if m is not type(None))
    choices = [str(c) for c in typing.get_args(base)] if typing.get_origin(base) is Literal else None
    scalar = _scalar_parser(base if choices is None else str, name)

    def parse(text: str) -> object:
        if optional and text.lower() == "none":
            return None
        if choices is not None and text not in choices:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(choices)} for {name}, got {text!r}")
        return scalar(text)

    return parse, choices


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; ``ppo-ref train --help`` lists every config field with default and meaning."""
    parser = argparse.ArgumentParser(
        prog="ppo-ref",
        description="ppo-ref: a verification-first reference PPO for RLHF.",
        allow_abbrev=False,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train = commands.add_parser(
        "train",
        help="train a policy with PPO-RLHF",
        description=(
            "Train a policy with PPO-RLHF and write metrics.jsonl, rollouts.jsonl, summary.json and plots "
            "to --out. Every config field below can also be set in a TOML file (--config) as "
            "'field = value'; "
            "flags override the file, which overrides the task's own settings."
        ),
        allow_abbrev=False,
    )
    train.set_defaults(subparser=train)
    train.add_argument(
        "--config", metavar="FILE.toml", help="TOML file of config fields (flat 'field = value')"
    )
    train.add_argument(
        "--resume",
        metavar="PATH",
        help=(
            "continue the run saved in PATH: a run directory (its newest complete checkpoint) or one "
            "checkpoints/iter-NNNNNN directory; --iterations is the run's total, --out may be new"
        ),
    )
    docs, types_ = field_docs(), field_types()
    for f in fields(TrainerConfig):
        default = f.default if f.default is not MISSING else None
        help_text = f"{docs.get(f.name, '')} (default: {default!r})".replace("%", "%%")
        flag = "--" + f.name.replace("_", "-")
        if types_[f.name] is bool:
            train.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
            continue
        parse, choices = _value_parser(types_[f.name], f.name)
        metavar = _METAVARS.get(f.name) or ("{" + ",".join(choices) + "}" if choices else f.name.upper())
        train.add_argument(
            flag, dest=f.name, type=parse, default=argparse.SUPPRESS, metavar=metavar, help=help_text
        )
    return parser


def _print_summary(summary: dict[str, Any]) -> None:
    def show(value: Any) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    if summary.get("interrupted"):
        print(
            f"stopped by {summary['interrupted']} after {summary['iterations_done']} iterations; "
            f"checkpoint {summary['last_checkpoint']}; continue with: ppo-ref train --resume "
            f"{summary['config']['out']}",
            file=sys.stderr,
        )
        return

    print(
        f"eval score {show(summary['eval_score_initial'])} -> {show(summary['eval_score_final'])}, "
        f"KL to reference {show(summary['kl_ref_final'])}, "
        f"well-formed {show(summary['well_formed_rate_initial'])} -> "
        f"{show(summary['well_formed_rate_final'])}, "
        f"{summary['wall_seconds']:.1f} s; outputs in {summary['config']['out']}"
    )


def _user_values(args: argparse.Namespace) -> dict[str, Any]:
    names = {f.name for f in fields(TrainerConfig)}
    values: dict[str, Any] = config_from_toml(args.config) if args.config else {}
    values.update({k: v for k, v in vars(args).items() if k in names})
    return values


def resolve_config(args: argparse.Namespace) -> tuple[TrainerConfig, set[str]]:
    """The config from defaults, ``--config`` TOML and flags, and the names of the fields the user set.

    With ``--resume`` the base is the checkpoint's config instead of the defaults, and every field
    counts as set (the task's overrides are already in it). Raises ``ValueError`` naming the field
    (and the TOML file) for any bad name, type or value.
    """
    values = _user_values(args)
    if getattr(args, "resume", None):
        from ppo_ref.trainer.checkpoint import load_checkpoint
        from ppo_ref.trainer.resume import resumed_config

        config = resumed_config(load_checkpoint(args.resume), values)
        return config, {f.name for f in fields(TrainerConfig)}
    return TrainerConfig(**values), set(values)


def _train(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    started = time.perf_counter()
    try:
        config, user_fields = resolve_config(args)
        from ppo_ref.trainer.setup import build_setup, check_paths

        check_paths(config)
        setup, config = build_setup(config, user_fields)
        from ppo_ref.trainer.loop import PPOTrainer

        trainer = PPOTrainer(config, setup, resume=args.resume)
    except ValueError as error:
        parser.print_usage(sys.stderr)
        print(f"ppo-ref train: error: {error}", file=sys.stderr)
        return 2
    from ppo_ref.trainer import (
        BadScoreError,
        LogprobMismatchError,
        ReferenceModelChangedError,
        TooManyNonFiniteStepsError,
    )

    try:
        summary = trainer.train(started_at=started)
    except (
        BadScoreError,
        LogprobMismatchError,
        ReferenceModelChangedError,
        TooManyNonFiniteStepsError,
    ) as error:
        print(f"ppo-ref train: error: {error}", file=sys.stderr)
        return 1
    if trainer.parallel.is_main:
        _print_summary(summary)
    return 130 if summary.get("interrupted") else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ppo-ref`` script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "train":
        return _train(args, args.subparser)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse rejects it first
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
