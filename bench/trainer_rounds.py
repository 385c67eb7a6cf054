"""The trainer sections' measurements: ppo-ref's trainer against TRL's, in alternating rounds.

Part of ``tools/run_bench.py`` (the ``trainer`` and ``grpo`` parts). Each side is a long-lived
worker (:mod:`bench.worker`): ppo-ref's (``bench/ppo_ref_side.py``, ``bench/grpo_side.py``) in the
main environment, TRL's (``bench/trl_iteration.py`` under ``.envs/trl``,
``bench/trl_grpo_iteration.py`` under ``.envs/trl116``) in its own, and the bare model work of an
iteration beside them. Each round runs a block of iterations of each, in an order that alternates
(rotates, for GRPO) between rounds, so that the machine's changing load hits every side alike; the
ratios are per round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.worker import ROOT, Worker


def timed_round(
    workers: dict[str, Worker], order: list[str], block: int, bare: Worker
) -> tuple[dict[str, Any], float, float, float, float]:
    """One round in ``order``: ``block`` iterations of each trainer, one bare measurement (``bare``'s
    worker); the record and the medians (ppo-ref's and TRL's seconds, then their CPU seconds)."""
    record: dict[str, Any] = {"order": order, "loadavg_1min": os.getloadavg()[0]}
    for name in order:
        if name == "bare":
            record["bare"] = bare.ask(cmd="bare", repeats=1)
        else:
            reply = workers[name].ask(cmd="iterations", n=block)
            record[name], record[f"{name}_cpu"] = reply["seconds"], reply["cpu_seconds"]
    medians = [statistics.median(record[key]) for key in ("ppo_ref", "trl", "ppo_ref_cpu", "trl_cpu")]
    return record, medians[0], medians[1], medians[2], medians[3]


def run_trainer_comparison(
    args: argparse.Namespace, env: dict[str, str], python: Path, logs: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """ppo-ref's trainer against TRL 1.12's ``PPOTrainer`` (:mod:`bench.tiny_ppo`), the bare model work
    timed in ppo-ref's process, then a few iterations under cProfile; ``python`` runs ppo-ref's side,
    worker logs go to ``logs``."""
    trl_python = ROOT / ".envs" / "trl" / "bin" / "python"
    if not trl_python.exists():
        raise SystemExit("TRL 1.12's environment is missing: python tools/thirdparty_envs.py trl")
    logs.mkdir(parents=True, exist_ok=True)
    log(f"worker logs in {logs}")
    started = time.perf_counter()
    workers = {
        "ppo_ref": Worker(
            "ppo_ref", [str(python), "-m", "bench.ppo_ref_side", "--serve"], env, logs / "ppo_ref.log"
        ),
        "trl": Worker(
            "trl", [str(trl_python), "-m", "bench.trl_iteration", "--serve"], env, logs / "trl.log"
        ),
    }
    try:
        ready = {name: w.read() for name, w in workers.items()}
        log(f"workers ready after {time.perf_counter() - started:.0f} s")
        warmup = {name: workers[name].ask(cmd="iterations", n=args.warmup)["seconds"] for name in workers}
        # The trainer's own peak memory, before the bare-compute measurements share its process.
        peak_trainer_only = workers["ppo_ref"].ask(cmd="info")["peak_rss_bytes"]
        warmup["bare"] = [workers["ppo_ref"].ask(cmd="bare", repeats=1)["bare"]]
        rounds = []
        for index in range(args.rounds):
            order = ["ppo_ref", "bare", "trl"] if index % 2 == 0 else ["trl", "bare", "ppo_ref"]
            record, ours, theirs, ours_cpu, theirs_cpu = timed_round(
                workers, order, args.block, workers["ppo_ref"]
            )
            record["ratio_trl_over_ppo_ref"] = theirs / ours
            record["overhead"] = ours / record["bare"]["bare"]
            record["trl_over_bare"] = theirs / record["bare"]["bare"]
            # The same ratios in process CPU seconds, which other jobs' load disturbs less than wall time.
            record["ratio_cpu"] = theirs_cpu / ours_cpu
            record["overhead_cpu"] = ours_cpu / record["bare"]["bare_cpu"]
            rounds.append(record)
            log(
                f"round {index + 1}/{args.rounds}: ppo-ref {ours:.3f} s, TRL {theirs:.3f} s, bare "
                f"{record['bare']['bare']:.3f} s: ratio {record['ratio_trl_over_ppo_ref']:.2f}x, overhead "
                f"{record['overhead']:.2f}x (CPU seconds: ratio {record['ratio_cpu']:.2f}x, overhead "
                f"{record['overhead_cpu']:.2f}x), load {record['loadavg_1min']:.1f}"
            )
        infos = {name: w.ask(cmd="info", skip=args.warmup) for name, w in workers.items()}
        profile = workers["ppo_ref"].ask(cmd="profile", n=args.profile_iterations)
    finally:
        for worker in workers.values():
            worker.close()
    return {
        "ready": ready,
        "warmup_seconds": warmup,
        "rounds": rounds,
        "block": args.block,
        "profile": profile,
        "info": infos,
        "peak_rss_trainer_only": peak_trainer_only,
        "wall_seconds": time.perf_counter() - started,
    }


def run_grpo_comparison(
    args: argparse.Namespace,
    env: dict[str, str],
    beta: float,
    python: Path,
    logs: Path,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """ppo-ref's critic-free (GRPO) iteration against TRL 1.16's ``GRPOTrainer`` at ``beta``
    (:mod:`bench.tiny_grpo`), with the bare model work in a third process; each round runs a block
    of iterations of each worker, in an order that rotates, so load from other jobs hits all alike."""
    trl_python = ROOT / ".envs" / "trl116" / "bin" / "python"
    if not trl_python.exists():
        raise SystemExit("TRL 1.16's environment is missing: python tools/thirdparty_envs.py trl116")
    logs.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    tag = f"beta{beta:g}"
    workers = {
        "ppo_ref": Worker(
            "ppo_ref",
            [str(python), "-m", "bench.grpo_side", "--serve", "trainer", "--beta", str(beta)],
            env,
            logs / f"grpo-ppo_ref-{tag}.log",
        ),
        "trl": Worker(
            "trl",
            [str(trl_python), "-m", "bench.trl_grpo_iteration", "--serve", "--beta", str(beta)],
            env,
            logs / f"grpo-trl-{tag}.log",
        ),
        "bare": Worker(
            "bare",
            [str(python), "-m", "bench.grpo_side", "--serve", "bare", "--beta", str(beta)],
            env,
            logs / f"grpo-bare-{tag}.log",
        ),
    }
    try:
        ready = {name: w.read() for name, w in workers.items()}
        log(f"GRPO beta={beta:g}: workers ready after {time.perf_counter() - started:.0f} s")
        warmup: dict[str, Any] = {
            name: workers[name].ask(cmd="iterations", n=args.warmup)["seconds"] for name in ("ppo_ref", "trl")
        }
        warmup["bare"] = [workers["bare"].ask(cmd="bare", repeats=1)["bare"]]
        orders = [["ppo_ref", "bare", "trl"], ["trl", "ppo_ref", "bare"], ["bare", "trl", "ppo_ref"]]
        rounds = []
        for index in range(args.rounds):
            order = orders[index % 3] if index % 2 == 0 else list(reversed(orders[index % 3]))
            record, ours, theirs, ours_cpu, theirs_cpu = timed_round(
                workers, order, args.block, workers["bare"]
            )
            bare = record["bare"]
            record["ratio_trl_over_ppo_ref"] = theirs / ours
            record["ppo_ref_over_bare"] = ours / bare["bare"]
            record["ppo_ref_over_bare_own"] = ours / bare["bare_own"]
            record["trl_over_bare"] = theirs / bare["bare"]
            record["ratio_cpu"] = theirs_cpu / ours_cpu
            record["ppo_ref_over_bare_cpu"] = ours_cpu / bare["bare_cpu"]
            record["ppo_ref_over_bare_own_cpu"] = ours_cpu / bare["bare_own_cpu"]
            record["trl_over_bare_cpu"] = theirs_cpu / bare["bare_cpu"]
            rounds.append(record)
            log(
                f"GRPO beta={beta:g} round {index + 1}/{args.rounds}: ppo-ref {ours:.3f} s, "
                f"TRL {theirs:.3f} s, "
                f"bare {bare['bare']:.3f} s (generate {bare['generate']:.3f}, ppo-ref's sampler "
                f"{bare['generate_own']:.3f}): TRL/ppo-ref {record['ratio_trl_over_ppo_ref']:.2f}x, "
                f"ppo-ref/bare {record['ppo_ref_over_bare']:.2f}x, TRL/bare {record['trl_over_bare']:.2f}x; "
                f"CPU seconds: TRL/ppo-ref {record['ratio_cpu']:.2f}x, ppo-ref/bare "
                f"{record['ppo_ref_over_bare_cpu']:.2f}x, TRL/bare {record['trl_over_bare_cpu']:.2f}x; "
                f"load {record['loadavg_1min']:.1f}"
            )
        infos = {name: w.ask(cmd="info", skip=args.warmup) for name, w in workers.items()}
    finally:
        for worker in workers.values():
            worker.close()
    return {
        "beta": beta,
        "ready": ready,
        "warmup_seconds": warmup,
        "rounds": rounds,
        "block": args.block,
        "info": infos,
        "wall_seconds": time.perf_counter() - started,
    }
