"""The ``ppo-ref`` command's thread policy, idle and beside a CPU-bound job (issue 24, part 2).

    python bench/thread_policy.py                  # the default run, 2 rounds (~15-20 min on 2 cores)
    python bench/thread_policy.py --rounds 1 --quick  # a 1-iteration run: checks the pipeline (~2 min)

Times ``ppo-ref train`` at the README's defaults (what ``./dev train`` runs: the default task and
config, wall time of the whole command, task build included) under three policies, each idle and
beside a two-thread CPU-bound job (another process multiplying 512x512 float32 matrices on two torch
threads with OpenMP's default, spinning, wait policy: the shape of another user's job on a shared
machine), in interleaved rounds so that a change in the machine's own load hits every policy alike:

- ``default``: the command's policy (``ppo_ref_entry``): one thread, ``OMP_WAIT_POLICY=PASSIVE``;
- ``two-spinning``: ``--threads 2`` (torch's own default on these 2 cores, the command before the
  policy): two threads, OpenMP's spinning wait;
- ``two-passive``: ``--threads 2`` with ``OMP_WAIT_POLICY=PASSIVE`` (what the benchmarks set);
- ``two-spin-10k``: ``--threads 2`` with ``GOMP_SPINCOUNT=10000`` (libgomp, torch's OpenMP on Linux:
  a waiting worker spins 10,000 rounds, not OpenMP's default 300,000, then sleeps), the middle way
  between the two.

A run still going after ``--limit`` seconds (default :data:`LIMIT`) is stopped and recorded at the
limit, marked stopped: its time is a lower bound, and so is every median and ratio it enters. (On
2026-12-07 ``two-spinning`` beside the job took about 40 s per iteration, 80x its idle pace: its 50
iterations would have run for over half an hour, where the run of 2026-12-03 took 91-107 s.)

Writes ``bench/results/thread-policy.json`` (every run's wall time, which runs were stopped, the load
averages) and prints the medians and the ratios; ``bench/results_threads.py`` renders the section of
``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.trainer.golden_cpus import cpu_model  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "thread-policy.json"
POLICIES: dict[str, tuple[list[str], dict[str, str]]] = {
    "default": ([], {}),
    "two-spinning": (["--threads", "2"], {}),
    "two-passive": (["--threads", "2"], {"OMP_WAIT_POLICY": "PASSIVE"}),
    "two-spin-10k": (["--threads", "2"], {"GOMP_SPINCOUNT": "10000"}),
}
"""Policy name: (extra ppo-ref flags, extra environment)."""
QUICK = ["--iterations", "1", "--eval-samples", "16"]
LIMIT = 180.0
"""Seconds after which a run is stopped and recorded at this limit (a lower bound of its time)."""
LOAD_JOB = """
import torch
torch.set_num_threads(2)
a = torch.randn(512, 512)
while True:
    a = torch.tanh(a @ a) * 0.5
"""


def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "MKL_", "GOMP_"))}
    return {**env, **extra}


def run_once(policy: str, quick: bool, limit: float = LIMIT) -> tuple[float, list[float] | None]:
    """Wall seconds of one ``ppo-ref train`` at the defaults under ``policy``, and its held-out score
    before and after (``summary.json``: the figures vary with the thread count and the CPU); a run
    past ``limit`` seconds is stopped: ``(limit, None)``."""
    if limit <= 0:
        raise ValueError(f"limit: expected a positive number of seconds, got {limit}")
    flags, env = POLICIES[policy]
    out = Path(tempfile.mkdtemp(prefix="ppo-ref-threads-"))
    command = [str(Path(sys.executable).with_name("ppo-ref")), "train", "--out", str(out / "run"), *flags]
    command += ["--no-progress-bar", "--no-tensorboard", "--no-plots", *(QUICK if quick else [])]
    started = time.perf_counter()
    try:
        result = subprocess.run(
            command, env=_clean_env(env), capture_output=True, text=True, check=False, timeout=limit
        )
    except subprocess.TimeoutExpired:  # subprocess.run has killed it
        shutil.rmtree(out, ignore_errors=True)
        return limit, None
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"{policy}: ppo-ref train exited {result.returncode}:\n{result.stderr[-2000:]}")
    summary = json.loads((out / "run" / "summary.json").read_text(encoding="utf-8"))
    shutil.rmtree(out, ignore_errors=True)
    return seconds, [summary["eval_score_initial"], summary["eval_score_final"]]


def measure(rounds: int, quick: bool, limit: float = LIMIT) -> dict[str, Any]:
    """Interleaved rounds: every policy idle, then every policy beside the load job."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    times: dict[str, dict[str, list[float]]] = {p: {"idle": [], "loaded": []} for p in POLICIES}
    stopped: dict[str, dict[str, list[bool]]] = {p: {"idle": [], "loaded": []} for p in POLICIES}
    scores: dict[str, list[list[float] | None]] = {p: [] for p in POLICIES}
    loads = [os.getloadavg()]

    def record(policy: str, condition: str) -> None:
        seconds, score = run_once(policy, quick, limit)
        times[policy][condition].append(seconds)
        stopped[policy][condition].append(score is None)
        scores[policy].append(score)

    for _ in range(rounds):
        for policy in POLICIES:
            record(policy, "idle")
        job = subprocess.Popen([sys.executable, "-c", LOAD_JOB], env=_clean_env({}))
        try:
            time.sleep(2.0)
            for policy in POLICIES:
                record(policy, "loaded")
        finally:
            job.kill()
            job.wait()
        loads.append(os.getloadavg())
    return {"times": times, "stopped": stopped, "limit": limit, "scores": scores, "loadavg": loads}


def summarise(data: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per policy: median idle and loaded seconds, loaded/idle, and idle against two-spinning's idle;
    ``idle_stopped`` / ``loaded_stopped`` count the runs stopped at the limit (then that median, and
    each ratio it enters, is a lower bound or, for ``idle_over_two_spinning_idle``, not a bound)."""
    times = data["times"]
    stopped = data.get("stopped", {})  # files written before the limit have none
    base_idle = statistics.median(times["two-spinning"]["idle"])
    out = {}
    for policy, runs in times.items():
        idle, loaded = statistics.median(runs["idle"]), statistics.median(runs["loaded"])
        out[policy] = {
            "idle_s": idle,
            "loaded_s": loaded,
            "loaded_over_idle": loaded / idle,
            "idle_over_two_spinning_idle": idle / base_idle,
            "idle_stopped": sum(stopped.get(policy, {}).get("idle", [])),
            "loaded_stopped": sum(stopped.get(policy, {}).get("loaded", [])),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    parser.add_argument("--quick", action="store_true", help="1-iteration runs (checks the pipeline)")
    parser.add_argument(
        "--limit", type=float, default=LIMIT, help=f"seconds before a run is stopped (default {LIMIT:g})"
    )
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON to write (default {RESULTS})")
    args = parser.parse_args(argv)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    started = dt.datetime.now(dt.timezone.utc)
    data = measure(args.rounds, args.quick, args.limit)
    data |= {
        "command": "python bench/thread_policy.py"
        + (f" --rounds {args.rounds}" if args.rounds != 2 else "")
        + (" --quick" if args.quick else "")
        + (f" --limit {args.limit:g}" if args.limit != LIMIT else ""),
        "started_utc": started.strftime("%Y-%m-%d %H:%M"),
        "commit": commit,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "quick": args.quick,
        "summary": summarise(data),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    for policy, row in data["summary"].items():
        print(
            f"{policy:13s} idle {row['idle_s']:6.1f} s  loaded {row['loaded_s']:6.1f} s  "
            f"loaded/idle {row['loaded_over_idle']:.2f}x  "
            f"idle vs two-spinning {row['idle_over_two_spinning_idle']:.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
