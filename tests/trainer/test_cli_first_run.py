"""What a new user hits on a first run (issue 24), each as the user types it: how to type the
command after ``./dev train``, the trainer's packages missing from a suite-only install, a reward
function returning the wrong number of scores (stopped before the task build), a run whose scores
are all the same (one warning), blank lines in a prompts file (counted), and the plots of a
``--reward`` run (titled with the reward).

The suite-only install itself (the wheel without the extra ``trainer``) is built and run in
``tests/test_wheel_install.py`` (slow).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import warnings
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_cli_as_a_user import SMALL, ppo_ref
from tiny_task import PROMPTS, tiny_config, tiny_setup, write_tiny_inputs

from ppo_ref.trainer import PPOTrainer
from ppo_ref.trainer.metrics import IDENTICAL_SCORE_ITERATIONS, IdenticalScoreWatch
from ppo_ref.trainer.requirements import EXTRA, missing_requirements, missing_trainer_message
from ppo_ref.trainer.setup import load_prompts, probe_reward_function, prompts_file_summary
from tests.docs_text import section

REPO = Path(__file__).resolve().parents[2]

# -- a. after ./dev train: the command is .venv/bin/ppo-ref ------------------------------------------


def test_dev_train_says_how_to_type_the_command_and_keeps_its_exit_status(tmp_path: Path) -> None:
    """``./dev train`` with an installed .venv (stand-ins for python and ppo-ref: no install runs)."""
    shutil.copy2(REPO / "dev", tmp_path / "dev")
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, body in (("python", "exit 0"), ("ppo-ref", 'echo "ppo-ref $*"; exit 3')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (tmp_path / ".venv" / ".ppo-ref-installed").touch()  # newer than pyproject.toml: setup is done
    result = subprocess.run(
        ["./dev", "train", "--iterations", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 3, result.stderr  # the command's own status
    assert result.stdout.strip() == "ppo-ref train --iterations 2"
    assert "run it as .venv/bin/ppo-ref" in result.stderr
    assert "source .venv/bin/activate" in result.stderr


def test_the_readmes_training_section_says_where_the_command_is() -> None:
    quick_start = section("Quick start")  # README.md
    training = section("Training with the built-in trainer", subsections=False)  # docs/trainer.md
    for text in (quick_start, training):
        assert ".venv/bin/ppo-ref" in text and "source .venv/bin/activate" in text


# -- c. the suite-only install: ppo-ref train names the missing extra ---------------------------------


def test_missing_requirements_reads_an_extra_from_the_installed_metadata() -> None:
    # Hypothesis' extras, as installed here: django is not installed, numpy is, and a requirement
    # with a platform marker besides the extra (tzdata on Windows) is not counted.
    assert missing_requirements("hypothesis", "django") == ["django"]
    assert missing_requirements("hypothesis", "numpy") == []
    assert missing_requirements("hypothesis", "zoneinfo") == []
    assert missing_requirements("no-such-distribution-xyz") == []  # a source tree: nothing to read
    with pytest.raises(ValueError, match="distribution: expected a distribution name"):
        missing_requirements("")
    with pytest.raises(ValueError, match="extra: expected the name of an extra"):
        missing_requirements("ppo-ref", "")


def test_ppo_ref_train_without_the_trainer_extra_stops_at_once_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The message of the suite-only install; the real install is in tests/test_wheel_install.py."""
    from ppo_ref import cli
    from ppo_ref.trainer import requirements

    monkeypatch.setattr(requirements, "missing_requirements", lambda: ["transformers", "accelerate"])
    assert cli.main(["train", "--iterations", "1"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("ppo-ref train: error: the trainer needs transformers, accelerate, not installed")
    assert f'pip install "ppo-ref[{EXTRA}]"' in error and "building task" not in error
    with pytest.raises(ValueError, match="missing: expected a non-empty list"):
        missing_trainer_message([])


# -- f. a reward function with the wrong number of scores: stopped before any work --------------------

WRONG_COUNTS = """
def one(prompts, responses):
    return [0.5]


def scalar(prompts, responses):
    return 0.5


def picky(prompts, responses):
    raise KeyError("only my own prompts")  # left to the run, which checks every batch
"""


@pytest.mark.multiprocess
def test_a_reward_function_with_the_wrong_number_of_scores_stops_before_the_task_is_built(
    tmp_path: Path,
) -> None:
    (tmp_path / "wrong_counts.py").write_text(WRONG_COUNTS)
    for name, message in (("one", "returned 1 score for a probe batch of 3"), ("scalar", "returned a float")):
        result = ppo_ref("train", "--reward", f"wrong_counts:{name}", cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert f"config field 'reward': 'wrong_counts:{name}' {message}" in result.stderr
        assert "building task" not in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "ppo-ref-run").exists()


def test_the_probe_checks_the_count_only() -> None:
    def picky(prompts: list[str], responses: list[str]) -> list[float]:
        raise KeyError("only my own prompts")

    probe_reward_function(picky, "m:picky")  # raises on made-up input: left to the run
    probe_reward_function(lambda p, r: [0.0] * len(r), "m:ok", ["x"])
    probe_reward_function(lambda p, r: torch.zeros(len(r)), "m:tensor")
    seen: list[list[str]] = []
    probe_reward_function(lambda p, r: seen.append(p) or [0.0] * len(r), "m:s", ["first", "second"])
    assert seen == [["first", "second", "first"]]  # the prompts file's prompts, when there is one
    with pytest.raises(ValueError, match="returned 4 scores for a probe batch of 3 responses"):
        probe_reward_function(lambda p, r: [0.0] * 4, "m:four")
    with pytest.raises(ValueError, match="returned a Tensor"):
        probe_reward_function(lambda p, r: torch.tensor(0.0), "m:zero_d")
    with pytest.raises(ValueError, match="function: expected a callable"):
        probe_reward_function(3, "m:x")  # type: ignore[arg-type]


# -- g. every score the same for several iterations: one warning --------------------------------------


def _rollout(iteration: int, scores: list[float], valid: list[bool] | None = None) -> SimpleNamespace:
    mask = torch.tensor(valid if valid is not None else [True] * len(scores))
    return SimpleNamespace(iteration=iteration, scored=SimpleNamespace(raw=torch.tensor(scores)), valid=mask)


def test_the_identical_score_watch_warns_once_after_the_set_number_of_iterations() -> None:
    watch = IdenticalScoreWatch(iterations=3)
    same = [0.25, 0.25, 0.25, 0.25]
    assert watch.observe(_rollout(0, same)) is None  # type: ignore[arg-type]
    assert watch.observe(_rollout(1, [0.0, 1.0, 0.0, 0.0])) is None  # type: ignore[arg-type]
    assert watch.observe(_rollout(2, same)) is None  # type: ignore[arg-type]
    assert watch.observe(_rollout(3, same)) is None  # type: ignore[arg-type]
    message = watch.observe(_rollout(4, same))  # type: ignore[arg-type]
    assert message is not None and "iterations 3-5" in message and "score 0.25" in message
    assert watch.observe(_rollout(5, same)) is None  # type: ignore[arg-type]  # once per run
    # a skipped sample does not count, and one valid sample is no evidence either way
    other = IdenticalScoreWatch(iterations=1)
    assert other.observe(_rollout(0, [1.0, float("nan")], [True, False])) is None  # type: ignore[arg-type]
    assert other.observe(_rollout(1, [1.0, 2.0, 2.0], [False, True, True])) is not None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="iterations: expected an int >= 1"):
        IdenticalScoreWatch(iterations=0)


def test_a_python_run_with_a_constant_reward_warns_once(out_dir: Path) -> None:
    iterations = IDENTICAL_SCORE_ITERATIONS + 1
    config = tiny_config(out_dir, iterations=iterations, ppo_epochs=1, eval_samples=2, audit_samples=0)
    trainer = PPOTrainer(config, replace(tiny_setup(), reward_function=lambda p, r: [0.5] * len(r)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    flat = [w for w in caught if "the reward gave every response the same score" in str(w.message)]
    assert len(flat) == 1 and flat[0].category is RuntimeWarning
    assert f"iterations 1-{IDENTICAL_SCORE_ITERATIONS}" in str(flat[0].message)


# -- g, h, i on the command line: one run of a constant reward on a prompts file with blank lines ------

CONSTANT = """
def half(prompts, responses):
    return [0.5 for _ in responses]
"""


@pytest.mark.slow  # about 14 s: builds a tiny checkpoint, then 4 iterations with plots
@pytest.mark.multiprocess
def test_a_constant_reward_run_warns_once_counts_blank_lines_and_titles_plots_with_the_reward(
    tmp_path: Path,
) -> None:
    inputs = write_tiny_inputs(tmp_path)
    prompts = Path(inputs["prompts"])
    lines = prompts.read_text().splitlines()
    prompts.write_text("\n".join([lines[0], "", *lines[1:5], "   ", *lines[5:]]) + "\n")
    (tmp_path / "constant.py").write_text(CONSTANT)
    iterations = str(IDENTICAL_SCORE_ITERATIONS + 1)
    small = [*SMALL, "--iterations", iterations, "--plots", "--progress-bar"]
    result = ppo_ref(
        "train", "--policy", inputs["policy"], "--prompts", str(prompts), "--reward", "constant:half",
        *small, "--out", "run", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    train, held_out = load_prompts(prompts, 0)
    assert len(train) + len(held_out) == len(PROMPTS)
    counted = f"{len(PROMPTS)} prompts from {prompts} ({len(train)} for training, {len(held_out)} held out)"
    assert f"ppo-ref train: {counted}; 2 blank lines skipped" in result.stderr
    assert result.stderr.count("the reward gave every response the same score") == 1, result.stderr
    first_ones = f"iterations 1-{IDENTICAL_SCORE_ITERATIONS}"
    assert (
        f"ppo-ref train: warning: the reward gave every response the same score within each of {first_ones}"
        in result.stderr
    )
    png = (tmp_path / "run" / "score.png").read_bytes()
    assert f"Title\x00mean score - reward constant:half (policy {inputs['policy']}), seed 0".encode() in png
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["iterations_done"] == int(iterations)


def test_the_prompts_summary_counts_blank_lines_but_not_the_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    rows = [json.dumps({"prompt": p}) for p in PROMPTS]
    path.write_text("\n".join(rows) + "\n")
    assert prompts_file_summary(path, 0) == f"12 prompts from {path} (11 for training, 1 held out)"
    path.write_text("\n" + "\n\n".join(rows) + "\n \n")
    assert prompts_file_summary(path, 0).endswith("; 13 blank lines skipped")
    assert load_prompts(path, 0)[0] == load_prompts(tmp_path / "p.jsonl", 0)[0]
    path.write_text(rows[0] + "\n\r\n" + rows[1])  # CRLF blank line, no final newline
    assert prompts_file_summary(path, 0).endswith("; 1 blank line skipped")


def test_help_says_blank_prompt_lines_are_skipped(capsys: pytest.CaptureFixture[str]) -> None:
    from ppo_ref import cli

    with pytest.raises(SystemExit) as done:
        cli.main(["train", "--help"])
    assert done.value.code == 0
    assert "blank lines are skipped, and the command says how many" in " ".join(
        capsys.readouterr().out.split()
    )
