"""The PPO-family benchmark's orchestration: one worker per side, alternating rounds, per-round ratios.

:func:`compare` starts ``bench/family_side.py --serve SIDE`` under each side's interpreter (``mine``
in this one, a library in ``.envs/NAME``; :mod:`bench.worker`'s protocol), asks each for its cases,
and for every case key times each implementation in blocks whose order alternates between rounds,
so the machine's changing load hits every side alike. The report holds each implementation's
median milliseconds and ppo-ref's ratio to the fastest library per round (wall and process CPU).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.family.cases import FULL, SMALL
from bench.family.sides import LIBRARIES
from bench.worker import ROOT, Worker, WorkerError

SERVE = ROOT / "bench" / "family_side.py"
"""The script a worker runs (``--serve SIDE``)."""


class Side:
    """One side's worker: its label, the (key, label) cases it offers and their notes."""

    def __init__(self, side: str, python: Path, env: dict[str, str], log: Path, small: bool) -> None:
        command = [str(python), str(SERVE), "--serve", side] + (["--small"] if small else [])
        self.side = side
        self.worker = Worker(side, command, env, log, append=True)
        self.error: str | None = None
        self.cases: list[tuple[str, str]] = []
        self.notes: dict[str, str] = {}
        try:
            hello = self.worker.read()
        except WorkerError as error:  # reported in the section's "Not run"; the side is left out
            self.error = error.reason
            return
        self.cases = [(str(k[0]), str(k[1])) for k in hello.get("cases", [])]
        self.notes = hello.get("notes", {})

    def ask(self, **request: Any) -> dict[str, Any]:
        return self.worker.ask(**request)

    def close(self) -> None:
        self.worker.close()


def _pythons() -> dict[str, Path]:
    found = {"mine": Path(sys.executable)}
    for name in LIBRARIES:
        python = ROOT / ".envs" / name / "bin" / "python"
        if python.exists():
            found[name] = python
    return found


def _load() -> tuple[float, float, float]:
    return os.getloadavg()


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Alternating rounds over every (case, implementation); the per-round ratios."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        PYTHONPATH=str(ROOT),
        PYTHONNOUSERSITE="1",
        PPO_REF_BENCH_THREADS=str(args.threads),
        OMP_WAIT_POLICY=args.omp_wait_policy,
    )
    if args.malloc_keep:
        # glibc otherwise hands a 2 MiB temporary's pages back to the kernel when it is freed and
        # faults fresh ones in for the next: thousands of page faults per call, several times the
        # arithmetic at these shapes, and their number depends on each implementation's
        # allocation order, not its arithmetic (bench/PERF-NOTES.md).
        env.update(MALLOC_TRIM_THRESHOLD_=str(2**30), MALLOC_MMAP_THRESHOLD_=str(2**25))
    log_path = Path(args.log)
    log_path.write_text("")  # one log for every worker's stderr, fresh for this run
    started = time.time()
    loads = {"start": _load()}
    workers: dict[str, Side] = {}
    skipped: dict[str, str] = {}
    try:
        for side, python in _pythons().items():
            if args.only and side != "mine" and side not in args.only:
                continue
            worker = Side(side, python, env, log_path, args.small)
            if worker.error is None:
                workers[side] = worker
            else:
                skipped[side] = worker.error
                worker.close()
        for side in LIBRARIES:
            if side not in workers and side not in skipped:
                skipped[side] = f".envs/{side} is missing (python tools/thirdparty_envs.py {side})"
        keys = sorted({key for w in workers.values() for key, _ in w.cases}, key=_order)
        if args.cases:
            keys = [k for k in keys if any(k.startswith(prefix) for prefix in args.cases)]
        results: dict[str, Any] = {}
        for key in keys:
            impls = [(w, label) for w in workers.values() for k, label in w.cases if k == key]
            if not any(w.side == "mine" for w, _ in impls):
                continue
            results[key] = _measure(key, impls, args)
            _progress(key, results[key])
        loads["end"] = _load()
    finally:
        for worker in workers.values():
            worker.close()
    return {
        "when": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": round(time.time() - started, 1),
        "shapes": (SMALL if args.small else FULL).__dict__,
        "threads": args.threads,
        "omp_wait_policy": args.omp_wait_policy,
        "malloc_keep": bool(args.malloc_keep),
        "rounds": args.rounds,
        "load": loads,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "torch": torch.__version__,
        "skipped": skipped,
        "notes": {k: v for w in workers.values() for k, v in w.notes.items()},
        "results": results,
    }


def _order(key: str) -> tuple[int, str]:
    ops = (
        "group_advantages",
        "aggregate_loss",
        "policy_loss",
        "gspo_loss",
        "cispo_loss",
        "kl_loss",
        "rollout_correction",
    )
    return ops.index(key.split("/")[0]), key


def _measure(key: str, impls: list[tuple[Side, str]], args: argparse.Namespace) -> dict[str, Any]:
    """Warm up each implementation, pick its repetitions per block, then alternate blocks."""
    reps: dict[str, int] = {}
    checks: dict[str, dict[str, float]] = {}
    for worker, label in impls:
        checks[label] = worker.ask(cmd="check", key=key, label=label)
        first = worker.ask(cmd="time", key=key, label=label, reps=1)["wall"][0]
        reps[label] = max(1, min(args.max_reps, int(args.block_seconds / max(first, 1e-6))))
    blocks: dict[str, list[dict[str, float]]] = {label: [] for _, label in impls}
    samples: dict[str, dict[str, list[float]]] = {label: {"wall": [], "cpu": []} for _, label in impls}
    for round_index in range(args.rounds):
        order = impls if round_index % 2 == 0 else impls[::-1]
        for worker, label in order:
            timed = worker.ask(cmd="time", key=key, label=label, reps=reps[label])
            samples[label]["wall"] += timed["wall"]
            samples[label]["cpu"] += timed["cpu"]
            blocks[label].append({m: statistics.median(timed[m]) for m in ("wall", "cpu")})
    summary: dict[str, Any] = {"impls": {}, "checks": checks, "reps": reps}
    for label, timing in samples.items():
        summary["impls"][label] = {
            "median_ms": 1e3 * statistics.median(timing["wall"]),
            "min_ms": 1e3 * min(timing["wall"]),
            "cpu_median_ms": 1e3 * statistics.median(timing["cpu"]),
            "calls": len(timing["wall"]),
        }
    others = [label for _, label in impls if label != "mine"]
    if others:
        for metric in ("wall", "cpu"):
            ratios = [
                blocks["mine"][r][metric] / min(blocks[o][r][metric] for o in others)
                for r in range(args.rounds)
            ]
            fastest = min(others, key=lambda o: statistics.median(b[metric] for b in blocks[o]))
            summary[f"ratio_{metric}"] = {
                "median": statistics.median(ratios),
                "min": min(ratios),
                "max": max(ratios),
                "rounds": ratios,
                "fastest": fastest,
            }
    return summary


def _progress(key: str, result: dict[str, Any]) -> None:
    cells = ", ".join(f"{label} {v['median_ms']:.2f}" for label, v in result["impls"].items())
    ratio = result.get("ratio_wall")
    tail = f"; mine/fastest {ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})" if ratio else ""
    print(f"[family {time.strftime('%H:%M:%S')}] {key}: {cells} ms{tail}", file=sys.stderr, flush=True)
