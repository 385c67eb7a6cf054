"""The PPO-family ops at large shapes, ppo-ref and each library side by side (issue 14, part 4).

Cases (one per op, variant and pass; ``fwd`` runs without autograd, ``fwd+bwd`` builds the graph
and calls ``backward()``):

- ``group_advantages/{grpo,dr_grpo,rloo}``: B = 65,536 scores in 4,096 groups of 16;
- ``aggregate_loss/{token-mean,seq-mean-token-mean,seq-mean-token-sum,seq-mean-token-sum-norm}``,
  ``policy_loss/clip-higher+dual-clip``, ``gspo_loss``, ``cispo_loss``, ``kl_loss/{k3,k3+}`` and
  ``rollout_correction/{token-truncate,sequence-mask}``: B = 256, T = 2048, right padding (each
  row keeps between T/2 and T tokens).

Every side calls the library's own function (verl 0.9.1 ``core_algos.py`` and
``rollout_corr_helper.py``; OpenRLHF 0.11.2 ``models/loss.py``, ``models/utils.py`` and, for the
group advantages it keeps inline, the pinned lines of ``experience_maker.py`` run through
:mod:`ppo_ref.adapters.thirdparty._inline`; skyrl 0.4.0 ``skyrl/backends/skyrl_train/utils/ppo_utils.py``,
whose losses sum, so its loss cases call the advantage scaling its trainer applies first,
``apply_loss_reduction_to_advantages_minibatch``, inside the timed call; TRL 1.16
``GRPOTrainer``'s inline group block, pinned the same way: its losses are inline code that reads
trainer attributes and are not benchmarked), with the
arguments the library's trainer hands it (float masks, token-level rewards of width 1 and a numpy
index for verl's and skyrl's estimators, per-token advantages for the sequence losses). Argument
conversion happens once, outside the timed call; ppo-ref gets bool masks and (B,) group ids.
Each case also knows ppo-ref's result under the library's conventions (its epsilon, its
aggregation), so :func:`check` measures that both sides compute the same numbers.

Two ways to run it:

- ``python bench/family_side.py --compare`` (from ``.venv``): one long-lived worker per
  implementation (``mine`` in this interpreter's environment, each library in ``.envs/NAME``),
  driven in rounds that alternate the order, so the machine's changing load hits every side alike.
  Prints a markdown table of median milliseconds and the ratio ppo-ref / fastest library per round
  (median, min, max over the rounds) and writes ``bench/results/family.json``.
- ``bench/test_family_ops.py``: the same cases under pytest-benchmark, one implementation per run
  (``--bench-impl``); small shapes under ``--benchmark-disable``.

Side names: ``mine``, ``verl``, ``openrlhf``, ``skyrl``, ``trl116``; a library's second implementation of an
op gets its own label (verl's Python-loop ``grpo``/``rloo`` estimators, the defaults of its
``adv_estimator``, are ``verl-loop``).

This script is the command line and the worker's end (``--serve SIDE``); the parts live in
``bench/family/``: ``cases.py`` (shapes, inputs, the case type, ppo-ref's expected values),
``mine.py`` and one module per library side (``verl.py``, ``openrlhf.py``, ``skyrl.py``,
``trl116.py``), ``sides.py`` (which builds which side), ``compare.py`` (the workers and the
rounds; the protocol is :mod:`bench.worker`, shared with ``tools/run_bench.py``) and
``section.py`` (the ``bench/RESULTS.md`` section).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import worker  # noqa: E402
from bench.family.cases import FULL, SMALL, Shapes, check  # noqa: E402
from bench.family.compare import compare  # noqa: E402
from bench.family.section import section  # noqa: E402
from bench.family.sides import SIDES, cases_for  # noqa: E402

__all__ = ["MEASURED_MODULES", "main", "section", "serve"]


def _threads() -> int:
    return int(os.environ.get("PPO_REF_BENCH_THREADS", "2"))


def serve(side: str, shapes: Shapes) -> None:
    """The worker's end (:mod:`bench.worker`): a first line with the cases of ``side`` (or, if they
    cannot be built here, ``{"ok": false, "error": ...}``), then ``{"cmd": "time", "key", "label",
    "reps"}`` -> ``{"wall": [...], "cpu": [...]}`` seconds per call and ``{"cmd": "check", "key",
    "label"}`` -> :func:`~bench.family.cases.check`'s differences, until ``quit`` or EOF."""
    worker.claim_stdout_for_protocol()
    torch.set_num_threads(_threads())
    try:
        cases = cases_for(side, shapes)
    except Exception as error:  # reported to the coordinator, which leaves the side out
        worker.reply({"ok": False, "error": f"{type(error).__name__}: {error}"})
        return
    worker.reply(
        {
            "ok": True,
            "cases": [list(k) for k in cases],
            "notes": {f"{k[0]}|{k[1]}": c.note for k, c in cases.items() if c.note},
        }
    )

    def case_of(request: dict[str, Any]) -> Any:
        return cases.get((request.get("key", ""), request.get("label", "")))

    def time_case(request: dict[str, Any]) -> dict[str, Any]:
        case = case_of(request)
        if case is None:
            return {"error": f"bad request {request}"}
        wall, cpu = [], []
        for _ in range(int(request["reps"])):
            w0, c0 = time.perf_counter(), time.process_time()
            case.call()
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
        return {"wall": wall, "cpu": cpu}

    def check_case(request: dict[str, Any]) -> dict[str, Any]:
        case = case_of(request)
        return {"error": f"bad request {request}"} if case is None else dict(check(case))

    worker.serve({"time": time_case, "check": check_case})


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    measured = [f"ppo_ref/{name}.py" for name in MEASURED_MODULES]
    dirty = subprocess.run(
        ["git", "status", "--porcelain", *measured], cwd=ROOT, capture_output=True, text=True
    )
    suffix = " + uncommitted changes to the measured functions" if dirty.stdout.strip() else ""
    return done.stdout.strip() + suffix


MEASURED_MODULES = (
    "group",
    "aggregation",
    "losses",
    "variants",
    "kl_loss",
    "correction",
    "masked",
    "_validate",
)
"""The modules of ppo_ref whose functions the cases call (a change elsewhere does not move the figures)."""


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", choices=SIDES, help="run as a worker for this side")
    parser.add_argument("--compare", action="store_true", help="run every side, side by side")
    parser.add_argument("--small", action="store_true", help="small shapes (a quick pipeline check)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=0.25, help="target seconds per timed block")
    parser.add_argument("--max-reps", type=int, default=25)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--omp-wait-policy", default="PASSIVE")
    parser.add_argument(
        "--malloc-keep",
        action="store_true",
        help="every worker's glibc malloc keeps freed memory (MALLOC_TRIM_THRESHOLD_ and _MMAP_THRESHOLD_)",
    )
    parser.add_argument(
        "--only", nargs="*", default=[], help="library sides to run (default: every built one)"
    )
    parser.add_argument("--cases", nargs="*", default=[], help="case-key prefixes to run (default: all)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "family.json"))
    parser.add_argument("--log", default="/tmp/ppo-ref-family-bench.log", help="the workers' stderr")
    parser.add_argument(
        "--write-results",
        action="store_true",
        help="name the report (and --also) as the family data in bench/results/manifest.json and "
        "re-render bench/RESULTS.md whole (bench/results_document.py)",
    )
    parser.add_argument(
        "--also",
        nargs="*",
        default=[],
        help="earlier reports (JSON) whose ratios the section adds as columns",
    )
    parser.add_argument("--render", help="no run: render the section from this report (JSON) and --also")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    shapes = SMALL if args.small else FULL
    if args.serve:
        serve(args.serve, shapes)
        return 0
    if args.render:
        report = json.loads(Path(args.render).read_text())
    elif args.compare:
        report = compare(args)
        report["commit"] = _commit()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    else:
        print("pass --compare, --render REPORT or --serve SIDE", file=sys.stderr)
        return 2
    reports = [report] + [json.loads(Path(path).read_text()) for path in args.also]
    print(section(reports))
    if args.write_results:
        from bench import results_document as document

        files = [Path(args.render or args.out), *map(Path, args.also)]
        if any(f.resolve().parent != document.RESULTS_DIR for f in files):
            print("--write-results: the reports must be in bench/results/", file=sys.stderr)
            return 2
        document.write_manifest(
            document.RESULTS_DIR,
            {"family": [f.name for f in files]},
            header=None,
            new_data=not args.render,
        )
        for path in document.write():
            print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
