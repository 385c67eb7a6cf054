"""The ``ppo-ref`` command's CPU thread policy (``ppo_ref_entry``, issue 24 part 2): one thread and a
passive OpenMP wait policy unless the command line, the config file or the environment says
otherwise, set before torch loads; the run says what is in force."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli_as_a_user import PPO_REF, SMALL
from tiny_task import write_tiny_inputs

import ppo_ref_entry
from ppo_ref.trainer import TrainerConfig


@pytest.mark.parametrize(
    ("argv", "environ", "threads", "expected_env"),
    [
        ([], {}, 1, {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}),
        (["train", "--threads", "2"], {}, 2, {"OMP_NUM_THREADS": "2"}),
        (["train", "--threads=2"], {"OMP_NUM_THREADS": "4"}, 2, {"OMP_NUM_THREADS": "2"}),
        (["train"], {"OMP_NUM_THREADS": "3"}, 3, {"OMP_NUM_THREADS": "3"}),
        (["train", "--threads", "0"], {}, None, {}),
        (["train"], {"OMP_WAIT_POLICY": "ACTIVE"}, 1, {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "ACTIVE"}),
        # an unreadable value is the command parser's to report: the policy takes its default
        (["train", "--threads", "two"], {}, 1, {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}),
        # after "--" nothing is a flag
        (["train", "--", "--threads", "2"], {}, 1, {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}),
    ],
)
def test_policy_sets_threads_and_wait_policy(
    argv: list[str], environ: dict[str, str], threads: int | None, expected_env: dict[str, str]
) -> None:
    env = dict(environ)
    assert ppo_ref_entry.apply_thread_policy(argv, env) == threads
    assert env == expected_env


def test_config_file_threads_count_below_the_flag(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text("threads = 2\niterations = 3\n")
    env: dict[str, str] = {"OMP_NUM_THREADS": "4"}
    assert ppo_ref_entry.apply_thread_policy(["train", "--config", str(config)], env) == 2
    assert ppo_ref_entry.apply_thread_policy(["train", "--config", str(config), "--threads", "1"], env) == 1
    assert ppo_ref_entry.apply_thread_policy(["train", "--config", str(tmp_path / "missing.toml")], {}) == 1


def test_threads_is_a_checked_config_field() -> None:
    assert TrainerConfig(threads=2).threads == 2
    assert TrainerConfig().threads is None
    with pytest.raises(ValueError, match="threads"):
        TrainerConfig(threads=-1)


def _command(*argv: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    command = [str(PPO_REF)] if PPO_REF.exists() else [sys.executable, "-m", "ppo_ref_entry"]
    return subprocess.run(
        [*command, *argv], env={**env, **(env_extra or {})}, capture_output=True, text=True, timeout=600
    )


@pytest.mark.multiprocess
def test_the_command_runs_on_one_passive_thread_by_default(tmp_path: Path) -> None:
    inputs = write_tiny_inputs(tmp_path)
    out = tmp_path / "run"
    result = _command(
        "train", "--policy", inputs["policy"], "--prompts", inputs["prompts"], *SMALL, "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    assert "CPU threads: 1 (OMP_WAIT_POLICY PASSIVE; --threads N to change)" in result.stderr
    assert (out / "summary.json").exists()


@pytest.mark.multiprocess
def test_the_command_takes_threads_from_the_flag_and_the_environment(tmp_path: Path) -> None:
    # a missing policy path stops the run right after the thread line (exit 2), so no training is paid for
    missing = ["--policy", str(tmp_path / "nope"), "--out", str(tmp_path / "run")]
    flag = _command("train", "--threads", "2", *missing)
    assert flag.returncode == 2
    assert "CPU threads: 2 (OMP_WAIT_POLICY OpenMP's default; --threads N to change)" in flag.stderr
    env = _command("train", *missing, env_extra={"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"})
    assert "CPU threads: 2 (OMP_WAIT_POLICY PASSIVE; --threads N to change)" in env.stderr
