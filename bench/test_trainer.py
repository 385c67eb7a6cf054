"""ppo-ref's trainer at the benchmark settings (``bench/tiny_ppo.py``): one iteration, its bare
model work, the overhead ratio, peak memory, and the conformance suite's wall time.

The comparison with TRL 1.12's ``PPOTrainer`` needs TRL's own environment and is run, interleaved
with ppo-ref's iterations, by ``tools/run_bench.py``; the last test here only checks that TRL's
side (``bench/trl_iteration.py``) still runs, where ``.envs/trl`` exists.

Set ``OMP_WAIT_POLICY=PASSIVE`` on a loaded machine (``tools/run_bench.py`` does): with the default
spinning OpenMP threads, two threads on two busy cores make each op wait for a descheduled thread.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import tiny_ppo as s
from bench.ppo_ref_side import BareCompute, TrainStepper, make_trainer
from ppo_ref.trainer.metrics import REQUIRED_METRICS
from tests.thirdparty_env import thirdparty_python

ROOT = Path(__file__).resolve().parent.parent
WARMUP_ITERATIONS = 2
ROUNDS = 16
TOKENS_PER_ITERATION = s.BATCH * s.RESPONSE_TOKENS


def _disabled(benchmark: Any) -> bool:
    return bool(getattr(benchmark, "disabled", False))


@pytest.fixture(scope="module")
def trainer_and_stepper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, TrainStepper]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(s.THREADS)
    trainer = make_trainer(str(tmp_path_factory.mktemp("ppo-ref-bench")))
    bare = BareCompute(trainer)  # copies the models before any update
    trainer.bench_bare = bare
    stepper = TrainStepper(trainer)
    for _ in range(WARMUP_ITERATIONS):
        stepper.step()
    yield trainer, stepper
    stepper.close()
    torch.set_num_threads(threads)


def _subprocess_json(command: list[str], timeout: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRL_EXPERIMENTAL_SILENCE": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    last = [line for line in done.stdout.splitlines() if line.startswith('{"')][-1]
    result: dict[str, Any] = json.loads(last)
    return result


def test_trainer_iteration(benchmark: Any, trainer_and_stepper: tuple[Any, TrainStepper]) -> None:
    """One iteration of ``PPOTrainer.train()`` (rollout + update + checks + metrics), warm-up excluded."""
    _, stepper = trainer_and_stepper
    logged_before = len(stepper.metrics_records())
    benchmark.group = "trainer iteration (tiny GPT-2, batch 64, 32 tokens, 4x4 minibatches)"
    benchmark.pedantic(stepper.step, rounds=1 if _disabled(benchmark) else ROUNDS, iterations=1)
    records = stepper.metrics_records()
    new = records[logged_before:]
    assert len(new) == (1 if _disabled(benchmark) else ROUNDS), "one metrics record per iteration"
    for record in new:
        missing = [name for name in REQUIRED_METRICS if name not in record]
        assert not missing, f"metrics.jsonl lacks {missing}"
        assert record["logprob_check_max_abs_diff"] <= 1e-3  # the step-0 check ran and passed
        assert record["response_length"] == s.RESPONSE_TOKENS
    if not _disabled(benchmark):
        median = benchmark.stats.stats.median
        benchmark.extra_info["tokens_per_second"] = TOKENS_PER_ITERATION / median
    benchmark.extra_info["stage_seconds_median"] = {  # seconds_iteration also counts the pause
        key: statistics.median(r[key] for r in new)
        for key in new[0]
        if key.startswith("seconds_") and key != "seconds_iteration"
    }
    # Peak RSS of a fresh process that only builds the trainer and runs iterations.
    iterations = 2 if _disabled(benchmark) else 8
    measured = _subprocess_json(
        [sys.executable, "-m", "bench.ppo_ref_side", "--warmup", "1", "--iterations", str(iterations)],
        timeout=900,
    )
    benchmark.extra_info["peak_rss_bytes"] = measured["peak_rss_bytes"]
    assert measured["iterations_logged"] == iterations + 1


@pytest.mark.parametrize("part", ["generate", "forwards", "update"])
def test_bare_compute(benchmark: Any, trainer_and_stepper: tuple[Any, TrainStepper], part: str) -> None:
    """The model work of an iteration alone: generation, the four no-grad forwards, 16 update steps."""
    trainer, _ = trainer_and_stepper
    bare: BareCompute = trainer.bench_bare
    call = {"generate": bare.generate, "forwards": bare.forwards, "update": bare.update}[part]
    benchmark.group = "bare compute of one iteration"
    call()  # warm-up
    before = [p.detach().clone() for p in bare.policy.parameters()]
    result = benchmark.pedantic(call, rounds=1 if _disabled(benchmark) else 8, iterations=1)
    rows, width = s.BATCH, bare.sequences.response_width
    if part == "generate":
        assert result.response_ids.shape == result.response_mask.shape
        assert result.response_ids.shape[0] == rows and 1 <= result.response_ids.shape[1] <= s.RESPONSE_TOKENS
        assert result.ended.shape == (rows,) and bool(result.response_mask.any(dim=1).all())
    elif part == "forwards":
        assert result["policy_logits"].shape == result["reference_logits"].shape
        assert result["policy_logits"].shape[:2] == (rows, width + 1)
        assert result["values"].shape == (rows, width + 1) and result["scores"].shape[0] == rows
        assert all(bool(torch.isfinite(t).all()) for t in result.values())
    else:
        steps = bare.config.ppo_epochs * bare.config.rollout_batch_size // bare.config.minibatch_size
        assert len(result) == steps and all(bool(torch.isfinite(loss)) for loss in result)
        after = list(bare.policy.parameters())
        assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True)), "no parameter moved"


def test_overhead(benchmark: Any, trainer_and_stepper: tuple[Any, TrainStepper]) -> None:
    """Iteration time over its bare compute, measured alternately so that machine load cancels."""
    trainer, stepper = trainer_and_stepper
    bare: BareCompute = trainer.bench_bare
    ratios: list[float] = []

    def one_pair() -> None:
        iteration = stepper.step()
        parts = bare.measure(repeats=1)
        ratios.append(iteration / parts["bare"])

    benchmark.group = "overhead: iteration / bare compute"
    benchmark.pedantic(one_pair, rounds=1 if _disabled(benchmark) else 8, iterations=1)
    benchmark.extra_info["overhead_ratio_median"] = statistics.median(ratios)
    benchmark.extra_info["overhead_ratios"] = ratios
    assert all(r > 0 for r in ratios)


def test_conformance_suite_wall_time(benchmark: Any) -> None:
    """``pytest conformance/ --impl=mine``, the whole suite, in a subprocess."""
    command = [sys.executable, "-m", "pytest", "conformance/", "--impl=mine", "-q", "-p", "no:cacheprovider"]
    outcome: dict[str, Any] = {}

    def run_suite() -> None:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        outcome["returncode"] = done.returncode
        outcome["summary"] = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""

    benchmark.group = "conformance suite against mine"
    started = time.perf_counter()
    benchmark.pedantic(run_suite, rounds=1, iterations=1)
    benchmark.extra_info["wall_seconds"] = time.perf_counter() - started
    benchmark.extra_info["summary"] = outcome["summary"]
    assert outcome["returncode"] == 0, outcome["summary"]


@pytest.mark.thirdparty
def test_trl_side_runs() -> None:
    """TRL 1.12's PPOTrainer at the same settings still runs (timed against ppo-ref by run_bench)."""
    python = thirdparty_python("trl")  # skips where .envs/trl is missing; fails under PPO_REF_REQUIRE_ENVS=1
    measured = _subprocess_json(
        [str(python), "-m", "bench.trl_iteration", "--warmup", "1", "--iterations", "2"], timeout=900
    )
    assert measured["versions"]["trl"] == "1.12.0"
    assert measured["iterations"] == 2 and measured["median_seconds_per_iteration"] > 0
