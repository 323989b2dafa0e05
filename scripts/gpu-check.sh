#!/usr/bin/env bash
# The GPU check, device side: RUNS what scripts/gpu-build.sh built elsewhere (.gpu-build/, carried
# with the device call) - no configure, no compiler, no build on the GPU machine, whose 15 minutes
# of device time include its start (issue 33 item 8). Every step has its own time limit (TIMEOUT,
# never a hang); the limits add up to 355 s, and the
# whole run has GPU_CHECK_BUDGET_S (default 360 s: 6 minutes on the 16-core GPU machine; a step
# that would start with under 10 s left reads "not run: no time left", the probes get what is left),
# each step's result is printed the moment it finishes ("--> step  status  time"), and the summary
# is printed LAST, so a run cut off anywhere still answers what ran. Steps, most informative first:
#   cuda_tests (PIPEFILL_DEBUG=info), the Python steps (graph_fill, one per part of
#   cuda_streaming_check.py, capture_contexts), cupti_conversion_tests, bench_gate_drain,
#   bench_bubble_instructions, fill_jobs_gpu_tests, engine_emulated, the cp312 wheel in a fresh
#   venv, and the design probes last with what time is left (their drain experiments can deadlock
#   to their own timeout: docs/gpu-results.md).
# Also: the green-context A/B benchmark, the captured GEMM with and without the SM target, the
#   engine with CUDA_DEVICE_MAX_CONNECTIONS=1 (issue 33 items 1, 6, 7).
# Logs go to <work>/logs; what comes back from the GPU machine ($OUT: at most 8 files) is exactly
# $OUT/summary.txt and $OUT/logs.tar.gz. Without a GPU every GPU step skips or refuses cleanly.
# Usage: scripts/gpu-check.sh [work-dir]   Carried build: GPU_CHECK_BUILD (default .gpu-build/);
# Python: GPU_CHECK_PYTHON (default python3: the image's 3.12 with torch).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/build-gpu-check}
carried=${GPU_CHECK_BUILD:-$root/.gpu-build}
logs=$work/logs
out=${OUT:-$work/out}
rm -rf "$logs"
mkdir -p "$logs" "$out"
declare -a rows
started=$(date +%s)
budget=${GPU_CHECK_BUDGET_S:-360}
scale=${GPU_CHECK_TIME_SCALE:-1}   # multiplies every step's limit (slow CPU-only proof runs)

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
  if grep -q 'libcuda.so.1: cannot open shared object file' "$log"; then echo "refused (no GPU)"; return; fi
  if grep -qE '^exit: 124' "$log"; then echo "TIMEOUT(inner)"; return; fi
  if grep -qE '^exit: [1-9]' "$log"; then echo "FAIL(inner rc)"; return; fi
  if [ "$rc" -eq 0 ]; then
    if grep -q '^SKIPPED: no CUDA device' "$log"; then echo "skipped (no GPU)"; else echo ok; fi
    return
  fi
  if grep -qE 'no CUDA device|no usable CUDA device|no CUDA-capable device' "$log"; then
    echo "refused (no GPU)"; return
  fi
  echo "FAIL(rc=$rc)"
}

row() {  # <name> <status> [seconds]: records the step's row and prints it at once
  local line
  line=$(printf '%-36s %-22s %5s' "$1" "$2" "${3:+${3}s}")
  rows+=("$line")
  echo "--> $line"
}

# run <name> <limit-seconds> <command...>: runs with a time limit, logs to $logs/<name>.log.
run() {
  local name=$1 limit=$2
  shift 2
  limit=$(( limit * scale ))
  local left=$(( budget * scale - ($(date +%s) - started) ))
  if [ $left -lt 10 ]; then
    row "$name" 'not run: no time left'
    return 1
  fi
  [ "$limit" -gt $left ] && limit=$left
  local t0=$(date +%s)
  echo "=== $name (limit ${limit}s): $*"
  timeout --kill-after=5 "$limit" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  tail -n 12 "$logs/$name.log"
  row "$name" "$(classify $rc "$logs/$name.log")" "$(( $(date +%s) - t0 ))"
  return $rc
}

# "N passed, M skipped, K failed" from a gtest log.
counts() {
  grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\] [0-9]+ test' "$1" | sed -E 's/^\[ *([A-Z]+) *\] ([0-9]+) tests?.*/\2 \L\1/' |
    tr '\n' ',' | sed 's/,$//; s/,/, /g'
}

# The carried binaries open cuBLAS and CUPTI at first use by soname, then at a path baked in where
# they were built: this machine's toolkit folders go last on their loader path (theirs only: in
# the Python steps torch's own CUDA libraries must win).
toolkit_libs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/extras/CUPTI/lib64; do
  [ -d "$d" ] && toolkit_libs="$toolkit_libs${toolkit_libs:+:}$d"
done
# torch's cuBLAS wheel too, where the toolkit has none (the example engine links cuBLAS).
wheel_cublas=$("${GPU_CHECK_PYTHON:-python3}" -c "import nvidia.cublas as c, os; print(os.path.join(list(c.__path__)[0], 'lib'))" 2>/dev/null)
[ -n "$wheel_cublas" ] && [ -d "$wheel_cublas" ] && toolkit_libs="$toolkit_libs${toolkit_libs:+:}$wheel_cublas"
binary_libs="${LD_LIBRARY_PATH:-}${LD_LIBRARY_PATH:+${toolkit_libs:+:}}$toolkit_libs"

# A carried binary's step: runs it when it was carried, else "not run" (gpu-build.sh failed).
run_binary() {  # <name> <limit> <binary> [args...]
  local name=$1 limit=$2 binary=$carried/bin/$3
  shift 3
  if [ -x "$binary" ]; then
    run "$name" "$limit" env LD_LIBRARY_PATH="$binary_libs" "$binary" "$@"
  else
    row "$name" "not run: no $(basename "$binary")"
  fi
}

# ---- Environment and the carried build ------------------------------------------------------
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "checkout: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo 'unknown (no .git)')"
  if [ -f "$carried/MANIFEST" ]; then
    echo "carried build: $(sed -n 's/^commit //p' "$carried/MANIFEST"), $(sed -n 's/^built //p' "$carried/MANIFEST"); $(sed -n 's/^nvcc //p' "$carried/MANIFEST"), python $(sed -n 's/^python //p' "$carried/MANIFEST")"
  else
    echo "carried build: NONE ($carried/MANIFEST missing: run scripts/gpu-build.sh, carry .gpu-build)"
  fi
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
  echo "GPU: ${gpu:-none (nvidia-smi absent or failing)}"
  echo "CUDA (driver): $(nvidia-smi 2>/dev/null | grep -oE 'CUDA Version: [0-9.]+' | head -1 || true)"
  echo "cores: $(nproc 2>/dev/null || echo '?'); CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}"
} > "$logs/environment.txt" 2>&1
cat "$logs/environment.txt"

# The CPU-side tests read sources where the binaries were built (PIPEFILL_SOURCE_DIR): the same
# files are in this checkout, so that folder is made to point here when it does not exist.
src=$(sed -n 's/^source_dir //p' "$carried/MANIFEST" 2>/dev/null)
if [ -n "$src" ] && [ "$src" != "$root" ] && [ ! -e "$src" ]; then
  mkdir -p "$(dirname "$src")" 2>/dev/null && ln -s "$root" "$src" 2>/dev/null &&
    echo "source folder of the build $src -> $root" >> "$logs/environment.txt"
fi
include=$(sed -n 's/^cuda_include //p' "$carried/MANIFEST" 2>/dev/null)
if [ -n "$include" ] && [ ! -f "$include/cudaTypedefs.h" ]; then
  echo "note: $include/cudaTypedefs.h (read by a CPU-side cuda test) is not on this machine" |
    tee -a "$logs/environment.txt"
fi

# The Python package: this checkout's sources with the carried cp312 extension.
py=${GPU_CHECK_PYTHON:-python3}
pkg=$work/python-package
rm -rf "$pkg" && mkdir -p "$pkg" && cp -r "$root/python/pipefill" "$pkg/" &&
  cp "$carried"/python/_pipefill.*.so "$pkg/pipefill/" 2>/dev/null
python_missing=$("$py" -c "
import importlib.util, sys
missing = [] if sys.version_info[:2] == (3, 12) else ['3.12 (this is %d.%d)' % sys.version_info[:2]]
missing += [m for m in ('torch',) if importlib.util.find_spec(m) is None]
print(' '.join(missing))" 2>&1) || python_missing="$py does not run"
echo "python: $py: ${python_missing:+lacks }${python_missing:-3.12 with torch}" | tee -a "$logs/environment.txt"
no_extension=""  # the carried extension is missing: its steps did not run (a failure, not a skip)
ls "$pkg"/pipefill/_pipefill.*.so >/dev/null 2>&1 || no_extension="no carried extension"
pyrun=(env PYTHONPATH="$pkg" "$py" -u)  # an array: `timeout` runs no shell function

# ---- The steps ---------------------------------------------------------------------------------
# The carried extension loads in this interpreter (no torch needed): the first answer, in seconds.
if [ -z "$no_extension" ]; then
  run extension_import 10 "${pyrun[@]}" -c "import pipefill as pf; rt = pf.Runtime(backend='sim'); print('pipefill', pf.__version__ if hasattr(pf, '__version__') else '', rt.backend); rt.close()"
else
  row extension_import "not run: no carried extension"
fi

# The CUDA device tests, with the device's own log lines (partition, events, gate write).
PIPEFILL_DEBUG=info run_binary cuda_tests 60 pipefill_cuda_tests

python_steps=(graph_fill cuda_streaming_inference cuda_streaming_training cuda_streaming_creation
              cuda_streaming_green_context capture_contexts)
if [ -n "$no_extension" ]; then
  for step in "${python_steps[@]}"; do row "$step" "not run: $no_extension"; done
elif [ -n "$python_missing" ]; then
  for step in "${python_steps[@]}"; do row "$step" "skipped ($py lacks: $python_missing)"; done
else
  streaming=$root/python/examples/cuda_streaming_check.py
  run graph_fill 20 "${pyrun[@]}" "$root/python/examples/graph_fill_check.py"
  run cuda_streaming_inference 20 "${pyrun[@]}" "$streaming" --part inference
  run cuda_streaming_training 20 "${pyrun[@]}" "$streaming" --part training
  run cuda_streaming_creation 15 "${pyrun[@]}" "$streaming" --part creation
  run cuda_streaming_green_context 15 "${pyrun[@]}" "$streaming" --part green-context
  # Each kernel node's context for an inference and a training capture (issue 33 item 2).
  run capture_contexts 20 "${pyrun[@]}" "$root/python/examples/capture_contexts_check.py"
fi

# The green-context A/B benchmark: the same kernels on non-default streams with and without the
# fill partition: CUPTI launch -> start distributions (avg, p50/p95/p99, max) and the slowdown of
# the other side (issue 33 item 7). Lines "AB alone|shared|partition ..." and "AB summary: ...".
run_binary green_context_ab 30 bench_green_context_ab
# One captured GEMM item in the partition, timed with and without cublasSetSmCountTarget (issue 33
# item 1): its line "GEMM 4096x4096x4096 captured item in the fill partition ... (ratio ...)".
run_binary captured_gemm_sm_target 20 pipefill_cuda_tests --gtest_filter='GemmPartition.*'

run_binary cupti_conversion_tests 10 pipefill_cupti_tests
run_binary bench_gate_drain 20 bench_gate_drain
run_binary bench_bubble_instructions 10 bench_bubble_instructions
run_binary fill_jobs_gpu_tests 20 pipefill_fill_jobs_gpu_tests
PIPEFILL_DEBUG=info run_binary engine_emulated 20 pipeline_engine \
  --transport emulated --stages 4 --microbatches 8 --fill mlp --iterations 6 --naive
# The engine with CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron's setting; inline launch mode), beside the
# default run above (issue 33 item 6): the same "run N/N", "fill check" and "max overrun" lines,
# plus the device's warning "CUDA_DEVICE_MAX_CONNECTIONS=1 in <mode> mode".
CUDA_DEVICE_MAX_CONNECTIONS=1 PIPEFILL_DEBUG=info run_binary engine_one_connection 25 pipeline_engine \
  --transport emulated --stages 4 --microbatches 8 --fill mlp --iterations 6 --naive

# The wheel users install (built and repaired by gpu-build.sh), in a fresh venv with the image's
# torch: the README snippet, import before and after torch, Runtime(backend="cuda").
wheel=$(ls "$carried"/wheel/pipefill-*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
  row wheel "not run: no carried wheel"
elif [ -n "$python_missing" ]; then
  row wheel "skipped ($py lacks: $python_missing)"
else
  gpu=()
  nvidia-smi -L >/dev/null 2>&1 && gpu=(--gpu)
  run wheel 20 "$py" "$root/tests/wheel/check_wheel.py" "$wheel" --expect-cuda 1 --torch-from "$py" "${gpu[@]}"
fi

# The design probes last, with what is left (at most 60 s): their drain experiments launch
# SM-owning fill blocks on every SM before the 1-block bubble kernel (gpu-probes/probes.cu), the
# order that deadlocked bench_gate_drain (issue 8, item 6); should one hang, only its own limit is
# lost, after every other answer is in. Run 1 as is, run 2 with CUDA_DEVICE_MAX_CONNECTIONS=1.
if [ -x "$carried/bin/probes" ]; then
  mkdir -p "$logs/probes"
  probe_runs() {
    echo "=== run 1: default connections"
    timeout 40 "$carried/bin/probes" 16 > "$logs/probes/probes-default.txt" 2>&1
    echo "exit: $?"
    echo "=== run 2: CUDA_DEVICE_MAX_CONNECTIONS=1"
    CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 20 "$carried/bin/probes" 16 > "$logs/probes/probes-maxconn1.txt" 2>&1
    echo "exit: $? (124 means it hung and was stopped)"
    cat "$logs"/probes/probes-*.txt
  }
  export -f probe_runs
  export carried logs
  run probes 60 bash -c probe_runs
else
  row probes "not run: no carried probes binary"
fi

# ---- What comes back: the logs in one archive, the summary (printed last) ---------------------
cp "$carried/MANIFEST" "$logs/MANIFEST" 2>/dev/null || true
{
  echo
  echo "==================== GPU CHECK SUMMARY ($(( $(date +%s) - started ))s of ${budget}s) ===================="
  sed 's/^/  /' "$logs/environment.txt"
  printf '%-36s %-22s %6s\n' step status time
  for r in "${rows[@]}"; do echo "$r"; done
  if [ -f "$logs/cuda_tests.log" ]; then
    echo "-- cuda tests: $(counts "$logs/cuda_tests.log")"
    grep -E '^\[  FAILED  \] [A-Za-z][^ ]*$' "$logs/cuda_tests.log" | sort -u | head -20
    grep -E '^\[  SKIPPED \] [A-Za-z][^ ]*$' "$logs/cuda_tests.log" | sort -u | head -12
    grep -E '^\[ info \]|^\[ child, 1 connection \] \[ info \]|^\[ child, 1 connection \] \[  FAILED' \
      "$logs/cuda_tests.log" | head -32
    grep -hoE '(fill partition|cuStreamWriteValue64|CUPTI collector|grid-cap mode on driver|fill-context clock aligned|main streams of context)[^"]*' \
      "$logs/cuda_tests.log" | sort | uniq -c | sort -rn | head -8
  fi
  # Issue 33 items 1, 4, 6, 7: the SM count target's GEMM timing, cluster occupancy, a private
  # capture context refused (the fallback line), the NCCL reservation warning, the A/B summary.
  cat "$logs"/cuda_tests.log "$logs"/captured_gemm_sm_target.log "$logs"/green_context_ab.log \
      "$logs"/engine_one_connection.log 2>/dev/null |
    grep -hE 'captured item in the fill partition|cluster occupancy|captures use the fill partition|refused green contexts|NCCL|^AB (summary|SKIPPED)|CUDA_DEVICE_MAX_CONNECTIONS=1 in' |
    sort | uniq -c | sort -rn | head -12
  [ -f "$logs/graph_fill.log" ] && grep -E '^(graph-fill:|SKIPPED|FAILED)' "$logs/graph_fill.log" | sed 's/^/-- /'
  for part in inference training creation green_context; do
    f=$logs/cuda_streaming_$part.log
    [ -f "$f" ] && grep -E '^(cuda-streaming:|SKIPPED|FAILED)' "$f" | sed 's/^/-- /'
  done
  [ -f "$logs/capture_contexts.log" ] &&
    grep -E '^(capture-contexts:|SKIPPED|FAILED)' "$logs/capture_contexts.log" | head -60 | sed 's/^/-- /'
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
  fi
  [ -f "$logs/wheel.log" ] && grep -E '^check_wheel: ' "$logs/wheel.log" | sed 's/^/-- /'
  [ -f "$logs/engine_emulated.log" ] &&
    grep -E '^(run [0-9]/[0-9]|mean from|max overrun|bubble end|fill check|pipeline_engine: error)' \
      "$logs/engine_emulated.log" | sed 's/^/-- engine: /'
} > "$logs/summary.txt"
cp "$logs/summary.txt" "$out/summary.txt"
tar -czf "$out/logs.tar.gz" -C "$work" logs 2>/dev/null
echo "-- returned: $out/summary.txt, $out/logs.tar.gz ($(du -k "$out/logs.tar.gz" | cut -f1) KiB: $(cd "$logs" && find . -type f | wc -l) log files)" \
  >> "$out/summary.txt"
cat "$out/summary.txt"
