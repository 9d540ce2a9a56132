#!/usr/bin/env bash
# The GPU session, one device-tool call per phase (each under its 10-minute limit), `.whl` carried and
# SENTINEL_COMMIT=<sha> (the commit the tree was sent from) set:
#     bash benchmarks/gpu_session.sh verify     # sentinel verify --device cuda --record, one process per family
#     bash benchmarks/gpu_session.sh sanitize   # the same under compute-sanitizer (--sanitize), recorded
#     bash benchmarks/gpu_session.sh bench      # python -m benchmarks gpu: every family's default grid and analysis
#     bash benchmarks/gpu_session.sh overhead   # python -m benchmarks overhead: public calls vs a trivial op, kernels
#     bash benchmarks/gpu_session.sh breakdown  # python -m benchmarks breakdown: every CUDA kernel of a public call
#     bash benchmarks/gpu_session.sh check      # python -m benchmarks check: the families' GPU checks beyond timing
#     bash benchmarks/gpu_session.sh mutate     # sentinel mutate on the host's CPU (interpreter), kept across calls
# Families are discovered, never named here: verify and sanitize loop over sentinel's registry (the family folders
# of kernels/), the benchmark phases over the benchmark adapters (benchmarks.adapters.families()); FAMILIES
# (space-separated) narrows both. Every step runs under its own time limit, its output is appended to
# $OUT/session.log, and its exit code and duration to $OUT/exit_codes.txt; a failing step does not stop the next
# one. Exit code: 0 when every step passed, else 1.
# The benchmark phases leave $OUT/<phase>.tar.gz holding <family>/<device slug>/ folders (the device tool returns
# at most 8 files), the layout of benchmarks/results/ (the latest run per family and device): back here,
# `tar xzf <phase>.tar.gz -C benchmarks/results/`, then `python -m benchmarks site`, and commit both.
# Limits (override in the environment): VERIFY_TIMEOUT 540, TESTS_TIMEOUT 180, BENCH_BUDGET 130 (seconds per
# family: bench), CHECK_BUDGET 150 (seconds per family: check; checks that do not fit are recorded as skipped:
# split the phase over calls with CHECK_ONLY=name,name and FAMILIES), BREAKDOWN_BUDGET 120 (seconds per family).
# DEVICES (verify and sanitize) spreads each family's verification over several GPUs: DEVICES=all, or a list such as
# DEVICES=cuda:0,cuda:1 (sentinel verify --devices: VERIFY_JOBS worker processes rounded up to the same count per GPU,
# each pinned to its GPU; the compute-sanitizer processes go to the same GPUs); the end of each step's output has
# a table of each GPU's share, and $OUT/<phase>-cuda-<family>.json its "devices" entry. Unset: the current GPU only.
# verify with VERIFY_ROUTES (space-separated globs, e.g. '<family>.triton.*') records that part only: it joins the
# family's saved record of the same sources (copy the earlier part into traces/verification/ first). With
# VERIFY_EXTRAS=1, verify also runs the GPU tests (GPU_TESTS; default: tests/test_gpu_call_path.py and each
# family's tests/test_<family>_triton.py, else tests/test_<family>.py).
# mutate runs `sentinel mutate --record` per family on the host's CPU (the Triton interpreter, no GPU), a seeded
# sample (MUTATE_N 60, MUTATE_SEED 0) over MUTATE_JOBS workers (default: the CPUs less VERIFY_JOBS and 2), for at most
# MUTATE_TIMEOUT seconds (540). A run that does not finish in one call goes on in the next: it keeps its state in
# traces/verification/mutation/<family>-progress.json.gz (read when present), returned as $OUT/<family>-progress.json.gz
# with $OUT/<family>.json, the record, once every mutant has settled (then delete the progress file). MUTATE_RERUN
# (a file of the tree sent, with FAMILIES naming its one family) is passed as --rerun: the survivors of that record
# run again beside the sample (default: those of the family's committed record). It uses only
# CPUs, so it can run beside verify or sanitize on one host: start the two phases with different OUT folders.
set -u -o pipefail
cd "$(dirname "$0")/.."
: "${OUT:?OUT must name the folder whose files come back}"
export PYTHONUNBUFFERED=1
PHASE=${1:?usage: gpu_session.sh verify|sanitize|bench|overhead|breakdown|check|mutate}
case "$PHASE" in verify|sanitize|bench|overhead|breakdown|check|mutate) ;; *) echo "unknown phase $PHASE" >&2; exit 2;; esac
# Every phase stamps what it writes with a commit, and the copy of the tree sent here has no .git of its own (or a
# stale one): the caller names the commit it sent.
if [ -z "${SENTINEL_COMMIT:-}" ]; then
  echo "SENTINEL_COMMIT must name the commit this tree was sent from (SENTINEL_COMMIT=<sha> bash $0 $PHASE)" >&2
  exit 2
fi
VERIFY_TIMEOUT=${VERIFY_TIMEOUT:-540}
VERIFY_ROUTES=${VERIFY_ROUTES:-}
VERIFY_EXTRAS=${VERIFY_EXTRAS:-0}
VERIFY_JOBS=${VERIFY_JOBS:-12}
DEVICES=${DEVICES:-}
TESTS_TIMEOUT=${TESTS_TIMEOUT:-180}
BENCH_BUDGET=${BENCH_BUDGET:-130}
CHECK_BUDGET=${CHECK_BUDGET:-150}
BREAKDOWN_BUDGET=${BREAKDOWN_BUDGET:-120}
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

# Once per set of wheels: a phase started beside another (mutate beside sanitize) waits for the other's install
# (flock) and then finds it done, so it never rewrites /tmp/site under a running phase.
WHEELS=$(ls -l .whl/*.whl | md5sum | cut -c1-12)
step install flock /tmp/site.lock sh -c "[ -f /tmp/site/.wheels-$WHEELS ] || { python3 -m pip install -q --no-index \
  --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.wheels-$WHEELS; }"
# The tree's folders import as provable_kernels and kernel_sentinel (setup.py): link them, no install needed.
mkdir -p /tmp/import && ln -sfn "$PWD/kernels" /tmp/import/provable_kernels \
  && ln -sfn "$PWD/sentinel" /tmp/import/kernel_sentinel
export PYTHONPATH=/tmp/site:/tmp/import
step nvidia-smi nvidia-smi

if [ "$PHASE" = verify ] || [ "$PHASE" = sanitize ]; then
  VERIFIED=${FAMILIES:-$(python3 -c \
    "from kernel_sentinel.registry import families; print(*(f.name for f in families()))")}
  SANITIZE=""
  [ "$PHASE" = sanitize ] && SANITIZE=--sanitize  # every Triton route's cases under memcheck, racecheck, ...
  verify_start=$(date +%s)
  for family in $VERIFIED; do
    left=$(( VERIFY_TIMEOUT - ($(date +%s) - verify_start) ))
    if [ "$left" -lt 10 ]; then  # `timeout 0` would mean no limit
      echo "$PHASE-$family: not run, VERIFY_TIMEOUT spent" | tee -a "$LOG" >>"$CODES"; failed=1; continue
    fi
    touch "/tmp/verify-start-$family"  # the record this step writes is the one newer than this
    set -f  # VERIFY_ROUTES holds globs for --route, not file names
    # shellcheck disable=SC2086 # VERIFY_ROUTES is a list of globs
    step "$PHASE-$family" timeout "$left" python3 -m kernel_sentinel verify --family "$family" --device cuda --record \
      --jobs "$VERIFY_JOBS" $SANITIZE ${DEVICES:+--devices "$DEVICES"} ${VERIFY_ROUTES:+--route $VERIFY_ROUTES} \
      --json "$OUT/$PHASE-cuda-$family.json"
    set +f
    # only the record written here (the device tool returns at most 8 files)
    find traces/verification -name "$family-cuda-*.json" -newer "/tmp/verify-start-$family" -exec cp {} "$OUT"/ \;
  done
  if [ "$VERIFY_EXTRAS" = 1 ]; then
    if [ -z "${GPU_TESTS:-}" ]; then
      GPU_TESTS=tests/test_gpu_call_path.py
      for family in $VERIFIED; do
        for file in "tests/test_${family}_triton.py" "tests/test_${family}.py"; do
          if [ -f "$file" ]; then GPU_TESTS="$GPU_TESTS $file"; break; fi
        done
      done
    fi
    # shellcheck disable=SC2086 # GPU_TESTS is a list of files
    step gpu-tests timeout "$TESTS_TIMEOUT" python3 -m pytest -q -p no:cacheprovider $GPU_TESTS
  fi
elif [ "$PHASE" = mutate ]; then
  MUTATED=${FAMILIES:-$(python3 -c "from kernel_sentinel.registry import families; print(*(f.name for f in families()))")}
  MUTATE_JOBS=${MUTATE_JOBS:-$(( $(nproc) - VERIFY_JOBS - 2 > 1 ? $(nproc) - VERIFY_JOBS - 2 : 1 ))}
  mutate_start=$(date +%s)
  for family in $MUTATED; do
    left=$(( ${MUTATE_TIMEOUT:-540} - ($(date +%s) - mutate_start) ))
    if [ "$left" -lt 10 ]; then
      echo "mutate-$family: not run, MUTATE_TIMEOUT spent" | tee -a "$LOG" >>"$CODES"; failed=1; continue
    fi
    progress=traces/verification/mutation/$family-progress.json.gz kept=/tmp/$family-kept.json
    rm -f "$kept"  # the committed progress file, or a fresh start
    [ -f "$progress" ] && gunzip -c "$progress" > "$kept"
    # --foreground: the signal at the limit goes to the run alone, which stops its workers and keeps what settled
    step "mutate-$family" env CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 timeout --foreground "$left" \
      python3 -m kernel_sentinel mutate --family "$family" -n "${MUTATE_N:-60}" --seed "${MUTATE_SEED:-0}" \
      --jobs "$MUTATE_JOBS" --split-after 60 --keep "$kept" --record --json "$OUT/mutate-$family.json" \
      ${MUTATE_RERUN:+--rerun "$MUTATE_RERUN"}
    [ -f "$kept" ] && gzip -c "$kept" > "$OUT/$family-progress.json.gz"
    [ -f "$OUT/mutate-$family.json" ] && cp "traces/verification/mutation/$family.json" "$OUT/"
  done
else
  BENCHED=${FAMILIES:-$(python3 -c "from benchmarks.adapters import families; print(*families())")}
  nfam=$(echo "$BENCHED" | wc -w)
  csv=$(echo "$BENCHED" | tr ' ' ',')
  # Each family keeps to its budget; the margin covers imports, floors, analysis and one slow call begun near a
  # deadline. Results go to /tmp/<phase>/<family>/<device slug>/, packed into $OUT/<phase>.tar.gz.
  case "$PHASE" in
    bench) step bench timeout $(( nfam * (BENCH_BUDGET + 45) )) python3 -m benchmarks gpu --no-progress \
             --families "$csv" --out /tmp/bench --budget-s "$BENCH_BUDGET" --archive "$OUT/bench.tar.gz" ;;
    overhead) step overhead timeout 540 python3 -m benchmarks overhead --families "$csv" --out /tmp/overhead \
                --archive "$OUT/overhead.tar.gz" ;;
    breakdown) step breakdown timeout $(( nfam * (BREAKDOWN_BUDGET + 30) )) python3 -m benchmarks breakdown \
                 --families "$csv" --out /tmp/breakdown --budget-s "$BREAKDOWN_BUDGET" \
                 --archive "$OUT/breakdown.tar.gz" ;;
    check) step check timeout $(( nfam * (CHECK_BUDGET + 30) )) python3 -m benchmarks check --families "$csv" \
             --out /tmp/check --budget-s "$CHECK_BUDGET" ${CHECK_ONLY:+--only "$CHECK_ONLY"} \
             --archive "$OUT/check.tar.gz" ;;
  esac
fi

echo "=== exit codes" | tee -a "$LOG"
cat "$CODES" | tee -a "$LOG"
exit $failed
