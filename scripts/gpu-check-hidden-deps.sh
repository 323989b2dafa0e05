#!/usr/bin/env bash
# Proves, on a machine without a GPU, that the GPU check needs nothing the GPU image lacks: runs
# scripts/gpu-check.sh in a private mount namespace (scripts/with-hidden-deps.sh; needs root) in
# which the system copies of fmt, spdlog, nlohmann-json, CLI11, GoogleTest/GoogleMock and Google
# Benchmark are hidden - their headers, CMake package folders and /usr/src sources under empty
# tmpfs mounts, their libraries and pkg-config files under /dev/null - so the build can only use
# .gpu-deps/ (staged first, by scripts/stage-gpu-deps.sh, exactly as before a GPU call). Then it checks:
#   - configure took every dependency from the staged copy (none from the system);
#   - configure and every build step are ok;
#   - every GPU step skipped ("ok 0p/..s", "skipped (no GPU)", or "skipped (<python> lacks
#     torch)" - a missing optional prerequisite) or refused cleanly ("refused (no GPU)") - no
#     FAIL, no TIMEOUT, nothing "not run" (a configure or build failure);
#   - the summary is the last thing gpu-check.sh printed, and $OUT held exactly summary.txt and
#     logs.tar.gz.
# Step limits are scaled up (GPU_CHECK_TIME_SCALE, default 8 here) since this machine builds far
# slower than the GPU machine's 16 cores. Usage: scripts/gpu-check-hidden-deps.sh [build-dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-hidden-deps}
[ "$(id -u)" -eq 0 ] || { echo "gpu-check-hidden-deps: needs root (unshare -m, mounts)" >&2; exit 2; }
# As before a GPU call: the staged dependencies, and the probes copied into the checkout.
bash "$root/scripts/stage-gpu-deps.sh"
probes_src=${GPU_PROBES_DIR:-$root/../shared/gpu-probes}
if [ ! -f "$root/gpu-probes/run.sh" ] && [ -f "$probes_src/run.sh" ]; then
  cp -r "$probes_src" "$root/gpu-probes"
fi
out=$(mktemp -d)
stdout_log=$(mktemp)  # moved to <build>/hidden-deps-stdout.log at the end (kept out of the tree)
mkdir -p "$(dirname "$build")"

# The Python extension and graph_fill step too, when the test venv exists (scripts/test.sh makes
# it): python3 here has no torch, which gpu-check.sh reports as a skip, not a failure.
if [ -z "${GPU_CHECK_PYTHON:-}" ] && [ -x "$root/build-py/venv/bin/python" ]; then
  export GPU_CHECK_PYTHON=$root/build-py/venv/bin/python
fi
# ccache here (the GPU machine has none): a rerun of this proof costs minutes, not the whole build.
if command -v ccache >/dev/null 2>&1; then
  export GPU_CHECK_CMAKE_ARGS="${GPU_CHECK_CMAKE_ARGS:-} -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"
fi
echo "gpu-check-hidden-deps: build in $build"
rm -rf "$build"
set +e
# AUTO: the build looks for the system packages first and must fall back to .gpu-deps/ itself.
bash "$root/scripts/with-hidden-deps.sh" -- env OUT="$out" GPU_CHECK_TIME_SCALE="${GPU_CHECK_TIME_SCALE:-8}" \
  GPU_CHECK_BUDGET_S="${GPU_CHECK_BUDGET_S:-7200}" GPU_CHECK_STAGED_DEPS=AUTO \
  bash "$root/scripts/gpu-check.sh" "$build" > "$stdout_log" 2>&1
rc=$?
set -e
cat "$stdout_log"
echo
echo "==================== HIDDEN-DEPENDENCIES CHECK ===================="
problems=0
fail() { echo "FAIL: $*"; problems=$((problems + 1)); }
[ $rc -eq 0 ] || fail "the namespace run exited with $rc"
summary=$out/summary.txt
[ -f "$summary" ] || { fail "no $summary"; exit 1; }
deps=$(grep -h 'PipeFill dependencies:' "$build/logs/configure.log" || true)
echo "configure: ${deps#-- }"
for d in fmt spdlog nlohmann_json CLI11 GTest benchmark; do
  grep -q "$d=staged" <<<"$deps" || fail "$d did not come from .gpu-deps (${deps#-- })"
done
# The step table: the lines between the header and the first '-- ' line.
steps=$(sed -n '/^step  *status/,/^-- /p' "$summary" | sed '1d;$d')
echo "$steps"
while read -r name status _; do
  [ -n "$name" ] || continue
  case "$name:$status" in
    configure:ok | build_*:ok) ;;
    configure:* | build_*:*) fail "$name: $status" ;;
    *:ok | *:skipped | *:refused) ;;
    *) fail "$name: $status" ;;
  esac
done <<<"$steps"
grep -qE '^(cuda_tests|cupti_conversion_tests|fill_jobs_gpu_tests) +ok .*0f' <<<"$steps" || fail "a test step did not report its counts"
grep -E '^[a-z_]+ +(FAIL|TIMEOUT|not run)' <<<"$steps" && fail "steps failed or did not run"
returned=$(cd "$out" && ls | sort | tr '\n' ' ')
[ "$returned" = "logs.tar.gz summary.txt " ] || fail "\$OUT held '$returned', not exactly logs.tar.gz and summary.txt"
# The summary printed last: the run's output ends with the summary file's text.
if [ "$(tail -n "$(wc -l < "$summary")" "$stdout_log")" != "$(cat "$summary")" ]; then
  fail "the summary is not the last thing gpu-check.sh printed"
fi
rm -rf "$out"
mv "$stdout_log" "$build/hidden-deps-stdout.log"
if [ $problems -eq 0 ]; then
  echo "PASS: configure and build used only .gpu-deps/; every GPU step skipped or refused cleanly; summary last"
else
  echo "$problems problem(s)"
  exit 1
fi
