"""Every ``ppo-ref train`` line of the documentation's fenced code blocks, tested as a user types it
(issue 12).

Each line is taken from README.md and the pages of docs/ (``tests/docs_text.py``, issue 29; trailing
``# comments`` stripped) and falls in exactly one of three lists, checked by the line's text, so that
a new line on any page cannot slip through unlisted:

- ``USER_FILES``: the line names files that only exist in the user's world (``--config my.toml``,
  ``--policy ckpt/``, ``--prompts prompts.jsonl``, ``--reward my_rewards:...``, ``--resume ...``);
- ``COVERED``: an existing test runs the line's code path (named ``path::test``; the fast test below
  checks that the test exists and that the line sets only the fields that test sets):

  - ``ppo-ref train --help``:
    ``tests/trainer/test_cli_as_a_user.py::test_help_describes_tasks_rewards_and_exit_codes``
  - ``--out ppo-ref-run --overwrite``: the plain ``ppo-ref train`` run below plus
    ``test_cli_as_a_user.py::test_overwrite_replaces_the_runs_files_cleanly``
  - ``--task reverse ...`` (both lines): ``test_trainer_tasks.py::test_task_learns[reverse]`` (30
    iterations at the defaults) and the reverse run of ``test_cli_resume_tasks.py`` (the command,
    ``--save-every``, checkpoints)
  - ``--group-size 4`` (PPO with GAE): this file's runs of the plain ``ppo-ref train`` line and of
    the ``--group-size 8`` lines; with GAE the group size only lays out the batch (each prompt
    sampled that many times), the same sampling code the group estimators run (the reduction chosen
    for time: each run costs about 31 CPU-seconds, and this line runs no function the others do not)
  - ``.venv/bin/ppo-ref train --task smollm2-sentiment``: ``tests/reliability/test_smollm2_smoke.py``
    (one iteration at a small size; at the preset's size it writes a 3.6 GB checkpoint)

- every other line is run (``test_readme_train_line_runs``, slow): the installed ``.venv/bin/ppo-ref``
  in a subprocess, in a fresh directory, with only ``--iterations 1`` added (every other field at
  its default, ``eval_samples`` included, so each option's default path runs one full iteration).
  ``--out`` is left as written: each run has its own working directory, so the default
  ``./ppo-ref-run`` cannot collide. It must exit 0 and write a summary with the config the flags
  asked for, and one finite metrics record.

The fast test (``test_every_readme_train_line_parses``, no marker) parses every line through the
command's own ``resolve_config``, so a wrong flag on a page fails in ``./dev test``.

Cost: one line runs in about 31 CPU-seconds (task build with its warm-up, two evaluations of 256
responses, one iteration, checkpoint, plots); lines whose code path an existing test already runs at
the defaults are listed in ``COVERED`` instead of run again.
"""

from __future__ import annotations

import ast
import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ppo_ref import cli
from ppo_ref.trainer import TrainerConfig
from tests.docs_text import pages, read

REPO = Path(__file__).resolve().parents[2]
PPO_REF = Path(sys.executable).with_name("ppo-ref")
CRITIC_FREE = {"grpo", "dr_grpo", "rloo", "reinforce++", "reinforce++-baseline"}
CRITIC_METRICS = {"value_loss", "explained_variance", "value_mean", "grad_norm_critic"}
USER_FLAGS = ("--config", "--policy", "--prompts", "--reward", "--resume")

USER_FILES: dict[str, str] = {
    "ppo-ref train --config my.toml --kl-coef 0.1": "the user's TOML file",
    "ppo-ref train --policy ckpt/ --reward rm/ --prompts prompts.jsonl": "the user's checkpoints",
    "ppo-ref train --reward my_rewards:vowels --out runs/vowels": "the user's reward module",
    "ppo-ref train --resume runs/r": "a run of the user's",
    "ppo-ref train --resume runs/r/checkpoints/iter-000050 --out runs/r2 --iterations 200": (
        "a run of the user's"
    ),
}

# line -> (test that runs its code path, the fields that test sets: the line may set no other)
COVERED: dict[str, tuple[str, frozenset[str]]] = {
    "ppo-ref train --help": (
        "tests/trainer/test_cli_as_a_user.py::test_help_describes_tasks_rewards_and_exit_codes",
        frozenset(),
    ),
    "ppo-ref train --out ppo-ref-run --overwrite": (
        "tests/trainer/test_cli_as_a_user.py::test_overwrite_replaces_the_runs_files_cleanly",
        frozenset({"out"}),
    ),
    "ppo-ref train --task reverse --iterations 30 --seed 1 --out runs/reverse": (
        "tests/trainer/test_trainer_tasks.py::test_task_learns",
        frozenset({"task", "iterations", "seed", "out"}),
    ),
    "ppo-ref train --task reverse --iterations 100 --save-every 10 --out runs/r": (
        "tests/trainer/test_cli_resume_tasks.py::test_resume_on_the_command_line_ends_equal_to_a_straight_run",
        frozenset({"task", "iterations", "save_every", "out"}),
    ),
    "ppo-ref train --group-size 4": (
        "tests/trainer/test_readme_trainer_commands.py::test_readme_train_line_runs",
        frozenset({"group_size"}),
    ),
    ".venv/bin/ppo-ref train --task smollm2-sentiment --out runs/smollm2": (
        "tests/reliability/test_smollm2_smoke.py::test_one_ppo_iteration_of_smollm2_on_the_cpu",
        frozenset({"task", "out"}),
    ),
}


def _page_lines(text: str) -> list[str]:
    """The lines of ``text`` inside its fenced code blocks."""
    inside: list[str] = []
    fenced = False
    for raw in text.splitlines():
        if raw.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            inside.append(raw)
    return inside


def readme_train_lines() -> list[str]:
    """The ``ppo-ref train`` commands of the fenced code blocks of README.md and docs/*.md, comments
    stripped, in order."""
    lines: list[str] = []
    for raw in (line for page in pages() for line in _page_lines(read(page))):
        words = shlex.split(raw, comments=True) if "ppo-ref train" in raw else []
        if len(words) >= 2 and words[0].endswith("ppo-ref") and words[1] == "train":
            lines.append(shlex.join(words))
    return lines


LINES = readme_train_lines()
RUN = [line for line in LINES if line not in USER_FILES and line not in COVERED]


def short(line: str) -> str:
    """A test id: the line's arguments (``defaults`` for none)."""
    return line.split(" train", 1)[1].strip() or "defaults"


def resolve(words: list[str]) -> tuple[TrainerConfig, set[str]]:
    """The config and user-set fields of ``ppo-ref train ...`` (``words`` without the command), as the
    command resolves them before any work."""
    return cli.resolve_config(cli.build_parser().parse_args(["train", *words]))


def test_the_readme_lines_are_found_and_every_one_is_listed_or_run() -> None:
    assert len(LINES) >= 15 and len(set(LINES)) == len(LINES), LINES
    assert "ppo-ref train" in LINES  # the first example, the default run
    assert not set(USER_FILES) & set(COVERED)
    stale = sorted((set(USER_FILES) | set(COVERED)) - set(LINES))
    assert stale == [], f"listed lines no longer in README.md or docs/: {stale}"
    for line in LINES:
        names_user_files = any(flag in line.split() for flag in USER_FLAGS)
        # a line naming the user's files is listed as such; a line listed as such names them
        assert names_user_files == (line in USER_FILES), line
    assert len(RUN) >= 8, RUN  # the estimator and loss examples


@pytest.mark.parametrize("line", sorted(COVERED), ids=short)
def test_a_covered_line_names_an_existing_test_that_sets_the_same_fields(line: str) -> None:
    test, allowed = COVERED[line]
    path, name = test.split("::")
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    assert name in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}, test
    words = shlex.split(line)[2:]
    if words == ["--help"]:
        return
    if path.endswith("test_readme_trainer_commands.py"):  # the defaults line and a grouped one run here
        assert "ppo-ref train" in RUN and any("--group-size" in run.split() for run in RUN), RUN
    _, user = resolve(words)
    assert user <= allowed, f"{line} sets {sorted(user - allowed)}, which {test} does not"


@pytest.mark.parametrize("line", LINES, ids=short)
def test_every_readme_train_line_parses(
    line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each line resolves into a valid ``TrainerConfig`` (no training); the user's files are stood in
    for by an empty TOML file, and ``--resume`` (a checkpoint to load) is parsed but not resolved."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.toml").write_text("")
    words = shlex.split(line)[2:]
    if words == ["--help"]:
        with pytest.raises(SystemExit) as exit_info:
            cli.build_parser().parse_args(["train", *words])
        assert exit_info.value.code == 0 and "--advantage-estimator" in capsys.readouterr().out
        return
    args = cli.build_parser().parse_args(["train", *words])
    if args.resume is not None:
        args.resume = None
    config, user = cli.resolve_config(args)
    for flag in words:
        if flag.startswith("--") and flag not in ("--config", "--overwrite", "--resume"):
            assert flag[2:].replace("-", "_") in user, (line, flag)
    assert isinstance(config, TrainerConfig)


def _finite_record(record: dict[str, object], critic_free: bool) -> None:
    for key, value in record.items():
        if critic_free and key in CRITIC_METRICS:
            assert value is None, (key, value)  # no critic: no value loss, no value statistics
        else:
            assert isinstance(value, (int, float)) and math.isfinite(value), (key, value)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("line", RUN, ids=short)
def test_readme_train_line_runs(line: str, tmp_path: Path) -> None:
    words = [*shlex.split(line)[2:], "--iterations", "1"]
    config, user = resolve(words)
    result = subprocess.run(
        [str(PPO_REF), "train", *words],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = tmp_path / config.out
    summary = json.loads((out / "summary.json").read_text())
    asked = {name: getattr(config, name) for name in sorted(user)}
    assert {name: summary["config"][name] for name in asked} == asked
    assert summary["iterations_done"] == 1 and summary["interrupted"] is None
    assert summary["eval_samples"] == TrainerConfig().eval_samples
    assert summary["advantage_estimator"] == config.advantage_estimator
    critic_free = config.advantage_estimator in CRITIC_FREE
    assert summary["critic"] == ("none" if critic_free else config.critic)
    for name in ("policy_loss", "loss_agg", "kl_in", "rollout_correction", "group_size"):
        assert summary["config"][name] == getattr(config, name), name
    records = [json.loads(text) for text in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["iteration"] == 0
    _finite_record(records[0], critic_free)
    assert math.isfinite(summary["eval_score_final"]) and math.isfinite(summary["eval_score_initial"])
    assert re.search(r"^eval score -?\d", result.stdout, flags=re.MULTILINE), result.stdout
