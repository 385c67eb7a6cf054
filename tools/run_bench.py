"""Run every benchmark of ``bench/RESULTS.md`` at one commit and write the whole file.

    python tools/run_bench.py                 # everything at one commit: 35-60 minutes on 2 cores
    python tools/run_bench.py --quick --results-dir /tmp/bench   # a pipeline check: 23 min at load 7
    python tools/run_bench.py --render-only   # no run: rebuild RESULTS.md and docs/benchmarks.md's figures
    python tools/run_bench.py --only grpo     # one part; the file then says it is not one run

In one run, in this order:

1. ppo-ref's trainer against TRL 1.12's ``PPOTrainer`` at identical settings (``bench/tiny_ppo.py``),
   each in its own long-lived process (``bench/ppo_ref_side.py --serve trainer``, and
   ``bench/trl_iteration.py --serve`` under ``.envs/trl``), driven in alternating blocks of
   iterations so that the machine's changing load hits both alike; the ratio is the median of the
   per-round ratios. A third process (``--serve bare``) times the bare model work of an iteration
   in the same rounds, for the overhead ratio; then a few iterations run under cProfile.
2. ppo-ref's critic-free (GRPO) iteration against TRL 1.16's ``GRPOTrainer`` (``.envs/trl116``),
   each beta ``--repeat`` times with fresh processes;
3. the primitive benchmarks (``bench/test_primitives.py``) for ``mine`` (``.venv``) and for each
   third-party library that has an adapter and a built environment (``.envs/NAME``), raw
   pytest-benchmark JSON to ``primitives-NAME*.json``;
4. ``token_logprobs`` peak extra memory per implementation, one fresh process per measurement;
5. the PPO-family ops side by side (``bench/family_side.py --compare``: two runs alike and one
   with ``--malloc-keep``);
6. the conformance suite's wall time against ``mine``;
7. the ``ppo-ref`` command's thread policy, idle and beside a two-thread job
   (``bench/thread_policy.py``);
8. the sampler modes: the compiled decode against ``model.generate``, the GRPO iteration with it
   against TRL 1.16, and the SmolLM2-135M preset's iteration (``bench/sampler_compare.py``).

Writes the raw JSON (``run.json``, the primitives', ``family*.json``, ``thread-policy.json``,
``sampler.json``) and
``manifest.json`` (which files each section reads) to ``--results-dir`` (``bench/results``), then
``bench/RESULTS.md`` whole and docs/benchmarks.md's benchmark figures (:mod:`bench.results_document`, with the
hand-written notes of ``bench/RESULTS-notes.md``); commits nothing. A run of every part whose data
turns out not to be from one commit (HEAD moved meanwhile) is refused as one run: the file is
written with each section's commit marked and the exit status is 1. Every benchmark subprocess gets
``OMP_WAIT_POLICY=PASSIVE`` (``--omp-wait-policy``): on a machine whose cores are busy with other
jobs, spinning OpenMP threads make two-thread torch ops wait for a descheduled thread (measured: a
tiny GPT-2 forward 0.15-1.0 s instead of 0.03 s); the thread-policy runs set their own.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import results_document as document  # noqa: E402
from bench import trainer_rounds  # noqa: E402

RESULTS = document.RESULTS_DIR
PARTS = ("trainer", "grpo", "primitives", "memory", "conformance", "family", "threads", "sampler")
RUN_PARTS = PARTS[:5]
"""The parts measured in this process (into run.json); family, threads and sampler run their own
scripts."""
FAMILY_RUNS: tuple[tuple[str, list[str]], ...] = (
    ("family.json", []),
    ("family-repeat.json", []),
    ("family-malloc-keep.json", ["--malloc-keep"]),
)
"""bench/family_side.py --compare runs of the family section: two alike (the spread) and one with
glibc's malloc keeping freed memory (page faults out of the timed calls)."""
LOGS = Path(tempfile.gettempdir()) / "ppo-ref-bench-logs"  # worker output: progress bars, warnings
THIRD_PARTY = ("trl", "verl", "openrlhf", "torchrl", "sb3", "skyrl")
VOCABS = (32_000, 150_000)
PYTEST_BENCHMARK = "pytest-benchmark==5.3.1"


def log(message: str) -> None:
    stamp = dt.datetime.now().strftime("%H:%M:%S")
    print(f"[run_bench {stamp}] {message}", file=sys.stderr, flush=True)


def main_python() -> Path:
    venv = ROOT / ".venv" / "bin" / "python"
    return venv if venv.exists() else Path(sys.executable)


def child_env(omp_wait_policy: str, threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(ROOT), TRL_EXPERIMENTAL_SILENCE="1", PYTHONNOUSERSITE="1")
    env["PPO_REF_BENCH_THREADS"] = str(threads)
    if omp_wait_policy:
        env["OMP_WAIT_POLICY"] = omp_wait_policy
    return env


@contextlib.contextmanager
def envs_lock() -> Iterator[None]:
    """Hold ``.envs/.lock`` shared, so ``tools/thirdparty_envs.py`` does not rebuild an env meanwhile."""
    path = ROOT / ".envs" / ".lock"
    if not path.parent.exists():
        yield
        return
    with path.open("a") as handle:
        deadline = time.monotonic() + 600
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{path} stayed locked by an env build for 10 minutes") from None
                log("waiting for an environment build to finish (.envs/.lock)")
                time.sleep(5)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def third_party_envs() -> dict[str, Path]:
    """NAME -> interpreter for each library with an adapter module and a completely built env."""
    found = {}
    for name in THIRD_PARTY:
        python = ROOT / ".envs" / name / "bin" / "python"
        adapter = ROOT / "ppo_ref" / "adapters" / "thirdparty" / f"{name}.py"
        state = ROOT / ".envs" / name / "ppo-ref-env.json"
        if python.exists() and adapter.exists() and state.exists():
            found[name] = python
        else:
            missing = [str(p.relative_to(ROOT)) for p in (python, adapter, state) if not p.exists()]
            log(f"skipping {name}: missing {', '.join(missing)}")
    return found


def ensure_pytest_benchmark(name: str, python: Path, env: dict[str, str]) -> bool:
    probe = subprocess.run([str(python), "-c", "import pytest_benchmark"], env=env, capture_output=True)
    if probe.returncode == 0:
        return True
    log(f"installing {PYTEST_BENCHMARK} into .envs/{name} (torch pinned by .envs/constraints.txt)")
    command = [str(python), "-m", "pip", "install", "-q", PYTEST_BENCHMARK]
    constraints = ROOT / ".envs" / "constraints.txt"
    if constraints.exists():
        command += ["-c", str(constraints)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        log(f"could not install pytest-benchmark into .envs/{name}: {done.stderr[-500:]}")
    return done.returncode == 0


LARGE_SHAPES = "B256-T2048 or V150k"


def run_primitives(
    impls: dict[str, Path], env: dict[str, str], max_time: float, results: Path
) -> dict[str, Any]:
    """Pass 1: every primitive, implementation after implementation. Passes 2 and 3: the large
    shapes again, in the reverse order and then the first order, so that a burst of load during one
    implementation's turn does not decide its result (the report takes each implementation's best
    median over the passes)."""
    out: dict[str, Any] = {}
    passes = [
        (list(impls), "", ""),
        (list(reversed(impls)), LARGE_SHAPES, "-pass2"),
        (list(impls), LARGE_SHAPES, "-pass3"),
    ]
    for order, selection, suffix in passes:
        for name in order:
            json_path = results / f"primitives-{name}{suffix}.json"
            command = [
                str(impls[name]),
                "-m",
                "pytest",
                "bench/test_primitives.py",
                f"--bench-impl={name}",
                f"--benchmark-json={json_path}",
                f"--benchmark-max-time={max_time}",
                "-q",
                "-p",
                "no:cacheprovider",
            ]
            if selection:
                command += ["-k", selection]
            started = time.perf_counter()
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
            summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
            log(f"primitives {name}{suffix}: {summary} ({time.perf_counter() - started:.0f} s)")
            entry = out.setdefault(name, {"returncode": 0, "summary": summary, "json": []})
            entry["json"].append(json_path.name)
            if done.returncode != 0:
                entry["returncode"], entry["summary"] = done.returncode, summary
                LOGS.mkdir(parents=True, exist_ok=True)
                (LOGS / f"primitives-{name}{suffix}.log").write_text(done.stdout + done.stderr)
    return out


def run_memory(impls: dict[str, Path], env: dict[str, str]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for name, python in impls.items():
        for vocab in VOCABS:
            command = [str(python), "-m", "bench.logprobs_memory", "--impl", name, "--vocab", str(vocab)]
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
            lines = [line for line in done.stdout.splitlines() if line.startswith('{"')]
            if done.returncode != 0 or not lines:
                results.append({"impl": name, "vocab": vocab, "error": done.stderr[-500:]})
                log(f"memory {name} V={vocab}: failed")
                continue
            results.append(json.loads(lines[-1]))
            ratio = results[-1].get("extra_over_logits")
            log(f"memory {name} V={vocab}: extra/logits = {ratio if ratio is None else round(ratio, 3)}")
    return results


def run_conformance(env: dict[str, str]) -> dict[str, Any]:
    command = [
        str(main_python()),
        "-m",
        "pytest",
        "conformance/",
        "--impl=mine",
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - started
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
    log(f"conformance suite against mine: {summary} ({seconds:.1f} s)")
    return {
        "command": " ".join(command[1:]),
        "wall_seconds": seconds,
        "returncode": done.returncode,
        "summary": summary,
    }


def machine_info() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory_gib = None
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory_gib = round(int(line.split()[1]) / 2**20, 1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "git_commit": commit.stdout.strip() or None,
        "git_worktree_dirty": bool(dirty.stdout.strip()),
    }


def run_family(args: argparse.Namespace, results: Path) -> dict[str, Any]:
    """``bench/family_side.py --compare`` (its own workers, one per library environment), once per
    entry of :data:`FAMILY_RUNS` (the first only with ``--quick``, at its small shapes, one round)."""
    started = time.perf_counter()
    runs = FAMILY_RUNS[:1] if args.quick else FAMILY_RUNS
    files = []
    for name, extra in runs:
        command = [str(main_python()), "bench/family_side.py", "--compare", "--out", str(results / name)]
        command += ["--small", "--rounds", "1"] if args.quick else ["--rounds", str(args.family_rounds)]
        command += ["--threads", str(args.threads), "--omp-wait-policy", args.omp_wait_policy, *extra]
        command += ["--log", str(LOGS / f"{name}.log")]
        LOGS.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            command, cwd=ROOT, env=child_env("", args.threads), capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"family ops ({' '.join(command[1:])}) exited {done.returncode}: {done.stderr[-2000:]}"
            )
        files.append(name)
        log(f"family ops: {results / name} ({time.perf_counter() - started:.0f} s so far)")
    return {"files": files, "wall_seconds": time.perf_counter() - started}


def _run_script(label: str, script: str, out: Path, extra: list[str], threads: int) -> dict[str, Any]:
    """Run ``script`` (a benchmark that writes its own JSON to ``out``) in the main environment, each
    worker choosing its own OpenMP policy; its output logged, its file named for the manifest."""
    started = time.perf_counter()
    command = [str(main_python()), script, *extra]
    done = subprocess.run(command, cwd=ROOT, env=child_env("", threads), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{label} exited {done.returncode}: {done.stderr[-2000:]}")
    log(f"{label}: {out} ({time.perf_counter() - started:.0f} s)\n{done.stdout.strip()}")
    return {"files": [out.name], "wall_seconds": time.perf_counter() - started}


def run_threads(args: argparse.Namespace, results: Path) -> dict[str, Any]:
    """``bench/thread_policy.py``: the ppo-ref command's default run under each thread policy, idle
    and beside a two-thread job (``--rounds 1 --quick`` with ``--quick``)."""
    out = results / "thread-policy.json"
    extra = ["--output", str(out)]
    extra += ["--rounds", "1", "--quick"] if args.quick else ["--rounds", str(args.thread_rounds)]
    return _run_script("thread policy", "bench/thread_policy.py", out, extra, args.threads)


def run_sampler(args: argparse.Namespace, results: Path) -> dict[str, Any]:
    """``bench/sampler_compare.py``: both betas' rounds, then the SmolLM2-135M runs (with ``--quick``
    one round of one iteration each, no SmolLM2)."""
    out = results / "sampler.json"
    extra = ["--out", str(out), "--omp-wait-policy", args.omp_wait_policy]
    if args.quick:
        extra += ["--rounds", "1", "--block", "1", "--warmup", "1", "--no-smollm2"]
    return _run_script("sampler modes", "bench/sampler_compare.py", out, extra, args.threads)


def git_commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or None


def render(args: argparse.Namespace, *, require_one_commit: bool) -> int:
    """Write RESULTS.md (and docs/benchmarks.md's figures, for the default output) from the results directory;
    1 if ``require_one_commit`` fails (the file is then written with the sections marked)."""
    readme = document.README if args.output == document.RESULTS_MD else None
    status = 0
    try:
        written = document.write(
            args.results_dir, document.NOTES, args.output, readme, require_one_commit=require_one_commit
        )
    except ValueError as error:
        if not require_one_commit:
            raise
        log(f"REFUSED as one run: {error}; writing the file with every section's commit marked")
        document.write_manifest(args.results_dir, {}, header=None)
        written = document.write(args.results_dir, document.NOTES, args.output, readme)
        status = 1
    log("wrote " + ", ".join(str(path) for path in written))
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a pipeline check: 4 rounds, 1 GRPO repeat, short primitives, family ops at small shapes "
        "for 1 round, the thread policy's 1-iteration runs",
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="run nothing: rebuild RESULTS.md (and docs/benchmarks.md's figures) from the results "
        "directory and bench/RESULTS-notes.md",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS,
        help="where the raw JSON goes, with its manifest.json (default bench/results; another directory "
        "gets its own RESULTS.md and leaves docs/benchmarks.md alone)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="the Markdown to write (default bench/RESULTS.md, or RESULTS.md in --results-dir)",
    )
    parser.add_argument("--rounds", type=int, help="trainer and GRPO rounds (default 12; --quick 4)")
    parser.add_argument("--block", type=int, default=2, help="iterations per side per round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations per trainer first")
    parser.add_argument("--profile-iterations", type=int, default=3, help="ppo-ref iterations under cProfile")
    parser.add_argument("--primitive-max-time", type=float, help="pytest-benchmark max time per test")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per process (the settings: 2)")
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=PARTS, help="parts not to run (a partial run)"
    )
    parser.add_argument(
        "--only", nargs="*", default=[], choices=PARTS, help="the parts to run (a partial run)"
    )
    parser.add_argument(
        "--betas", type=float, nargs="*", default=[0.0, 0.04], help="KL coefficients of the GRPO comparison"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        help="GRPO comparisons per beta, each with fresh processes (the spread; default 3, --quick 1)",
    )
    parser.add_argument("--family-rounds", type=int, default=7, help="rounds of each family-ops run")
    parser.add_argument("--thread-rounds", type=int, default=2, help="rounds of the thread-policy runs")
    parser.add_argument(
        "--omp-wait-policy",
        default="PASSIVE",
        help="OMP_WAIT_POLICY for every benchmark subprocess ('' keeps the environment's; the thread "
        "policy sets its own)",
    )
    args = parser.parse_args(argv)
    args.results_dir = args.results_dir.resolve()
    if args.output is None:
        default_dir = args.results_dir == RESULTS
        args.output = document.RESULTS_MD if default_dir else args.results_dir / "RESULTS.md"
    args.output = args.output.resolve()
    if args.render_only:
        return render(args, require_one_commit=False)
    parts = [p for p in (args.only or PARTS) if p not in args.skip]
    whole = parts == list(PARTS)
    args.rounds = args.rounds or (4 if args.quick else 12)
    args.repeat = args.repeat or (1 if args.quick else 3)
    max_time = args.primitive_max_time or (0.2 if args.quick else 0.5)
    results = args.results_dir
    results.mkdir(parents=True, exist_ok=True)
    env = child_env(args.omp_wait_policy, args.threads)
    started = time.perf_counter()
    run: dict[str, Any] = {
        "command": "python tools/run_bench.py"
        + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip(),
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(),
        "loadavg_start": os.getloadavg(),
        "omp_wait_policy": args.omp_wait_policy,
        "threads": args.threads,
        "settings": {
            "rounds": args.rounds,
            "block": args.block,
            "warmup": args.warmup,
            "primitive_max_time": max_time,
            "repeat": args.repeat,
        },
    }
    log(f"{'every part' if whole else 'a partial run'} ({', '.join(parts)}) into {results}")
    with envs_lock():
        impls = {"mine": main_python()}
        if {"primitives", "memory"} & set(parts):  # only these use the third-party environments here
            for name, python in third_party_envs().items():
                if ensure_pytest_benchmark(name, python, env):
                    impls[name] = python
        if "trainer" in parts:
            log(f"trainer vs TRL: {args.rounds} rounds of {args.block} iterations each")
            run["trainer"] = trainer_rounds.run_trainer_comparison(args, env, main_python(), LOGS, log)
            run["loadavg_after_trainer"] = os.getloadavg()
        if "grpo" in parts:
            log(f"GRPO vs TRL 1.16: {args.rounds} rounds of {args.block} iterations each, betas {args.betas}")
            run["grpo"] = [
                {
                    **trainer_rounds.run_grpo_comparison(args, env, beta, main_python(), LOGS, log),
                    "repeat": repeat,
                }
                for repeat in range(args.repeat)
                for beta in args.betas
            ]
            run["loadavg_after_grpo"] = os.getloadavg()
        if "primitives" in parts:
            run["primitives"] = run_primitives(impls, env, max_time, results)
            run["loadavg_after_primitives"] = os.getloadavg()
        if "memory" in parts:
            memory_impls = {n: p for n, p in impls.items() if n in ("mine", "trl", "verl", "openrlhf")}
            run["memory"] = run_memory(memory_impls, env)
        if "family" in parts:
            run["family"] = run_family(args, results)
            run["loadavg_after_family"] = os.getloadavg()
    if "conformance" in parts:
        run["conformance"] = run_conformance(env)
    if "threads" in parts:
        run["thread_policy"] = run_threads(args, results)
        run["loadavg_after_threads"] = os.getloadavg()
    if "sampler" in parts:
        run["sampler"] = run_sampler(args, results)
        run["loadavg_after_sampler"] = os.getloadavg()
    run["loadavg_end"] = os.getloadavg()
    run["wall_seconds"] = time.perf_counter() - started
    run["machine"]["git_commit_end"] = git_commit()
    ran_here = [p for p in parts if p in RUN_PARTS]
    name = "run.json" if whole else "run-" + "-".join(ran_here) + ".json"
    sections: dict[str, list[str]] = {part: [name] for part in ran_here}
    if ran_here or whole:
        (results / name).write_text(json.dumps(run, indent=1) + "\n")
    for part, key in (("family", "family"), ("threads", "thread_policy"), ("sampler", "sampler")):
        if key in run:
            sections[part] = run[key]["files"]
    moved = run["machine"]["git_commit_end"] != run["machine"]["git_commit"]
    document.write_manifest(results, sections, header=name if whole and not moved else None)
    log(f"wrote {results} in {run['wall_seconds'] / 60:.1f} min")
    if whole and moved:
        log(
            f"REFUSED as one run: HEAD moved during the run ({run['machine']['git_commit']} -> "
            f"{run['machine']['git_commit_end']}); writing the file with every section's commit marked"
        )
        render(args, require_one_commit=False)
        return 1
    return render(args, require_one_commit=whole)


if __name__ == "__main__":
    raise SystemExit(main())
