"""Helpers of the reliability tests: the tiny task, local checkpoints for the CLI, subprocess runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))

from tiny_task import tiny_reward_model, tiny_tokenizer, write_tiny_inputs

from tests.model_fixtures import TIMING, launch, one_thread, out_dir  # noqa: F401  (re-exported to the test modules)

REPO = Path(__file__).resolve().parents[2]


def write_local_inputs(directory: Path) -> dict[str, Path]:
    """A tiny policy (with tokenizer), a tiny reward model and a prompts file, as the CLI takes them."""
    paths = {name: Path(path) for name, path in write_tiny_inputs(directory).items()}
    paths["reward"] = directory / "reward"
    tiny_reward_model(tiny_tokenizer()).save_pretrained(paths["reward"])
    return paths


def cli_args(inputs: dict[str, Path], out: Path, iterations: int, *extra: str) -> list[str]:
    """``train`` arguments for a small run on the local inputs (no progress bar, TensorBoard or plots)."""
    return [
        "train",
        "--policy",
        str(inputs["policy"]),
        "--reward",
        str(inputs["reward"]),
        "--prompts",
        str(inputs["prompts"]),
        "--out",
        str(out),
        "--iterations",
        str(iterations),
        "--rollout-batch-size",
        "8",
        "--max-new-tokens",
        "5",
        "--num-minibatches",
        "2",
        "--ppo-epochs",
        "1",
        "--eval-samples",
        "4",
        "--audit-samples",
        "1",
        "--no-progress-bar",
        "--no-tensorboard",
        "--no-plots",
        *extra,
    ]


def start_cli(args: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    """``python -m ppo_ref.cli ARGS`` in a new process (one thread), its output in ``log``."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    with open(log, "wb") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "ppo_ref.cli", *args],
            cwd=REPO,
            env=environment,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )


def wait_for(
    condition: Callable[[], bool], process: subprocess.Popen[bytes], log: Path, timeout: float
) -> None:
    """Poll ``condition`` until it holds; fail (with the process's output) on timeout or early exit."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the run ended (status {process.returncode}) first:\n{log.read_text()}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"timed out after {timeout} s:\n{log.read_text()}")
        time.sleep(0.05)


def read_records(path: Path) -> list[dict[str, object]]:
    """The JSON records of a JSONL file (metrics.jsonl, rollouts.jsonl)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_close(first: Sequence[object], second: Sequence[object], what: str = "") -> None:
    """Floats equal to 1e-9 (relative, absolute below 1), anything else exactly equal."""
    for a, b in zip(first, second, strict=True):
        if isinstance(a, float) and isinstance(b, float):
            assert abs(a - b) <= 1e-9 * max(1.0, abs(a)), (what, a, b)
        else:
            assert a == b, (what, a, b)


def assert_runs_agree(one: Path, two: Path, rows: int, data_parallel: str) -> None:
    """A one-process run directory ``one`` and a two-process one ``two`` made the same samples
    (``rows`` audit records, their advantages and old log-probs within :func:`assert_close`), the same
    statistics but for the timings (the KL controller did move) and the same final eval score; ``two``
    says it ran 2 processes of ``data_parallel``."""
    audit_one, audit_two = read_records(one / "rollouts.jsonl"), read_records(two / "rollouts.jsonl")
    assert len(audit_one) == len(audit_two) == rows
    for a, b in zip(audit_one, audit_two, strict=True):
        assert a["sample_index"] == b["sample_index"] and a["response_ids"] == b["response_ids"]
        assert a["action_mask"] == b["action_mask"] and a["score"] == b["score"]
        assert_close(a["advantages"], b["advantages"])
        assert_close(a["old_logprobs"], b["old_logprobs"])
    metrics_one, metrics_two = read_records(one / "metrics.jsonl"), read_records(two / "metrics.jsonl")
    for a, b in zip(metrics_one, metrics_two, strict=True):
        keys = [k for k in a if not k.startswith(TIMING)]
        assert keys == [k for k in b if not k.startswith(TIMING)]
        for key in keys:
            assert_close([a[key]], [b[key]], key)
    assert metrics_one[1]["kl_coef"] != metrics_one[0]["kl_coef"]  # the controller did move
    summary = json.loads((two / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["data_parallel"] == data_parallel
    assert summary["eval_score_final"] == json.loads((one / "summary.json").read_text())["eval_score_final"]


def free_port() -> int:
    """A TCP port free on this machine now (for a launcher's rendezvous)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
