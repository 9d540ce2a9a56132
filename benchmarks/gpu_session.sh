#!/usr/bin/env bash
# The GPU session, in calls of the device tool (each under its 10-minute limit), `.whl` carried:
#     bash benchmarks/gpu_session.sh verify    # sentinel verify --device cuda --record, GPU tests, precision check
#     bash benchmarks/gpu_session.sh sanitize  # the same under compute-sanitizer (--sanitize), recorded
#     bash benchmarks/gpu_session.sh bench     # every family's default benchmark grid and its analysis
#     bash benchmarks/gpu_session.sh overhead  # public calls against a trivial torch op (benchmarks/overhead.py)
# Every step runs under its own time limit, its output is appended to $OUT/session.log, and its exit code and
# duration to $OUT/exit_codes.txt; a failing step does not stop the next one. Exit code: 0 when every step
# passed, else 1. Limits (override in the environment): VERIFY_TIMEOUT 540, TESTS_TIMEOUT 90,
# CHECK_BUDGET 150, BENCH_BUDGET 130 (seconds per family), BENCH_FAMILIES semicrf,sinkhorn,segment.
# verify runs one process per family of VERIFY_FAMILIES (default: every family; each family's record is written
# when it finishes) and, with VERIFY_ROUTES (space-separated globs, e.g. 'semicrf.triton.*'), records that part
# only: it joins the family's saved record of the same sources (copy the earlier part into traces/verification/
# first), for a family whose verification does not fit one call (none now: semicrf's took 60 s with 14 workers
# once its C = 257 compilation was gone). The GPU tests and the precision check run only with VERIFY_EXTRAS=1.
# bench leaves $OUT/benchmarks.tar.gz (<family>/ folders: CSV, JSON, memory breakdown, plots/; the device tool
# returns at most 8 files) and $OUT/session.log: tar xzf benchmarks.tar.gz -C benchmarks/results/.
set -u -o pipefail
cd "$(dirname "$0")/.."
: "${OUT:?OUT must name the folder whose files come back}"
export PYTHONUNBUFFERED=1
PHASE=${1:?usage: gpu_session.sh verify|sanitize|bench|overhead}
VERIFY_TIMEOUT=${VERIFY_TIMEOUT:-540}
VERIFY_FAMILIES=${VERIFY_FAMILIES:-semicrf sinkhorn segment}
VERIFY_ROUTES=${VERIFY_ROUTES:-}
VERIFY_EXTRAS=${VERIFY_EXTRAS:-0}
VERIFY_JOBS=${VERIFY_JOBS:-12}
TESTS_TIMEOUT=${TESTS_TIMEOUT:-90}
CHECK_BUDGET=${CHECK_BUDGET:-150}
BENCH_BUDGET=${BENCH_BUDGET:-130}
BENCH_FAMILIES=${BENCH_FAMILIES:-semicrf,sinkhorn,segment}
GPU_TESTS="tests/test_semicrf_triton.py tests/test_sinkhorn.py tests/test_gpu_call_path.py"  # tests whose kernels run on the GPU
LOG=$OUT/session.log
CODES=$OUT/exit_codes.txt
: >"$LOG"
: >"$CODES"
failed=0

# step NAME COMMAND...: run COMMAND, tee its output into the log, record its exit code and duration.
step() {
  local name=$1 start rc
  shift
  echo "=== $name: $*" | tee -a "$LOG"
  start=$(date +%s)
  "$@" 2>&1 | tee -a "$LOG"
  rc=$?
  echo "$name rc=$rc $(( $(date +%s) - start ))s" | tee -a "$LOG" >>"$CODES"
  [ "$rc" -eq 0 ] || failed=1
}

step install python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
# The tree's folders import as provable_kernels and kernel_sentinel (setup.py): link them, no install needed.
mkdir -p /tmp/import && ln -sfn "$PWD/kernels" /tmp/import/provable_kernels && ln -sfn "$PWD/sentinel" /tmp/import/kernel_sentinel
export PYTHONPATH=/tmp/site:/tmp/import
# The copy of the tree here has no .git: name the commit it was sent from (SENTINEL_COMMIT=<sha> bash ...).
step nvidia-smi nvidia-smi
if [ "$PHASE" = verify ] || [ "$PHASE" = sanitize ]; then
  SANITIZE=""
  [ "$PHASE" = sanitize ] && SANITIZE=--sanitize  # every Triton route's cases under memcheck, racecheck, ...
  verify_start=$(date +%s)
  for family in $VERIFY_FAMILIES; do
    left=$(( VERIFY_TIMEOUT - ($(date +%s) - verify_start) ))
    if [ "$left" -lt 10 ]; then  # `timeout 0` would mean no limit
      echo "verify-$family: not run, VERIFY_TIMEOUT spent" | tee -a "$LOG" >>"$CODES"; failed=1; continue
    fi
    touch "/tmp/verify-start-$family"  # the record this step writes is the one newer than this
    set -f  # VERIFY_ROUTES holds globs for --route, not file names
    # shellcheck disable=SC2086 # VERIFY_ROUTES is a list of globs
    step "$PHASE-$family" timeout "$left" python3 -m kernel_sentinel verify --family "$family" --device cuda --record \
      --jobs "$VERIFY_JOBS" $SANITIZE ${VERIFY_ROUTES:+--route $VERIFY_ROUTES} --json "$OUT/$PHASE-cuda-$family.json"
    set +f
    # only the record written here (the device tool returns at most 8 files)
    find traces/verification -name "$family-cuda-*.json" -newer "/tmp/verify-start-$family" -exec cp {} "$OUT"/ \;
  done
  if [ "$VERIFY_EXTRAS" = 1 ]; then
    step gpu-tests timeout "$TESTS_TIMEOUT" python3 -m pytest -q -p no:cacheprovider $GPU_TESTS
    step precision timeout $(( CHECK_BUDGET + 30 )) python3 benchmarks/semicrf_gpu_check.py --out "$OUT/check" \
      --only correctness,precision --budget "$CHECK_BUDGET"
  fi
elif [ "$PHASE" = overhead ]; then
  step overhead python3 -m benchmarks overhead --out "$OUT"
else
  # Each family keeps to its budget; the margin covers imports, analysis and one slow call begun near a deadline.
  nfam=$(echo "$BENCH_FAMILIES" | tr ',' '\n' | wc -l)
  step benchmark timeout $(( nfam * (BENCH_BUDGET + 45) )) python3 -m benchmarks gpu --no-progress \
    --families "$BENCH_FAMILIES" --out /tmp/bench --budget-s "$BENCH_BUDGET" --archive "$OUT/benchmarks.tar.gz"
fi

echo "=== exit codes" | tee -a "$LOG"
cat "$CODES" | tee -a "$LOG"
exit $failed
