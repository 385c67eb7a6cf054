"""The sampler modes side by side (issue 26): GRPO iterations against TRL 1.16, and the decode alone.

``python bench/sampler_compare.py --beta 0 --rounds 5`` starts, at the GRPO benchmark's settings
(:mod:`bench.tiny_grpo`), four long-lived workers: ppo-ref's trainer with ``sampler="dynamic"``
(the default), ppo-ref's trainer with ``sampler="static-compiled"``, TRL 1.16's ``GRPOTrainer``
(``.envs/trl116``) and a decode worker; each round runs a block of iterations of each, in a rotating
order, so the machine's load hits all alike. The decode worker times, on its own copy of the model
and the same 64 prompts (8 prompts x 8), transformers' ``model.generate`` and ppo-ref's sampler in
each mode, and reports the compiled step's compile time (its first call minus a steady call) and
the resident memory it added (peak RSS before and after). The JSON of every round goes to
``--out`` (default ``bench/results/sampler-compare.json``); the ratios quoted are medians over the
rounds of ratios measured within one round.

``--serve trainer --sampler S --beta B`` and ``--serve decode`` are the worker modes.
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

    out = tempfile.mkdtemp(prefix=f"ppo-ref-sampler-{sampler}-")
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


def _drive(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tools"))
    import run_bench as rb

    env = rb.child_env(args.omp_wait_policy, int(os.environ.get("PPO_REF_BENCH_THREADS", "2")))
    python = str(rb.main_python())
    logs = rb.LOGS
    logs.mkdir(parents=True, exist_ok=True)
    me = [python, "-m", "bench.sampler_compare"]
    tag = f"beta{args.beta:g}"

    def cold(name: str) -> dict[str, str]:  # an empty inductor cache each: compile time counted in full
        return {**env, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix=f"ppo-ref-inductor-{name}-")}

    workers = {
        "dynamic": rb.Worker(
            "dynamic",
            [*me, "--serve", "trainer", "--sampler", "dynamic", "--beta", str(args.beta)],
            env,
            logs / f"sampler-dynamic-{tag}.log",
        ),
        "static-compiled": rb.Worker(
            "static-compiled",
            [*me, "--serve", "trainer", "--sampler", "static-compiled", "--beta", str(args.beta)],
            cold("trainer"),
            logs / f"sampler-static-compiled-{tag}.log",
        ),
        "trl": rb.Worker(
            "trl",
            [
                str(ROOT / ".envs" / "trl116" / "bin" / "python"),
                "-m",
                "bench.trl_grpo_iteration",
                "--serve",
                "--beta",
                str(args.beta),
            ],
            env,
            logs / f"sampler-trl-{tag}.log",
        ),
        "decode": rb.Worker(
            "decode", [*me, "--serve", "decode"], cold("decode"), logs / "sampler-decode.log"
        ),
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
        "beta": args.beta,
        "ready": ready,
        "warmup_seconds": began,
        "rounds": rounds,
        "median_ratios": {k: statistics.median(r[k] for r in rounds) for k in keys},
        "range_ratios": {k: [min(r[k] for r in rounds), max(r[k] for r in rounds)] for k in keys},
        "info": infos,
        "uptime_before": args.uptime_before,
        "uptime_after": os.popen("uptime").read().strip(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=["trainer", "decode"], help="worker mode")
    parser.add_argument("--sampler", choices=MODES, default="dynamic")
    parser.add_argument("--beta", type=float, default=0.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block", type=int, default=3, help="iterations per worker per round")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--omp-wait-policy", default="PASSIVE", help="as tools/run_bench.py's option")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "sampler-compare.json"))
    args = parser.parse_args(argv)
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
    args.uptime_before = os.popen("uptime").read().strip()
    result = _drive(args)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(
        json.dumps(
            {"median_ratios": result["median_ratios"], "range_ratios": result["range_ratios"]}, indent=1
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
