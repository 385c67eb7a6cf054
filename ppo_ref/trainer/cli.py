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
2 a bad command line, config or input file, or the extra ``trainer`` not installed; 130 stopped by
SIGINT/SIGTERM after writing a checkpoint.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import shutil
import sys
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ppo_ref.trainer.config import TrainerConfig, config_from_toml, field_docs, field_types

if TYPE_CHECKING:  # the trainer (transformers, accelerate) loads only when a run starts
    from ppo_ref.trainer.loop import PPOTrainer

__all__ = ["build_parser", "check_output_dir", "main", "resolve_config", "run_files"]

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


_TASKS_HELP = """\
built-in tasks (--task NAME; each builds a tiny model from a config, nothing is downloaded):
  positive-review      (default) a tiny GPT-2 warmed up on generated reviews " {adj} and {adj}.";
                       reward: the mean lexicon value (+1 positive, -1 negative) of the two
                       adjectives, -1 if the review is malformed; in [-1, 1]
  positive-review-rm   the same texts, scored by a Bradley-Terry reward model trained on generated
                       preference pairs (kl_coef 0.2 unless set); evaluation uses the rule score above
  reverse              write the prompt's four digits reversed; reward 1 if exactly right, else 0
  length               answer in five words; reward clip(1 - |words - 5| / 3, -1, 1), -1 if malformed
  smollm2-sentiment    the pretrained SmolLM2-135M-Instruct (optional packages), rewarded by the
                       VADER compound sentiment of its answer, in [-1, 1]

your own reward: --reward module:function, a Python function
  function(prompts: list[str], responses: list[str]) -> list[float]   (one score per response)
  (the module is imported from the current directory or PYTHONPATH), or --reward DIR, a local
  AutoModelForSequenceClassification checkpoint with one label.

--out must be a new or empty directory: an existing run is refused (exit status 2) unless
--overwrite (replace its files) or --resume (continue it).

exit status: 0 done; 1 the run stopped on an error of its own (a bad score, a failed runtime
check); 2 a bad command line, config or input file, or the trainer's packages not installed
(pip install "ppo-ref[trainer]"; checked before any work); 130 stopped by SIGINT/SIGTERM after
writing a checkpoint (continue with --resume OUT).
"""


class _Parser(argparse.ArgumentParser):
    """argparse with a short error: the message, a "did you mean" for unknown flags, and a pointer
    to --help instead of the whole usage."""

    def _all_options(self) -> list[str]:
        options: list[str] = []
        for action in self._actions:
            options += [o for o in action.option_strings if o.startswith("--")]
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    if isinstance(sub, _Parser):
                        options += sub._all_options()
        return sorted(set(options))

    def error(self, message: str) -> typing.NoReturn:
        hints = []
        if message.startswith("unrecognized arguments:"):
            for word in message.partition(":")[2].split():
                name = word.partition("=")[0]
                if name.startswith("-"):
                    close = difflib.get_close_matches(name, self._all_options(), n=1, cutoff=0.6)
                    if close:
                        hints.append(f"did you mean {close[0]}?")
        hint = f" ({'; '.join(hints)})" if hints else ""
        helper = "ppo-ref train" if self.prog == "ppo-ref" else self.prog
        self.exit(2, f"{self.prog}: error: {message}{hint}\nrun '{helper} --help' for every flag\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; ``ppo-ref train --help`` lists every config field with default and meaning."""
    parser = _Parser(
        prog="ppo-ref",
        description="ppo-ref: a verification-first reference PPO for RLHF.",
        allow_abbrev=False,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train = commands.add_parser(
        "train",
        help="train a policy with PPO-RLHF",
        description=(
            "Train a policy with PPO-RLHF and write metrics.jsonl, rollouts.jsonl, summary.json and\n"
            "plots to --out. Every config field below can also be set in a TOML file (--config) as\n"
            "'field = value'; flags override the file, which overrides the task's own settings."
        ),
        epilog=_TASKS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    train.add_argument(
        "--overwrite",
        action="store_true",
        help=(
            "replace the run in an existing --out: its metrics, rollouts, summary, plots, TensorBoard "
            "events and checkpoints are deleted before training starts (other files are left alone)"
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


def _say(message: str) -> None:
    """A status line on stderr (process 0 only), so a user sees what the command is doing."""
    if os.environ.get("RANK", "0") == "0":
        print(f"ppo-ref train: {message}", file=sys.stderr, flush=True)


_RUN_FILES = ("metrics.jsonl", "rollouts.jsonl", "summary.json", "tensorboard", "checkpoints")


def run_files(out: Path) -> list[Path]:
    """The files and folders of a run in ``out`` (what ``--overwrite`` deletes)."""
    from ppo_ref.trainer.metrics import PLOTS

    names = (*_RUN_FILES, *PLOTS)
    return [out / name for name in names if (out / name).exists() or (out / name).is_symlink()]


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def check_output_dir(out: str, resume: str | None, overwrite: bool) -> None:
    """Refuse, before any work, an ``--out`` that is a file, lies under a file, cannot be written,
    or holds files already (unless ``overwrite``, or a resumed run continues in its own directory).

    Raises ``ValueError`` naming ``--out`` and, for an existing run, ``--overwrite`` and ``--resume``.
    """
    path = Path(out).expanduser()
    existing = _nearest_existing(path.absolute())
    if existing.exists() and not existing.is_dir():
        where = "is a file" if existing == path.absolute() else f"is under {existing}, which is a file"
        raise ValueError(f"--out {out}: {where}; expected a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: cannot be written ({existing} is not writable)")
    if existing != path.absolute():
        if os.environ.get("RANK", "0") != "0":
            return
        # A directory that cannot be created (e.g. under /proc) is refused now, not after the work:
        # create it and take it away again.
        first_new = next(p for p in (path.absolute(), *path.absolute().parents) if p.parent == existing)
        try:
            path.mkdir(parents=True)
        except OSError as error:
            raise ValueError(f"--out {out}: cannot create the directory {path} ({error.strerror})") from None
        for created in (path.absolute(), *path.absolute().parents):
            created.rmdir()
            if created == first_new:
                break
        return
    if resume is not None:
        from ppo_ref.trainer.checkpoint import find_checkpoint

        own_run = find_checkpoint(resume).resolve().parent.parent
        if own_run == path.resolve():
            if overwrite:
                raise ValueError(
                    f"--overwrite: --out {out} is the run being resumed; overwriting it would delete the "
                    "checkpoint (leave out --overwrite to continue the run in place)"
                )
            return
    if any(path.iterdir()) and not overwrite:
        what = "holds a run" if run_files(path) else "is not empty"
        raise ValueError(
            f"--out {out} {what}; nothing was changed. Choose a new --out, add --overwrite to replace "
            f"that run's files, or continue it with --resume {out}"
        )


def _overwrite(out: Path) -> None:
    """Delete the previous run's files in ``out`` (see :func:`run_files`)."""
    for path in run_files(out):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _preprocess(argv: Sequence[str]) -> list[str]:
    """``--flag -1e-4`` -> ``--flag=-1e-4``: argparse reads a negative number with an exponent as a flag."""
    result: list[str] = []
    for word in argv:
        previous = result[-1] if result else ""
        if word.startswith("-") and previous.startswith("--") and "=" not in previous:
            try:
                float(word)
            except ValueError:
                pass
            else:
                result[-1] = f"{previous}={word}"
                continue
        result.append(word)
    return result


def _apply_threads(threads: int | None) -> None:
    """Set torch's thread count to ``threads`` (None and 0: as the process started, which the
    ``ppo-ref`` entry point, ``ppo_ref_entry``, decided before torch loaded) and say what is in force."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    policy = os.environ.get("OMP_WAIT_POLICY", "OpenMP's default")
    _say(f"CPU threads: {torch.get_num_threads()} (OMP_WAIT_POLICY {policy}; --threads N to change)")


def _train(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    from ppo_ref.trainer.requirements import missing_requirements, missing_trainer_message

    missing = missing_requirements()
    if missing:  # the suite-only install: say so before anything imports transformers
        print(f"ppo-ref train: error: {missing_trainer_message(missing)}", file=sys.stderr)
        return 2
    try:
        config, user_fields = resolve_config(args)
        _apply_threads(config.threads)
        from ppo_ref.trainer.setup import check_paths, prompts_file_summary

        check_paths(config)
        check_output_dir(config.out, args.resume, args.overwrite)
        if config.prompts is not None:
            _say(prompts_file_summary(config.prompts, config.seed))
        if config.policy is None or config.reward is None or config.prompts is None:
            _say(
                f"building task {config.task!r} (seed {config.seed}; its tiny model is trained briefly first)"
            )
        else:
            _say("loading the policy, the reward and the prompts")
        from ppo_ref.trainer.setup import build_setup

        setup, config = build_setup(config, user_fields)
        from ppo_ref.trainer.loop import PPOTrainer

        trainer = PPOTrainer(config, setup, resume=args.resume)
    except ValueError as error:
        print(f"ppo-ref train: error: {error}", file=sys.stderr)
        return 2
    try:
        status = _train_and_report(trainer, args, started)
    finally:
        # destroys the process group of a launched run while the trainer is alive (a no-op in one process)
        trainer.accelerator.end_training()
    if trainer.parallel.world_size > 1:
        # still holding the trainer: the process ends without tearing its group down (a gloo hang or
        # SIGABRT at exit otherwise; exit_launched_process says why; its end_training is a no-op now)
        from ppo_ref.trainer.distributed import exit_launched_process

        exit_launched_process(trainer.accelerator, status)
    return status


def _train_and_report(trainer: PPOTrainer, args: argparse.Namespace, started: float) -> int:
    """Train, print the summary on the main process; the exit status (1: a run error, 130: stopped)."""
    from ppo_ref.trainer import (
        BadScoreError,
        LogprobMismatchError,
        ReferenceModelChangedError,
        TooManyNonFiniteStepsError,
    )

    if args.overwrite and trainer.parallel.is_main:
        _overwrite(Path(trainer.config.out))
    trainer.parallel.barrier()
    try:
        summary = trainer.train(started_at=started, status=_say if trainer.parallel.is_main else None)
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
    args = parser.parse_args(_preprocess(sys.argv[1:] if argv is None else argv))
    if args.command == "train":
        return _train(args)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse rejects it first


if __name__ == "__main__":
    raise SystemExit(main())
