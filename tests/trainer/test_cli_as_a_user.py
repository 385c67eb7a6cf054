"""The ``ppo-ref`` command as a user types it (subprocesses): bad values stop before any work with
exit status 2 and a short message, an existing run is never overwritten silently, ``--overwrite``
replaces a run's files cleanly, ``--reward module:function`` trains on a Python function and the
summary says so, and ``--help`` describes the tasks, their rewards and the exit codes (issue 15).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_task import write_tiny_inputs

REPO = Path(__file__).resolve().parents[2]
PPO_REF = Path(sys.executable).with_name("ppo-ref")
pytestmark = pytest.mark.multiprocess  # every test starts the ppo-ref command in a subprocess


def ppo_ref(
    *argv: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``ppo-ref`` script as a user would."""
    command = [str(PPO_REF)] if PPO_REF.exists() else [sys.executable, "-m", "ppo_ref.cli"]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [*command, *argv], cwd=cwd or REPO, env=full_env, capture_output=True, text=True, timeout=600
    )


SMALL = [
    "--iterations", "1", "--rollout-batch-size", "4", "--max-new-tokens", "4", "--num-minibatches", "2",
    "--ppo-epochs", "1", "--eval-samples", "2", "--no-progress-bar", "--no-tensorboard",
]  # fmt: skip


def _bad(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 2, result.stderr
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) <= 3, result.stderr  # a short message, not the usage
    assert "building task" not in result.stderr  # stopped before any work


# -- every kind of bad value: exit status 2, before any work -------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # an unknown flag, with a suggestion
        (["--iteratoins", "3"], "unrecognized arguments: --iteratoins 3 (did you mean --iterations?)"),
        # a value of the wrong type, a non-finite number, a choice outside the list
        (["--iterations", "ten"], "expected an integer for iterations, got 'ten'"),
        (["--clip-eps", "nan"], "expected a finite number for clip_eps, got 'nan'"),
        (["--critic", "shared"], "expected one of policy, reward, value-head for critic"),
        # a number out of range, written with an exponent (parsed, then refused by the range check)
        (["--learning-rate", "-1e-4"], "config field 'learning_rate': expected a number > 0"),
        (["--iterations", "0"], "config field 'iterations': expected an int >= 1"),
        # a relation between fields
        (["--num-minibatches", "3"], "config field 'num_minibatches': expected a divisor"),
        # an unknown task, a missing path, a directory that is not a checkpoint
        (["--task", "nope"], "config field 'task': unknown task 'nope'"),
        (["--policy", "/does/not/exist"], "config field 'policy': /does/not/exist does not exist"),
        (["--policy", "."], "config field 'policy': . is not a local Hugging Face checkpoint"),
        # a reward function that does not import
        (["--reward", "no_such_module_xyz:score"], "cannot import module 'no_such_module_xyz'"),
        # a config file that does not exist; a resume path without a checkpoint
        (["--config", "/does/not/exist.toml"], "--config /does/not/exist.toml: cannot read the file"),
        (["--resume", "/does/not/exist"], "resume: /does/not/exist does not exist"),
    ],
)
def test_bad_values_stop_before_any_work(tmp_path: Path, argv: list[str], message: str) -> None:
    out = tmp_path / "out"
    _bad(ppo_ref("train", *argv, "--out", str(out)), message)
    assert not out.exists()


def test_a_negative_exponent_value_parses(tmp_path: Path) -> None:
    """``--missing-eos-score -1e-1`` is a value, not a flag (argparse alone says "expected one argument")."""
    result = ppo_ref(
        "train", "--missing-eos-score", "-1e-1", "--iterations", "0", "--out", str(tmp_path / "o")
    )
    _bad(result, "config field 'iterations'")  # the number was accepted; the next field is checked
    assert "expected one argument" not in result.stderr


def test_bad_files_stop_before_any_work(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a"}\n{"prompt": 3}\n')
    _bad(ppo_ref("train", "--prompts", str(prompts), "--out", str(tmp_path / "o")), "prompts.jsonl:2:")
    toml = tmp_path / "run.toml"
    toml.write_text("iteratoins = 3\n")
    _bad(ppo_ref("train", "--config", str(toml)), "unknown config field 'iteratoins'")
    toml.write_text('reward = "no_such_module_xyz:score"\n')
    _bad(ppo_ref("train", "--config", str(toml)), "cannot import module 'no_such_module_xyz'")
    reward = tmp_path / "wrong_reward.py"
    reward.write_text("def score(prompts):\n    return [0.0]\n\nNOT_CALLABLE = 3\n")
    _bad(ppo_ref("train", "--reward", "wrong_reward:score", cwd=tmp_path), "must accept (prompts, responses)")
    _bad(ppo_ref("train", "--reward", "wrong_reward:NOT_CALLABLE", cwd=tmp_path), "is a int, not a function")
    _bad(ppo_ref("train", "--reward", "wrong_reward:missing", cwd=tmp_path), "has no attribute 'missing'")
    assert not (tmp_path / "ppo-ref-run").exists() and not (tmp_path / "o").exists()


# -- --out: never a silent overwrite; a file or an unwritable place is refused ------------------------


def test_an_existing_run_is_refused_and_named_options_are_offered(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "checkpoints" / "iter-000003").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"iteration": 0}\n')
    result = ppo_ref("train", "--out", str(out))
    _bad(result, f"--out {out} holds a run")
    assert "--overwrite" in result.stderr and f"--resume {out}" in result.stderr
    assert (out / "metrics.jsonl").read_text() == '{"iteration": 0}\n'  # untouched
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    _bad(ppo_ref("train", "--out", str(other)), f"--out {other} is not empty")


def test_an_out_that_is_a_file_or_cannot_be_written_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    _bad(ppo_ref("train", "--out", str(file)), f"--out {file}: is a file")
    _bad(ppo_ref("train", "--out", str(file / "run")), "which is a file")
    _bad(ppo_ref("train", "--out", "/proc/ppo-ref-run/x"), "--out /proc/ppo-ref-run/x: cannot")
    if os.geteuid() != 0:  # root writes anywhere; /proc above stands in for it there
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        _bad(ppo_ref("train", "--out", str(locked / "run")), "not writable")
    assert file.read_text() == "x"


@pytest.mark.slow
def test_overwrite_replaces_the_runs_files_cleanly(tmp_path: Path) -> None:
    inputs = write_tiny_inputs(tmp_path)
    out = tmp_path / "run"
    (out / "checkpoints" / "iter-000009").mkdir(parents=True)
    (out / "tensorboard").mkdir()
    (out / "tensorboard" / "events.out.tfevents.old").write_text("old")
    (out / "metrics.jsonl").write_text('{"iteration": 41}\n')
    (out / "score.png").write_text("old plot")
    (out / "notes.txt").write_text("not a run file")
    argv = ["train", "--policy", inputs["policy"], "--prompts", inputs["prompts"], "--out", str(out), *SMALL]
    result = ppo_ref(
        *argv,
        "--reward",
        "tiny_task:count_a",
        "--overwrite",
        env={
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])
            )
        },
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["iter-000001"]  # no stale one
    assert not (out / "tensorboard").exists()  # the old events are gone (the new run writes none)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0]
    assert (out / "score.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "notes.txt").read_text() == "not a run file"  # only the run's own files go


# -- a Python reward function from the command line and from TOML; the summary says what scored -------


REWARD_MODULE = '''
def vowels(prompts, responses):
    """One score per response: the share of vowels."""
    assert len(prompts) == len(responses)
    return [sum(c in "aeiou" for c in r) / max(len(r), 1) for r in responses]
'''


@pytest.mark.slow
def test_reward_module_function_from_the_command_line_and_toml(tmp_path: Path) -> None:
    inputs = write_tiny_inputs(tmp_path)
    (tmp_path / "my_rewards.py").write_text(REWARD_MODULE)
    base = ["train", "--policy", inputs["policy"], "--prompts", inputs["prompts"], *SMALL]
    result = ppo_ref(*base, "--reward", "my_rewards:vowels", "--out", "flag", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "flag" / "summary.json").read_text())
    assert summary["reward"] == {
        "training": "function my_rewards:vowels (--reward)",
        "evaluation": "function my_rewards:vowels (--reward)",
    }
    assert summary["config"]["reward"] == "my_rewards:vowels"
    assert summary["config"]["task"] is None  # no built-in task was used: none is claimed
    # The plots are titled with the metric and the run (its reward, then its policy), and the
    # critic's explained variance has one.
    run = f"reward my_rewards:vowels (policy {inputs['policy']}), seed 0"
    for name, label in (("score.png", "mean score"), ("explained_variance.png", "critic explained variance")):
        png = (tmp_path / "flag" / name).read_bytes()
        assert png[:4] == b"\x89PNG"
        assert f"Title\x00{label} - {run}".encode() in png
    audit = [json.loads(line) for line in (tmp_path / "flag" / "rollouts.jsonl").read_text().splitlines()]
    for item in audit:
        text = item["response"]
        expected = sum(c in "aeiou" for c in text) / max(len(text), 1)
        if item["stop_reason"] == "eos":  # a cut response gets the missing-EOS score instead
            assert item["score_components"]["raw"] == pytest.approx(expected)
    (tmp_path / "run.toml").write_text('reward = "my_rewards:vowels"\n')
    result = ppo_ref(*base, "--config", "run.toml", "--out", "toml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "toml" / "summary.json").read_text())["reward"] == summary["reward"]


# -- help, and a first line of output at once ----------------------------------------------------------


def test_help_describes_tasks_rewards_and_exit_codes() -> None:
    result = ppo_ref("train", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    from ppo_ref.tasks import TASKS

    for name in TASKS:
        assert f" {name} " in text
    for words in (
        "reward: the mean lexicon value",  # positive-review
        "reward 1 if exactly right, else 0",  # reverse
        "clip(1 - |words - 5| / 3, -1, 1)",  # length
        "--reward module:function",
        "function(prompts: list[str], responses: list[str]) -> list[float]",
        "exit status: 0 done; 1",
        "2 a bad command line",
        "130 stopped by SIGINT/SIGTERM",
        "--overwrite",
    ):
        assert words in text, words


def test_help_does_not_import_the_trainer() -> None:
    """--help is quick because it imports neither transformers nor accelerate (only torch, through
    ppo_ref's math)."""
    code = (
        "import sys\nfrom ppo_ref import cli\n"
        "try:\n    cli.main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('transformers', 'accelerate', 'ppo_ref.trainer.loop') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.slow
def test_the_command_says_what_it_is_doing_before_the_long_steps(tmp_path: Path) -> None:
    inputs = write_tiny_inputs(tmp_path)
    (tmp_path / "my_rewards.py").write_text(REWARD_MODULE)
    argv = ["train", "--policy", inputs["policy"], "--prompts", inputs["prompts"], *SMALL]
    result = ppo_ref(*argv, "--reward", "my_rewards:vowels", "--out", "run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("ppo-ref train: ")]
    steps = [line.removeprefix("ppo-ref train: ").split(":")[0].split(" ")[0] for line in lines]
    # the thread policy in force, the prompts file read, then the work in order
    assert steps == ["CPU", "12", "loading", "initial", "PPO", "final", "writing"], lines
