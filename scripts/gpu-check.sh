#!/usr/bin/env bash
# One-shot GPU check of the CUDA backend, sized for one H200 (16 cores) in under 8 minutes:
#   1. configure (Release, sm_90, tests on, no tools; the Python extension in the same tree when
#      python3 has torch and nanobind and the Python headers the extension's configure needs -
#      checked first, and said so when absent). Dependencies the GPU image lacks come from
#      .gpu-deps/ (scripts/stage-gpu-deps.sh, run beforehand elsewhere).
#   2. build the core and the Python extension, then the Python steps FIRST (issue 24 item 9: they
#      answer the most and used to come after the long C++ steps): the graph fill check and each
#      part of the CUDA streaming check as a step of its own (inference, training, the trainer's
#      stream across a job creation, a torch green context current across the runtime's calls), so
#      one failing part hides nothing. Meanwhile the C++ GPU targets build in the background
#      (nice'd, two cores fewer).
#   3. each C++ GPU target run on its own, in order of what it answers (a step runs when its binary
#      exists): CUPTI conversion tests, the CUDA device tests, the GPU microbenchmarks, the fill
#      jobs' GPU-vs-CPU tests, the example engine on one GPU (emulated peers) with its no-fill,
#      PipeFill and naive runs side by side, and last the design probes (gpu-probes/ when present).
#   4. a summary, printed LAST.
# Every step has its own time limit (and the whole script a budget, GPU_CHECK_BUDGET_S), so a
# hang shows as TIMEOUT, not a stuck run. Full logs go to <build>/logs; what comes back from the
# GPU machine ($OUT: at most 8 files) is exactly two files: $OUT/summary.txt and $OUT/logs.tar.gz
# (without $OUT: <build>/out). Without a GPU every GPU step skips or refuses cleanly.
# Usage: scripts/gpu-check.sh [build-dir]   Extra configure arguments: GPU_CHECK_CMAKE_ARGS.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu-check}
logs=$build/logs
out=${OUT:-$build/out}
rm -rf "$logs"
mkdir -p "$logs" "$out"
jobs=$(nproc 2>/dev/null || echo 4)
declare -a rows
started=$(date +%s)
budget=${GPU_CHECK_BUDGET_S:-450}  # whole script, so the summary always prints within 8 minutes
scale=${GPU_CHECK_TIME_SCALE:-1}   # multiplies every step's limit (slow CPU-only proof runs)
export PATH=/usr/local/cuda/bin:$PATH

# Status of a finished step from its exit code and log: gtest and benchmark binaries report
# their own skips; a binary that refuses without a GPU says "no CUDA device".
classify() {  # <rc> <log>
  local rc=$1 log=$2
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo TIMEOUT; return; fi
  local passed skipped failed
  passed=$(grep -E '^\[  PASSED  \] [0-9]+ test' "$log" | tail -1 | grep -oE '[0-9]+' | head -1)
  skipped=$(grep -E '^\[  SKIPPED \] [0-9]+ test' "$log" | tail -1 | grep -oE '[0-9]+' | head -1)
  failed=$(grep -E '^\[  FAILED  \] [A-Za-z][^ ]*$' "$log" | sort -u | wc -l)
  if [ -n "$passed" ] || [ -n "$skipped" ]; then
    local verdict=ok
    [ "$rc" -ne 0 ] && verdict="FAIL(rc=$rc)"
    [ "${failed:-0}" -gt 0 ] && verdict=FAIL
    echo "$verdict ${passed:-0}p/${skipped:-0}s/${failed:-0}f"
    return
  fi
  # The probes' run.sh reports its two runs' exit codes in the log and itself exits 0.
  if grep -q '^build failed' "$log"; then echo "FAIL(build)"; return; fi
  if grep -q 'libcuda.so.1: cannot open shared object file' "$log"; then echo "refused (no GPU)"; return; fi
  if grep -qE '^exit: 124' "$log"; then echo "TIMEOUT(inner)"; return; fi
  if grep -qE '^exit: [1-9]' "$log"; then echo "FAIL(inner rc)"; return; fi
  if [ "$rc" -eq 0 ]; then
    if grep -q '^SKIPPED: no CUDA device' "$log"; then echo "skipped (no GPU)"; else echo ok; fi
    return
  fi
  if grep -qE 'no CUDA device|no usable CUDA device' "$log"; then echo "refused (no GPU)"; return; fi
  echo "FAIL(rc=$rc)"
}

# run <name> <limit-seconds> <command...>: runs with a time limit, logs to $logs/<name>.log.
run() {
  local name=$1 limit=$2
  shift 2
  limit=$(( limit * scale ))
  local left=$(( budget - ($(date +%s) - started) ))
  if [ $left -lt 10 ]; then
    rows+=("$(printf '%-36s %-22s' "$name" 'not run: no time left')")
    return 1
  fi
  [ "$limit" -gt $left ] && limit=$left
  local t0=$(date +%s)
  echo "=== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  tail -n 15 "$logs/$name.log"
  rows+=("$(printf '%-36s %-22s %5ss' "$name" "$(classify $rc "$logs/$name.log")" "$dt")")
  return $rc
}

# "N passed, M skipped, K failed" from a gtest log.
counts() {
  grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\] [0-9]+ test' "$1" | sed -E 's/^\[ *([A-Z]+) *\] ([0-9]+) tests?.*/\2 \L\1/' |
    tr '\n' ',' | sed 's/,$//; s/,/, /g'
}

# A step whose binary is missing (its build failed or was not reached): a failure.
absent() {  # <name> <why>
  rows+=("$(printf '%-36s %-22s' "$1" "not run: $2")")
}
# A step whose optional prerequisite is missing on this machine (no torch in python3): a skip,
# not a failure - unlike a configure or build failure, which `absent` reports.
skipped_step() {  # <name> <why>
  rows+=("$(printf '%-36s %-22s' "$1" "skipped ($2)")")
}

# build_and_run <target> <binary> <run-name> <run-limit> [args...]: builds one target, then runs
# its binary if it exists.
build_and_run() {
  local target=$1 binary=$2 name=$3 limit=$4
  shift 4
  if [ "$configured" -ne 0 ]; then absent "$name" "configure failed"; return; fi
  run "build_$target" 240 cmake --build "$build" -j "$jobs" --target "$target"
  if [ -x "$binary" ]; then
    run "$name" "$limit" "$binary" "$@"
  else
    absent "$name" "no binary"
  fi
}

# ---- Environment ----------------------------------------------------------------------------
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  if [ -f "$root/.gpu-deps/CHECKOUT" ]; then
    echo "checkout: $(cat "$root/.gpu-deps/CHECKOUT")"
  else
    echo "checkout: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo 'unknown (no .git, no .gpu-deps/CHECKOUT)')"
  fi
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
  echo "GPU: ${gpu:-none (nvidia-smi absent or failing)}"
  echo "CUDA (driver): $(nvidia-smi 2>/dev/null | grep -oE 'CUDA Version: [0-9.]+' | head -1 || true)"
  echo "nvcc: $(nvcc --version 2>/dev/null | grep -oE 'release [0-9.]+, V[0-9.]+' || echo absent)"
  echo "cmake: $(cmake --version 2>/dev/null | head -1); $(ninja --version 2>/dev/null | sed 's/^/ninja /')"
  echo "c++: $(c++ --version 2>/dev/null | head -1)"
  echo "cores: $jobs; CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}"
} > "$logs/environment.txt" 2>&1
cat "$logs/environment.txt"

# ---- Configure and the shared core ------------------------------------------------------------
# Tools (zlib/simdjson users) stay off: the GPU image lacks their dependencies. The Python
# extension is built in this same tree (PIPEFILL_BUILD_PYTHON, no stubs) when python3 has torch
# and nanobind - one configure, one core build, instead of a second CMake tree for the package.
# With .gpu-deps/ present every dependency comes from it (PIPEFILL_STAGED_DEPS=ON;
# GPU_CHECK_STAGED_DEPS=AUTO lets found system packages win).
py=${GPU_CHECK_PYTHON:-python3}
python_args=(-DPIPEFILL_BUILD_PYTHON=OFF)
python_missing=""
# torch and nanobind to build and run the extension, and the interpreter's headers (Python.h),
# without which CMake's FindPython (Development.Module) fails the whole configure: checked here
# and reported as the reason the Python steps skip, never left to a configure error.
if ! python_missing=$("$py" -c "
import os, sysconfig
missing = []
for name in ('torch', 'nanobind'):
    try:
        __import__(name)
    except Exception:
        missing.append(name)
include = sysconfig.get_paths().get('include') or '?'
if not os.path.isfile(os.path.join(include, 'Python.h')):
    missing.append('Python.h (no ' + include + '/Python.h: the python3-dev headers)')
print(' '.join(missing))" 2>&1); then
  python_missing="$py does not run"
fi
echo "python for the extension: $py: ${python_missing:+lacks }${python_missing:-torch, nanobind and Python.h present}" |
  tee -a "$logs/environment.txt"
if [ -z "$python_missing" ]; then
  python_args=(-DPIPEFILL_BUILD_PYTHON=ON -DPIPEFILL_PYTHON_STUBS=OFF "-DPython_EXECUTABLE=$(command -v "$py")")
fi
staged=()
if [ -f "$root/.gpu-deps/VERSIONS" ]; then
  staged=(-DPIPEFILL_STAGED_DEPS="${GPU_CHECK_STAGED_DEPS:-ON}")
fi
# shellcheck disable=SC2086
run configure 150 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON \
  -DPIPEFILL_ENABLE_CUDA=ON -DPIPEFILL_CUDA_ARCHITECTURES=90 -DPIPEFILL_BUILD_EXAMPLES=ON \
  -DPIPEFILL_BUILD_BENCHMARKS=ON -DPIPEFILL_BUILD_TOOLS=OFF "${python_args[@]}" \
  "${staged[@]}" ${GPU_CHECK_CMAKE_ARGS:-}
configured=$?
gpu_targets=(pipefill_cupti_tests pipefill_cuda_tests bench_gate_drain bench_bubble_instructions
             pipefill_fill_jobs_gpu_tests pipeline_engine)
if [ $configured -eq 0 ]; then
  run build_core 300 cmake --build "$build" -j "$jobs" --target pipefill_core
fi

# ---- The Python steps first --------------------------------------------------------------------
# The extension built in this tree (<build>/python-package). graph_fill: a torch.matmul (cuBLAS)
# graph and a model's inference as gated graph jobs in the bubbles of a synthetic main stream
# (python/examples/graph_fill_check.py); cuda_streaming_*: the parts of
# python/examples/cuda_streaming_check.py, one process each. Python runs unbuffered (-u) so a
# time-out keeps what it printed. Skipped (not failed) when the interpreter lacks torch, nanobind
# or Python.h; a script reports SKIPPED only when torch sees no GPU, and fails when torch sees one
# but the runtime does not start.
python_steps=(graph_fill cuda_streaming_inference cuda_streaming_training cuda_streaming_creation
              cuda_streaming_green_context wheel)
bg_pid=""
if [ -n "$python_missing" ]; then
  for step in "${python_steps[@]}"; do skipped_step "$step" "$py lacks: $python_missing"; done
elif [ "$configured" -ne 0 ]; then
  for step in "${python_steps[@]}"; do absent "$step" "configure failed"; done
else
  run build__pipefill 240 cmake --build "$build" -j "$jobs" --target _pipefill
fi
# The C++ GPU targets build in the background while the Python steps run (ninja -k 0: a failing
# target stops nothing else; each target's own build step below is then a no-op, or shows that
# target's error alone). Its row and output are collected before the C++ steps.
if [ $configured -eq 0 ]; then
  bg_jobs=$(( jobs > 4 ? jobs - 2 : jobs ))
  ( run build_gpu_targets 300 nice -n 10 cmake --build "$build" -j "$bg_jobs" --target "${gpu_targets[@]}" -- -k 0
    printf '%s\n' "${rows[${#rows[@]}-1]}" > "$logs/build_gpu_targets.row" ) > "$logs/build_gpu_targets.stdout" 2>&1 &
  bg_pid=$!
fi
if [ -z "$python_missing" ] && [ "$configured" -eq 0 ]; then
  if ls "$build"/python-package/pipefill/_pipefill*.so >/dev/null 2>&1; then
    pyrun=(env PYTHONPATH="$build/python-package" "$py" -u)  # an array: `timeout` runs no shell function
    streaming=$root/python/examples/cuda_streaming_check.py
    run graph_fill 75 "${pyrun[@]}" "$root/python/examples/graph_fill_check.py"
    run cuda_streaming_inference 50 "${pyrun[@]}" "$streaming" --part inference
    run cuda_streaming_training 50 "${pyrun[@]}" "$streaming" --part training
    run cuda_streaming_creation 45 "${pyrun[@]}" "$streaming" --part creation
    run cuda_streaming_green_context 40 "${pyrun[@]}" "$streaming" --part green-context
    # The wheel users install: this tree's extension packed for the image's Python, repaired
    # offline, installed into a fresh venv (scripts/gpu-wheel-check.sh).
    run wheel 120 bash "$root/scripts/gpu-wheel-check.sh" "$build" "$py"
  else
    for step in "${python_steps[@]}"; do absent "$step" "the extension did not build"; done
  fi
fi
if [ -n "$bg_pid" ]; then
  wait "$bg_pid"
  cat "$logs/build_gpu_targets.stdout"
  if [ -s "$logs/build_gpu_targets.row" ]; then
    rows+=("$(cat "$logs/build_gpu_targets.row")")
  else
    rows+=("$(printf '%-36s %-22s' build_gpu_targets 'FAIL(no result)')")
  fi
fi

# ---- Each C++ target: build (a no-op after the background build), then run ----------------------
build_and_run pipefill_cupti_tests "$build/tests/pipefill_cupti_tests" cupti_conversion_tests 60
# The CUDA device tests, with the device's own log lines (partition, events, gate write).
PIPEFILL_DEBUG=info build_and_run pipefill_cuda_tests "$build/tests/pipefill_cuda_tests" cuda_tests 180

build_and_run bench_gate_drain "$build/benchmarks/bench_gate_drain" bench_gate_drain 90
build_and_run bench_bubble_instructions "$build/benchmarks/bench_bubble_instructions" bench_bubble_instructions 60
build_and_run pipefill_fill_jobs_gpu_tests "$build/examples/fill_jobs/pipefill_fill_jobs_gpu_tests" \
  fill_jobs_gpu_tests 90
PIPEFILL_DEBUG=info build_and_run pipeline_engine "$build/examples/pipeline_engine/pipeline_engine" engine_emulated 120 \
  --transport emulated --stages 4 --microbatches 8 --fill mlp --iterations 6 --naive

# The design probes run last: their drain experiments launch SM-owning fill blocks on every SM
# before the 1-block bubble kernel (gpu-probes/probes.cu, drainExperiment), the order that
# deadlocked bench_gate_drain (issue 8, item 6), and they print their table only at the end.
# Should a run hang, its 120 s timeout then costs only the end of the budget, after every other
# answer is in. 130 s: the first run in full, the second if the first was quick.
probes=""
for candidate in "$root/gpu-probes" "$root/shared/gpu-probes" "$root/../shared/gpu-probes"; do
  [ -f "$candidate/run.sh" ] && { probes=$candidate; break; }
done
if [ -n "$probes" ]; then
  mkdir -p "$logs/probes"
  OUT=$logs/probes run probes 130 bash "$probes/run.sh"
else
  absent probes "gpu-probes/ absent"
fi

# ---- What comes back: the logs in one archive, the summary (printed last) ---------------------
cp "$build/CMakeCache.txt" "$logs/" 2>/dev/null || true
for f in CMakeConfigureLog.yaml CMakeError.log CMakeOutput.log; do
  cp "$build/CMakeFiles/$f" "$logs/" 2>/dev/null || true
done
{
  echo
  echo "==================== GPU CHECK SUMMARY ($(( $(date +%s) - started ))s) ===================="
  sed 's/^/  /' "$logs/environment.txt"
  printf '%-36s %-22s %6s\n' step status time
  for r in "${rows[@]}"; do echo "$r"; done
  grep -h 'PipeFill dependencies:' "$logs/configure.log" 2>/dev/null | sed 's/^-- /-- /' | head -1
  if [ -f "$logs/cuda_tests.log" ]; then
    echo "-- cuda tests: $(counts "$logs/cuda_tests.log")"
    grep -E '^\[  FAILED  \] [A-Za-z][^ ]*$' "$logs/cuda_tests.log" | sort -u | head -20
    grep -E '^\[  SKIPPED \] [A-Za-z][^ ]*$' "$logs/cuda_tests.log" | sort -u | head -12
    grep -E '^\[ info \]|^\[ child, 1 connection \] \[ info \]|^\[ child, 1 connection \] \[  FAILED' \
      "$logs/cuda_tests.log" | head -32
    grep -hoE '(fill partition|cuStreamWriteValue64|CUPTI collector|grid-cap mode on driver|fill-context clock aligned|main streams of context)[^"]*' \
      "$logs/cuda_tests.log" | sort | uniq -c | sort -rn | head -8
  fi
  for f in "$logs"/probes/probes-*.txt; do
    [ -f "$f" ] || continue
    echo "-- $(basename "$f"):"
    sed -n '/^probe  *|/,$p' "$f" | head -40
  done
  for b in bench_gate_drain bench_bubble_instructions; do
    [ -f "$logs/$b.log" ] && grep -E '^(RATIO|partition|SKIPPED|\(baseline)|.*ERROR OCCURRED' "$logs/$b.log"
  done
  if [ -f "$logs/fill_jobs_gpu_tests.log" ]; then
    echo "-- fill jobs GPU tests: $(counts "$logs/fill_jobs_gpu_tests.log")"
    grep -E '^\[  FAILED  \] [A-Za-z][^ ]*$' "$logs/fill_jobs_gpu_tests.log" | sort -u | head -10
    grep -E '^\[  SKIPPED \] [A-Za-z][^ ]*$' "$logs/fill_jobs_gpu_tests.log" | sort -u | head -6
  fi
  [ -f "$logs/graph_fill.log" ] && grep -E '^(graph-fill:|SKIPPED|FAILED)' "$logs/graph_fill.log" | sed 's/^/-- /'
  for part in inference training creation green_context; do
    f=$logs/cuda_streaming_$part.log
    [ -f "$f" ] && grep -E '^(cuda-streaming:|SKIPPED|FAILED)' "$f" | sed 's/^/-- /'
  done
  [ -f "$logs/wheel.log" ] && grep -E '^(check_wheel|build-wheel): ' "$logs/wheel.log" | sed 's/^/-- /'
  [ -f "$logs/engine_emulated.log" ] &&
    grep -E '^(run [0-9]/[0-9]|mean from|max overrun|bubble end|fill check|pipeline_engine: error)' \
      "$logs/engine_emulated.log" | sed 's/^/-- engine: /'
} > "$logs/summary.txt"
cp "$logs/summary.txt" "$out/summary.txt"
tar -czf "$out/logs.tar.gz" -C "$build" logs 2>/dev/null
echo "-- returned: $out/summary.txt, $out/logs.tar.gz ($(du -k "$out/logs.tar.gz" | cut -f1) KiB: $(cd "$logs" && find . -type f | wc -l) log files)" \
  >> "$out/summary.txt"
cat "$out/summary.txt"
