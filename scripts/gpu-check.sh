#!/usr/bin/env bash
# One-shot GPU check of the CUDA backend, sized for one H200 in under 8 minutes:
#   1. configure + build (Release, sm_90, tests on) only the GPU targets
#   2. the design probes (gpu-probes/ or shared/gpu-probes/ when present in the checkout)
#   3. every GPU test (pipefill_cuda_tests, pipefill_cupti_tests)
#   4. the GPU microbenchmarks (benchmarks/cuda)
#   5. the fill jobs' GPU-vs-CPU tests and the example engine on one GPU (emulated peers),
#      filled vs unfilled vs naive side by side
#   6. a summary table, printed LAST
# Every step has its own time limit so a hang shows up as a timeout (exit 124), not a stuck run.
# Logs go to $OUT when it is set (else build-gpu-check/logs). Usage: scripts/gpu-check.sh [build-dir]
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu-check}
logs=${OUT:-$build/logs}
mkdir -p "$logs"
jobs=$(nproc 2>/dev/null || echo 4)
declare -a rows
started=$(date +%s)
budget=${GPU_CHECK_BUDGET_S:-460}  # whole script, so the summary always prints within 8 minutes
export PATH=/usr/local/cuda/bin:$PATH

# run <name> <limit-seconds> <command...>: runs with a time limit, logs to $logs/<name>.log.
run() {
  local name=$1 limit=$2
  shift 2
  local left=$(( budget - ($(date +%s) - started) ))
  if [ $left -lt 10 ]; then
    rows+=("$(printf '%-34s %-14s' "$name" 'no time left')")
    return 1
  fi
  [ $limit -gt $left ] && limit=$left
  local t0=$(date +%s)
  echo "=== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  tail -n 25 "$logs/$name.log"
  local status=ok
  [ $rc -ne 0 ] && status="FAIL(rc=$rc)"
  [ $rc -eq 124 ] && status="TIMEOUT"
  rows+=("$(printf '%-34s %-14s %5ss' "$name" "$status" "$dt")")
  return $rc
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$logs/gpu.txt" 2>&1 || true
echo "GPU: $(cat "$logs/gpu.txt")"

run configure 120 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON \
  -DPIPEFILL_ENABLE_CUDA=ON -DPIPEFILL_CUDA_ARCHITECTURES=90 -DPIPEFILL_BUILD_EXAMPLES=ON \
  -DPIPEFILL_BUILD_TOOLS=OFF
configured=$?
built=0
if [ $configured -eq 0 ]; then
  run build 240 cmake --build "$build" -j "$jobs" --target pipefill_cuda_tests pipefill_cupti_tests \
    bench_gate_drain bench_bubble_instructions pipefill_fill_jobs_gpu_tests pipeline_engine && built=1
fi

probes=""
for candidate in "$root/gpu-probes" "$root/shared/gpu-probes" "$root/../shared/gpu-probes"; do
  [ -f "$candidate/run.sh" ] && { probes=$candidate; break; }
done
if [ -n "$probes" ]; then
  OUT=$logs run probes 200 bash "$probes/run.sh"
else
  rows+=("$(printf '%-34s %-14s' probes 'absent')")
fi

if [ $built -eq 1 ]; then
  run cupti_conversion_tests 60 "$build/tests/pipefill_cupti_tests"
  run cuda_tests 150 "$build/tests/pipefill_cuda_tests"
  run bench_gate_drain 90 "$build/benchmarks/bench_gate_drain"
  run bench_bubble_instructions 60 "$build/benchmarks/bench_bubble_instructions"
  run fill_jobs_gpu_tests 60 "$build/examples/fill_jobs/pipefill_fill_jobs_gpu_tests"
  run engine_emulated 90 "$build/examples/pipeline_engine/pipeline_engine" --transport emulated \
    --stages 4 --microbatches 8 --fill mlp --iterations 6 --naive
fi

# ---- Summary (last) --------------------------------------------------------------------------
{
  echo
  echo "==================== GPU CHECK SUMMARY ($(( $(date +%s) - started ))s) ===================="
  echo "GPU: $(cat "$logs/gpu.txt")"
  printf '%-34s %-14s %6s\n' step status time
  for r in "${rows[@]}"; do echo "$r"; done
  if [ -f "$logs/cuda_tests.log" ]; then
    echo "-- tests: $(grep -E '^\[  (PASSED|FAILED) ' "$logs/cuda_tests.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \] [A-Za-z]' "$logs/cuda_tests.log" | sort -u | head -20
    grep -E '^\[ info \]' "$logs/cuda_tests.log" | head -10
  fi
  for f in "$logs"/probes-*.txt; do
    [ -f "$f" ] || continue
    echo "-- $(basename "$f"):"
    sed -n '/^probe  *|/,$p' "$f"
  done
  for b in bench_gate_drain bench_bubble_instructions; do
    [ -f "$logs/$b.log" ] && grep -E '^(RATIO|partition|SKIPPED|\(baseline)' "$logs/$b.log"
  done
  [ -f "$logs/fill_jobs_gpu_tests.log" ] &&
    echo "-- fill jobs GPU tests: $(grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\] [0-9]' "$logs/fill_jobs_gpu_tests.log" | tr '\n' ' ')"
  [ -f "$logs/engine_emulated.log" ] &&
    grep -E '^(mean from|max overrun|bubble end|fill check)' "$logs/engine_emulated.log" | sed 's/^/-- engine: /'
} | tee "$logs/summary.txt"
