"""``exit_launched_process``: a launched process ends with its status and its output, without the
teardown that can hang or abort it (the function's docstring; the launched tests end through it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ppo_ref.trainer.distributed import exit_launched_process

# One process of a run that has trained: stdout and a log line written but not flushed, then the exit.
_SCRIPT = """
import logging, sys
from accelerate import Accelerator
from ppo_ref.trainer.distributed import exit_launched_process

logging.basicConfig(stream=sys.stderr, format="%(message)s")
accelerator = Accelerator(cpu=True, mixed_precision="no")
sys.stdout.write("summary, unflushed")
logging.getLogger("run").warning("a logged line")
exit_launched_process(accelerator, int(sys.argv[1]))
print("after the exit")
"""


@pytest.mark.multiprocess
@pytest.mark.parametrize("status", [0, 3])
def test_the_process_ends_with_its_status_and_its_output(status: int) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as launched
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(status)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == status, done.stderr[-2000:]
    assert done.stdout == "summary, unflushed"  # flushed, and nothing ran after the exit
    assert "a logged line" in done.stderr


class _NotAnAccelerator:
    pass


@pytest.mark.parametrize("status", [-1, 256, 1.0, True, "0"])
def test_a_status_that_is_not_an_exit_status_is_refused(status: object) -> None:
    with pytest.raises(ValueError, match="status: expected an exit status from 0 to 255"):
        exit_launched_process(_NotAnAccelerator(), status)  # type: ignore[arg-type]


def test_something_that_is_not_an_accelerator_is_refused() -> None:
    with pytest.raises(
        ValueError, match="accelerator: expected an accelerate Accelerator, got _NotAnAccelerator"
    ):
        exit_launched_process(_NotAnAccelerator(), 0)  # type: ignore[arg-type]
