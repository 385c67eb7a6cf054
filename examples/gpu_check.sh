#!/usr/bin/env bash
# GPU check of ppo-ref's data parallelism and checkpoints, through the accelerate configs in
# examples/accelerate/: DDP, DeepSpeed ZeRO-2, DeepSpeed ZeRO-3 and FSDP2.
#
#   bash examples/gpu_check.sh                 # every GPU of the machine, results in $OUT
#   OUT=/tmp/check NPROC=2 bash examples/gpu_check.sh
#
# For each config it trains a tiny GPT-2 (random weights, built locally, nothing downloaded) for
# 2 iterations with a checkpoint after each, checks that the run ended cleanly with finite metrics
# and a checkpoint iter-000002, then resumes it to 3 iterations (DeepSpeed: checks that resuming is
# refused with a clear error, since its optimizer state is not saved). With 2 or more GPUs it also
# trains the same run in one process, in NPROC DDP processes and in NPROC FSDP2 processes, in
# float32 without autocast, and reports the largest parameter difference of each against one
# process (the CPU tests assert equality to 1e-6 in float64; on GPUs the kernels differ with the
# batch shape, so the difference is reported, and flagged above 1e-3).
# DeepSpeed configs are skipped, with the reason, when the deepspeed package is not installed.
#
# What the CPU tests already prove, on two gloo processes (tests/reliability/): DDP and FSDP2 give
# the one-process run (float64, parameters to 1e-6), an FSDP2 checkpoint resumes exactly, and
# sharded generation keeps every process sampling until all have ended. What only this script
# checks: NCCL and CUDA devices, bf16 autocast (the default on GPUs), DeepSpeed ZeRO-2 and ZeRO-3,
# and more than two processes.
#
# Needs: a CUDA GPU, this repository installed (pip install -e .), accelerate; deepspeed optional.
# NPROC (default: the number of GPUs) must divide 16. PYTHON picks the interpreter (default python).
# GPU_CHECK_CPU_DRY_RUN=1 runs the DDP and FSDP2 steps on CPU processes (NPROC, default 2, over
# gloo) to check this script's plumbing on a machine without a GPU; nothing about GPUs is learnt
# from it.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=${OUT:-/tmp/ppo-ref-gpu-check}
DRY_RUN=${GPU_CHECK_CPU_DRY_RUN:-0}
rm -rf "$OUT"
mkdir -p "$OUT"
RESULTS="$OUT/gpu_check_results.txt"
: >"$RESULTS"
failures=0

GPUS=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())")
if [[ "$DRY_RUN" == "1" ]]; then
    NPROC=${NPROC:-2}
    LAUNCH_EXTRA=()
    echo "dry run on CPU processes (GPU_CHECK_CPU_DRY_RUN=1): DDP and FSDP2 configs over gloo" | tee -a "$RESULTS"
elif [[ "$GPUS" -lt 1 ]]; then
    echo "no CUDA GPU found (torch.cuda.device_count() = 0); nothing to check" >&2
    exit 1
else
    NPROC=${NPROC:-$GPUS}
    LAUNCH_EXTRA=()
fi
if (( 16 % NPROC != 0 )); then
    echo "NPROC=$NPROC must divide 16 (the minibatch of these runs); set NPROC=1, 2, 4, 8 or 16" >&2
    exit 1
fi
"$PYTHON" - <<'EOF' | tee -a "$RESULTS"
import accelerate, torch, transformers, ppo_ref
gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
try:
    import deepspeed
    ds = deepspeed.__version__
except ImportError:
    ds = "not installed"
print(f"ppo_ref {ppo_ref.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
      f"accelerate {accelerate.__version__}, deepspeed {ds}; GPUs: {gpus or 'none'}")
EOF
echo "processes per run: $NPROC" | tee -a "$RESULTS"

# The tiny local models and prompts (the same as the reliability tests use).
INPUTS="$OUT/inputs"
"$PYTHON" - "$INPUTS" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, "tests/reliability")
from reliability_support import write_local_inputs
Path(sys.argv[1]).mkdir(parents=True)
write_local_inputs(Path(sys.argv[1]))
EOF

# Batch sizes divisible by any process count up to 8 (rows per process: 16 / NPROC per minibatch).
common_args() {
    echo --policy "$INPUTS/policy" --reward "$INPUTS/reward" --prompts "$INPUTS/p.jsonl" \
        --rollout-batch-size 64 --num-minibatches 4 --ppo-epochs 2 --max-new-tokens 8 \
        --eval-samples 64 --audit-samples 2 --no-progress-bar --no-tensorboard --no-plots
}

launch() {  # launch CONFIG PROCESSES LOG ARGS...
    local config=$1 processes=$2 log=$3
    shift 3
    "$PYTHON" -m accelerate.commands.launch --config_file "examples/accelerate/$config.yaml" \
        --num_processes "$processes" ${LAUNCH_EXTRA[@]+"${LAUNCH_EXTRA[@]}"} -m ppo_ref.cli "$@" >"$log" 2>&1
}

check_run() {  # check_run OUT_DIR ITERATIONS: summary written, metrics finite, checkpoint present
    "$PYTHON" - "$1" "$2" <<'EOF'
import json, math, sys
from pathlib import Path
out, iterations = Path(sys.argv[1]), int(sys.argv[2])
records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
assert [r["iteration"] for r in records] == list(range(iterations)), [r["iteration"] for r in records]
for r in records:
    for key in ("policy_loss", "value_loss", "approx_kl", "kl_ref", "entropy"):
        assert r[key] is not None and math.isfinite(r[key]), (r["iteration"], key, r[key])
    assert r["nonfinite_steps"] == 0 and r["logprob_check_max_abs_diff"] is not None
assert (out / "checkpoints" / f"iter-{iterations:06d}" / "trainer_state.json").is_file()
summary = json.loads((out / "summary.json").read_text())
print(f"iterations {len(records)}, processes {summary['processes']} ({summary['data_parallel']}), "
      f"step-0 |log-ratio| {records[0]['logprob_check_max_abs_diff']:.2e}, "
      f"{records[-1]['seconds_iteration']:.2f} s/iteration, eval {summary['eval_score_final']}")
EOF
}

record() {  # record NAME STATUS DETAIL
    printf '%-18s %-5s %s\n' "$1" "$2" "$3" | tee -a "$RESULTS"
    if [[ "$2" == "FAIL" ]]; then failures=$((failures + 1)); fi
}

CONFIGS=(ddp deepspeed_zero2 deepspeed_zero3 fsdp2)
if [[ "$DRY_RUN" == "1" ]]; then CONFIGS=(ddp fsdp2); fi
HAVE_DEEPSPEED=$("$PYTHON" -c "import importlib.util as u; print(int(u.find_spec('deepspeed') is not None))")

for config in "${CONFIGS[@]}"; do
    if [[ "$config" == deepspeed_* && "$HAVE_DEEPSPEED" != "1" ]]; then
        record "$config" SKIP "deepspeed is not installed (pip install deepspeed)"
        continue
    fi
    run="$OUT/$config"
    started=$(date +%s)
    # shellcheck disable=SC2046
    if ! launch "$config" "$NPROC" "$OUT/$config.train.log" train $(common_args) \
        --out "$run" --iterations 2 --save-every 1; then
        record "$config" FAIL "training failed: $(tail -n 3 "$OUT/$config.train.log" | tr '\n' ' ')"
        continue
    fi
    if ! detail=$(check_run "$run" 2 2>&1); then
        record "$config" FAIL "bad outputs: $detail"
        continue
    fi
    record "$config" PASS "train: $detail ($(($(date +%s) - started)) s)"
    if [[ "$config" == deepspeed_* ]]; then
        status=0
        launch "$config" "$NPROC" "$OUT/$config.resume.log" train --resume "$run" --iterations 3 \
            --no-progress-bar || status=$?
        if [[ "$status" == "2" ]] && grep -q "resuming under DeepSpeed is not supported" "$OUT/$config.resume.log"; then
            record "$config" PASS "resume refused clearly (DeepSpeed optimizer state is not saved)"
        else
            record "$config" FAIL "resume: expected exit 2 with a clear error, got $status"
        fi
        continue
    fi
    if launch "$config" "$NPROC" "$OUT/$config.resume.log" train --resume "$run" --iterations 3 \
        --no-progress-bar && detail=$(check_run "$run" 3 2>&1); then
        record "$config" PASS "resume to 3: $detail"
    else
        record "$config" FAIL "resume failed: $(tail -n 3 "$OUT/$config.resume.log" | tr '\n' ' ')"
    fi
done

# One process against NPROC DDP processes and NPROC FSDP2 processes, float32 without autocast,
# the same global batch.
if [[ "$NPROC" -ge 2 ]]; then
    # shellcheck disable=SC2046
    if launch ddp 1 "$OUT/equal.one.log" train $(common_args) --out "$OUT/equal-one" --iterations 2 \
        --mixed-precision no; then
        for config in ddp fsdp2; do
            # shellcheck disable=SC2046
            if ! launch "$config" "$NPROC" "$OUT/equal.$config.log" train $(common_args) \
                --out "$OUT/equal-$config" --iterations 2 --mixed-precision no; then
                record "$config 1-vs-$NPROC" FAIL "the $NPROC-process run failed (see $OUT/equal.$config.log)"
                continue
            fi
            detail=$("$PYTHON" - "$OUT/equal-one" "$OUT/equal-$config" "$config" <<'EOF'
import json, sys
from ppo_ref.trainer import load_checkpoint
one, many = (load_checkpoint(p) for p in sys.argv[1:3])
backend = many.state["data_parallel"]
worst = 0.0
for name in ("policy", "critic"):
    a, b = one.state_dict(name), many.state_dict(name)
    worst = max(worst, max(float((a[k] - b[k]).abs().max()) for k in a))
same = [json.loads(l)["response_ids"] for l in (one.path.parents[1] / "rollouts.jsonl").read_text().splitlines()]
also = [json.loads(l)["response_ids"] for l in (many.path.parents[1] / "rollouts.jsonl").read_text().splitlines()]
print(f"{backend}: max |parameter difference| {worst:.3e}; audited samples identical: {same == also}")
expected = "fsdp" if sys.argv[3] == "fsdp2" else "ddp"
sys.exit(0 if worst < 1e-3 and same == also and backend == expected else 1)
EOF
            ) && status=0 || status=$?
            if [[ "$status" == "0" ]]; then
                record "$config 1-vs-$NPROC" PASS "$detail"
            else
                record "$config 1-vs-$NPROC" FAIL "$detail"
            fi
        done
    else
        record "1-vs-$NPROC" FAIL "the one-process run failed (see $OUT/equal.one.log)"
    fi
else
    record "1-vs-N" SKIP "needs 2 or more GPUs (NCCL cannot put two processes on one GPU)"
fi

echo "results: $RESULTS"
if [[ "$failures" -gt 0 ]]; then
    echo "$failures check(s) failed" >&2
    exit 1
fi
