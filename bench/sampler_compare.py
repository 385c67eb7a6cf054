"""The sampler modes side by side (issue 26): GRPO iterations against TRL 1.16, the decode alone,
and the SmolLM2-135M preset's iteration; ``bench/RESULTS.md``'s sampler section is rendered from
its JSON (:mod:`bench.results_sampler`).

``python bench/sampler_compare.py`` (what ``tools/run_bench.py`` runs as its ``sampler`` part)
measures, for each beta (0 and 0.04) at the GRPO benchmark's settings (:mod:`bench.tiny_grpo`),
four long-lived workers: ppo-ref's trainer with ``sampler="dynamic"`` (the default), ppo-ref's
trainer with ``sampler="static-compiled"``, TRL 1.16's ``GRPOTrainer`` (``.envs/trl116``) and a
decode worker; each round runs a block of iterations of each, in a rotating order, so the
machine's load hits all alike. The decode worker times, on its own copy of the model and the same
64 prompts (8 prompts x 8), transformers' ``model.generate`` and ppo-ref's sampler in each mode,
and reports the compiled step's compile time (its first call minus a steady call) and the resident
memory it added (peak RSS before and after). Each beta's floor is the compiled decode plus the
compiled trainer's forward and update stages, the least an iteration of this model work takes with
that decode. Then (unless ``--no-smollm2``) ``ppo-ref train --task smollm2-sentiment`` runs as a
user types it, once per mode (``dynamic``, ``static-compiled``), each in a fresh process with a
cold inductor cache, for ``--smollm2-iterations`` iterations. The JSON goes to ``--out`` (default
``bench/results/sampler.json``); the ratios quoted are medians over the rounds of ratios measured
within one round.

``--serve trainer --sampler S --beta B``, ``--serve decode`` and ``--serve smollm2 --sampler S``
are the worker modes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
MODES = ("dynamic", "static", "static-compiled")
_SCRATCH: list[tempfile.TemporaryDirectory[str]] = []


def _scratch(prefix: str) -> str:
    """A temporary directory removed when this process exits (a run's outputs, an inductor cache)."""
    directory = tempfile.TemporaryDirectory(prefix=prefix)
    _SCRATCH.append(directory)
    return directory.name


def _decode_worker() -> None:
    from bench import tiny_grpo as g
    from bench import tiny_ppo
    from bench.grpo_side import BareGrpo
    from bench.worker import reply
    from ppo_ref.trainer.generation import generate

    bare = BareGrpo(0.0)
    prompts, mask, uniforms = bare.prompt_ids, bare.prompt_mask, bare.uniforms

    def own(mode: str) -> Any:
        return generate(bare.policy, prompts, mask, uniforms, eos_id=g.EOS_ID, pad_id=g.PAD_ID, sampler=mode)

    first: dict[str, float] = {}
    rss_before = tiny_ppo.peak_rss_bytes()
    for mode in MODES:
        began = time.perf_counter()
        own(mode)
        first[mode] = time.perf_counter() - began
    rss_after = tiny_ppo.peak_rss_bytes()
    bare.generate()
    reference = own("dynamic").response_ids
    same = {mode: bool(torch.equal(own(mode).response_ids, reference)) for mode in MODES}
    reply(
        {
            "ready": True,
            "first_call_seconds": first,
            "peak_rss_before_compile": rss_before,
            "peak_rss_after_compile": rss_after,
            "same_tokens_as_dynamic": same,
        }
    )
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "decode":
            result: dict[str, float] = {}
            for _ in range(int(command.get("repeats", 3))):
                for name, call in [("generate", bare.generate)] + [(m, lambda m=m: own(m)) for m in MODES]:
                    began = time.perf_counter()
                    call()
                    result.setdefault(name, 1e9)
                    result[name] = min(result[name], time.perf_counter() - began)
            reply(result)
        elif command["cmd"] == "quit":
            break
        else:
            reply({"error": f"unknown command {command}"})


def _trainer_worker(sampler: str, beta: float) -> None:
    from bench import tiny_ppo
    from bench.grpo_side import make_grpo_trainer
    from bench.ppo_ref_side import TrainStepper, info
    from bench.worker import reply

    out = _scratch(f"ppo-ref-sampler-{sampler}-")
    began = time.perf_counter()  # the build includes the initial evaluation, the compile's first call
    stepper = TrainStepper(make_grpo_trainer(out, beta, sampler=sampler))
    built = time.perf_counter() - began
    reply({"ready": True, "peak_rss_bytes": tiny_ppo.peak_rss_bytes(), "build_seconds": built})
    try:
        for line in sys.stdin:
            command = json.loads(line)
            if command["cmd"] == "iterations":
                seconds = [stepper.step() for _ in range(int(command["n"]))]
                reply({"seconds": seconds})
            elif command["cmd"] == "info":
                reply(info(stepper, int(command.get("skip", 0))))
            elif command["cmd"] == "quit":
                break
            else:
                reply({"error": f"unknown command {command}"})
    finally:
        stepper.close()


def _drive(args: argparse.Namespace, beta: float) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tools"))
    import run_bench as rb

    from bench.worker import Worker

    env = rb.child_env(args.omp_wait_policy, int(os.environ.get("PPO_REF_BENCH_THREADS", "2")))
    python = str(rb.main_python())
    logs = rb.LOGS
    logs.mkdir(parents=True, exist_ok=True)
    me = [python, "-m", "bench.sampler_compare"]
    tag = f"beta{beta:g}"

    def cold(name: str) -> dict[str, str]:  # an empty inductor cache each: compile time counted in full
        return {**env, "TORCHINDUCTOR_CACHE_DIR": _scratch(f"ppo-ref-inductor-{name}-")}

    workers = {
        "dynamic": Worker(
            "dynamic",
            [*me, "--serve", "trainer", "--sampler", "dynamic", "--beta", str(beta)],
            env,
            logs / f"sampler-dynamic-{tag}.log",
        ),
        "static-compiled": Worker(
            "static-compiled",
            [*me, "--serve", "trainer", "--sampler", "static-compiled", "--beta", str(beta)],
            cold("trainer"),
            logs / f"sampler-static-compiled-{tag}.log",
        ),
        "trl": Worker(
            "trl",
            [
                str(ROOT / ".envs" / "trl116" / "bin" / "python"),
                "-m",
                "bench.trl_grpo_iteration",
                "--serve",
                "--beta",
                str(beta),
            ],
            env,
            logs / f"sampler-trl-{tag}.log",
        ),
        "decode": Worker("decode", [*me, "--serve", "decode"], cold("decode"), logs / "sampler-decode.log"),
    }
    trainers = ("dynamic", "static-compiled", "trl")
    try:
        ready = {name: w.read() for name, w in workers.items()}
        began = {}
        for name in trainers:  # the first iterations: the compile happens here for static-compiled
            start = time.perf_counter()
            began[name] = workers[name].ask(cmd="iterations", n=args.warmup)["seconds"]
            began[name + "_wall"] = [time.perf_counter() - start]
        rounds = []
        for index in range(args.rounds):
            order = [*trainers, "decode"]
            order = order[index % 4 :] + order[: index % 4]
            record: dict[str, Any] = {"order": order, "loadavg_1min": os.getloadavg()[0]}
            for name in order:
                if name == "decode":
                    record["decode"] = workers["decode"].ask(cmd="decode", repeats=3)
                else:
                    record[name] = workers[name].ask(cmd="iterations", n=args.block)["seconds"]
            med = {name: statistics.median(record[name]) for name in trainers}
            record["trl_over_dynamic"] = med["trl"] / med["dynamic"]
            record["trl_over_static_compiled"] = med["trl"] / med["static-compiled"]
            record["dynamic_over_static_compiled"] = med["dynamic"] / med["static-compiled"]
            d = record["decode"]
            record["generate_over_" + "dynamic"] = d["generate"] / d["dynamic"]
            record["generate_over_static"] = d["generate"] / d["static"]
            record["generate_over_static_compiled"] = d["generate"] / d["static-compiled"]
            rounds.append(record)
            print(
                json.dumps({k: v for k, v in record.items() if "over" in k or k == "loadavg_1min"}),
                flush=True,
            )
        infos = {
            name: workers[name].ask(cmd="info", skip=args.warmup) for name in ("dynamic", "static-compiled")
        }
    finally:
        for worker in workers.values():
            worker.close()
    keys = [k for k in rounds[0] if "_over_" in k]
    return {
        "beta": beta,
        "ready": ready,
        "warmup_seconds": began,
        "rounds": rounds,
        "median_ratios": {k: statistics.median(r[k] for r in rounds) for k in keys},
        "range_ratios": {k: [min(r[k] for r in rounds), max(r[k] for r in rounds)] for k in keys},
        "info": infos,
        "floor": _floor(rounds, infos["static-compiled"]),
    }


def _floor(rounds: list[dict[str, Any]], compiled: dict[str, Any]) -> dict[str, float]:
    """The least time any iteration of this model work can take with the compiled decode, measured in
    the same rounds: the compiled decode (the decode worker's, medians over the rounds) plus the
    compiled trainer's forward (the reference's, at beta > 0) and update stages (its metrics.jsonl
    medians); TRL's median iteration over it bounds the ratio the compiled sampler can reach."""
    decode = statistics.median(r["decode"]["static-compiled"] for r in rounds)
    stages = compiled["stage_seconds_median"]
    forward, update = stages["seconds_forward"], stages["seconds_update"]
    trl = statistics.median(x for r in rounds for x in r["trl"])
    seconds = decode + forward + update
    return {
        "decode_seconds": decode,
        "forward_seconds": forward,
        "update_seconds": update,
        "seconds": seconds,
        "trl_seconds": trl,
        "trl_over_floor": trl / seconds,
    }


SMOLLM2_MODES = ("dynamic", "static-compiled")
"""The modes of the SmolLM2-135M runs: the default and the compiled decode."""


def smollm2_command(sampler: str, iterations: int, eval_samples: int, out: str) -> list[str]:
    """``ppo-ref train`` on the ``smollm2-sentiment`` preset as a user types it, with the sampler."""
    return [
        str(Path(sys.executable).parent / "ppo-ref"),  # the command of this environment
        "train",
        "--task",
        "smollm2-sentiment",
        "--iterations",
        str(iterations),
        "--sampler",
        sampler,
        "--eval-samples",
        str(eval_samples),
        "--no-plots",
        "--out",
        out,
    ]


def _smollm2_run(sampler: str, iterations: int, eval_samples: int) -> dict[str, Any]:
    """One ``ppo-ref train --task smollm2-sentiment`` command in a child process with a cold inductor
    cache (the compile counted in full): its wall seconds, peak RSS and per-iteration stage seconds."""
    import resource
    import subprocess

    # Both directories go when the run is read: its final checkpoint alone is about 3.6 GB.
    with (
        tempfile.TemporaryDirectory(prefix=f"ppo-ref-smollm2-{sampler}-") as out,
        tempfile.TemporaryDirectory(prefix="ppo-ref-inductor-smollm2-") as cache,
    ):
        command = smollm2_command(sampler, iterations, eval_samples, out)
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        env.pop("OMP_WAIT_POLICY", None)  # the command's own thread policy, as a user's run has it
        began = time.perf_counter()
        done = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - began
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command[1:])} exited {done.returncode}: {done.stderr[-2000:]}")
        records = [json.loads(line) for line in Path(out, "metrics.jsonl").read_text().splitlines() if line]
        summary = json.loads(Path(out, "summary.json").read_text())
    keys = ("seconds_iteration", "seconds_generate", "seconds_forward", "seconds_update")
    return {
        "command": "ppo-ref " + " ".join(command[1:-2]),
        "wall_seconds": wall,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
        "iterations": [{k: r[k] for k in keys} for r in records],
        "summary": summary,
    }


def measure(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """The whole measurement: each beta's rounds (:func:`_drive`), then the SmolLM2-135M runs (one
    fresh process per mode) unless ``--no-smollm2``."""
    import datetime as dt
    import subprocess

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tools"))
    import run_bench

    from bench import tiny_grpo as g
    from tests.trainer.golden_cpus import cpu_model

    started = dt.datetime.now(dt.timezone.utc)
    data: dict[str, Any] = {
        "command": " ".join(["python bench/sampler_compare.py", *argv]).strip(),
        "started_utc": started.strftime("%Y-%m-%d %H:%M"),
        "commit": run_bench.git_commit() or "unknown",
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "settings": {"rounds": args.rounds, "block": args.block, "warmup": args.warmup, "threads": g.THREADS},
        "loadavg": [list(os.getloadavg())],
        "betas": [],
    }
    for beta in args.betas:
        data["betas"].append(_drive(args, beta))
        data["loadavg"].append(list(os.getloadavg()))
    if args.smollm2:  # each mode through a child of its own, whose only child is the command it times
        data["smollm2"] = {}
        for mode in SMOLLM2_MODES:
            worker = [sys.executable, "-m", "bench.sampler_compare", "--serve", "smollm2", "--sampler", mode]
            worker += ["--smollm2-iterations", str(args.smollm2_iterations)]
            worker += ["--smollm2-eval-samples", str(args.smollm2_eval_samples)]
            done = subprocess.run(worker, cwd=ROOT, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"the SmolLM2 {mode} run failed: {done.stderr[-2000:]}")
            data["smollm2"][mode] = json.loads(done.stdout.strip().splitlines()[-1])
        data["loadavg"].append(list(os.getloadavg()))
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=["trainer", "decode", "smollm2"], help="worker mode")
    parser.add_argument("--sampler", choices=MODES, default="dynamic")
    parser.add_argument("--beta", type=float, default=0.0, help="the trainer worker's KL coefficient")
    parser.add_argument("--betas", type=float, nargs="+", default=[0.0, 0.04], help="the comparisons' betas")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block", type=int, default=3, help="iterations per worker per round")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--omp-wait-policy", default="PASSIVE", help="as tools/run_bench.py's option")
    parser.add_argument(
        "--no-smollm2", dest="smollm2", action="store_false", help="leave out the SmolLM2-135M runs"
    )
    parser.add_argument("--smollm2-iterations", type=int, default=3, help="iterations of each SmolLM2 run")
    parser.add_argument("--smollm2-eval-samples", type=int, default=16, help="its evaluations' responses")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "sampler.json"))
    args = parser.parse_args(argv)
    if args.serve == "smollm2":
        print(json.dumps(_smollm2_run(args.sampler, args.smollm2_iterations, args.smollm2_eval_samples)))
        return 0
    if args.serve:
        from bench import tiny_grpo as g
        from bench import tiny_ppo

        torch.set_num_threads(g.THREADS)
        tiny_ppo.claim_stdout_for_protocol()
        if args.serve == "decode":
            _decode_worker()
        else:
            _trainer_worker(args.sampler, args.beta)
        return 0
    result = measure(args, list(sys.argv[1:] if argv is None else argv))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for run in result["betas"]:
        print(json.dumps({"beta": run["beta"], "median_ratios": run["median_ratios"], "floor": run["floor"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
