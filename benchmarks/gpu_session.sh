#!/usr/bin/env bash
# The lead's single GPU session: install the peer wheels, show the GPU, `sentinel verify --device cuda --record`,
# the GPU-relevant tests, then the semi-CRF benchmark. Run from the device tool with `.whl` carried:
#     bash benchmarks/gpu_session.sh          (carry: [".whl"])
# Every step runs under its own time limit, its output is appended to $OUT/session.log, and its exit code and
# duration to $OUT/exit_codes.txt; a failing step does not stop the next one. Files back in $OUT (7):
# session.log, exit_codes.txt, verify-cuda.json, the verification record(s) traces/verification/*cuda*.json,
# bench/semicrf.{csv,json,png}. Exit code: 0 when every step passed, else 1. The limits (VERIFY_TIMEOUT 120,
# TESTS_TIMEOUT 60, BENCH_BUDGET 320 + 45 s; override in the environment) bound the session to ~9.2 minutes at
# worst; call the device tool with timeout_s 600.
set -u -o pipefail
cd "$(dirname "$0")/.."
: "${OUT:?OUT must name the folder whose files come back}"
export PYTHONUNBUFFERED=1
VERIFY_TIMEOUT=${VERIFY_TIMEOUT:-120}
TESTS_TIMEOUT=${TESTS_TIMEOUT:-60}
BENCH_BUDGET=${BENCH_BUDGET:-320}
GPU_TESTS="tests/test_semicrf_triton.py"  # test files whose kernels run on the GPU here
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
export PYTHONPATH=/tmp/site:$PWD
step nvidia-smi nvidia-smi
step verify timeout "$VERIFY_TIMEOUT" python3 -m sentinel verify --device cuda --record --json "$OUT/verify-cuda.json"
tests=$(for f in $GPU_TESTS; do [ -f "$f" ] && echo "$f"; done)
if [ -n "$tests" ]; then
  step gpu-tests timeout "$TESTS_TIMEOUT" python3 -m pytest -q -x -p no:cacheprovider $tests
else
  echo "gpu-tests rc=missing ($GPU_TESTS not found)" | tee -a "$LOG" >>"$CODES"
  failed=1
fi
# The benchmark keeps to its budget; the margin covers one slow call begun just before its deadline.
step benchmark timeout $(( BENCH_BUDGET + 45 )) python3 benchmarks/semicrf.py --device cuda --shapes all \
  --out "$OUT/bench" --budget-s "$BENCH_BUDGET"
step records bash -c 'cp -v traces/verification/*cuda*.json "$0"/' "$OUT"

echo "=== exit codes" | tee -a "$LOG"
cat "$CODES" | tee -a "$LOG"
exit $failed
