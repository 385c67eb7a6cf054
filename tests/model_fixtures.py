"""Fixtures shared by the test directories that train or run tiny models (``tests/trainer``,
``tests/reliability``); each imports them by name, so they live here once. Also what both do with
runs: :func:`assert_same_checkpoint` (a resumed run against a straight one), :func:`launch` and
:func:`torchrun` (several processes), :class:`TwoProcessesInOne` (two processes' shares, in one)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

__all__ = ["TwoProcessesInOne", "assert_same_checkpoint", "launch", "one_thread", "out_dir", "torchrun"]

REPO = Path(__file__).resolve().parents[1]

TIMING = ("seconds_", "tokens_per_second")
"""Prefixes of the metrics that measure time, which two equal runs do not share."""


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Run each test on one intra-op thread, then restore the setting.

    The models are tiny: a second thread buys nothing, and on a shared 2-core machine thread
    contention made the fast trainer tests 4x slower (33 s against 7.6 s, measured).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    """A not-yet-existing output directory for a run."""
    return tmp_path / "run"


def assert_same_checkpoint(first: Path, second: Path) -> None:
    """Every tensor of two checkpoints (models, optimizer moments and steps) is bitwise equal, and so
    are the trainer state's KL coefficient and the metrics but for the timings."""
    from ppo_ref.trainer import load_checkpoint

    one, two = load_checkpoint(first), load_checkpoint(second)
    assert one.iteration == two.iteration
    for name in ("policy", "critic", "reference"):
        a, b = one.state_dict(name), two.state_dict(name)
        assert a.keys() == b.keys()
        unequal = [k for k in a if not torch.equal(a[k], b[k])]
        assert not unequal, f"{name}: {unequal}"
    a_opt, b_opt = one.optimizer_state(), two.optimizer_state()
    assert a_opt is not None and b_opt is not None and a_opt["state"].keys() == b_opt["state"].keys()
    for key, values in a_opt["state"].items():
        for field, value in values.items():
            assert torch.equal(value, b_opt["state"][key][field]), (key, field)
    assert one.state["kl_coef"] == two.state["kl_coef"]

    def strip(records: list[dict[str, object]]) -> list[dict[str, object]]:
        return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in records]

    assert strip(one.metrics_records()) == strip(two.metrics_records())


def launch(command: list[str], timeout: float = 300) -> str:
    """Run a launcher command (torchrun, accelerate launch) from the repository on one thread per
    process; fail with the tail of its output unless it exits 0, else return its standard output."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"exit code {done.returncode} (negative: killed by that signal)\n"
        + done.stdout[-4000:]
        + done.stderr[-4000:]
    )
    return done.stdout


def torchrun(script: str | Path, *args: str, processes: int = 2, timeout: float = 300) -> str:
    """:func:`launch` ``script args`` as ``processes`` torchrun processes on this machine (the
    ``torchrun`` beside this Python, else ``python -m torch.distributed.run``); ``script`` ``-m``
    with a module first in ``args`` runs the module. Returns the processes' standard output."""
    command = Path(sys.executable).with_name("torchrun")
    launcher = [str(command)] if command.exists() else [sys.executable, "-m", "torch.distributed.run"]
    return launch(
        [*launcher, "--standalone", "--nproc_per_node", str(processes), str(script), *args], timeout
    )


class TwoProcessesInOne:
    """Collectives of process ``rank`` of 2, run one after the other in this process (no averaging:
    both ranks accumulate into the same ``.grad``, their sum, DDP's average x 2)."""

    world_size = 2
    gradient_scale = 1.0

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def all_true(self, flag: bool) -> bool:
        return flag

    def sum_and_max(self, sums: Sequence[float], maxima: Sequence[float]) -> tuple[list[float], list[float]]:
        return list(sums), list(maxima)
