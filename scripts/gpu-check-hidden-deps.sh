#!/usr/bin/env bash
# Proves, on a machine without a GPU, the split of the GPU check (issue 33 item 8): everything is
# built HERE (scripts/gpu-build.sh -> .gpu-build/, at most 40 MiB), and the device side
# (scripts/gpu-check.sh) needs nothing the GPU image lacks and builds nothing. It runs
# gpu-build.sh, then gpu-check.sh on the carried folder inside a private mount namespace
# (scripts/with-hidden-deps.sh; needs root) in which the system copies of fmt, spdlog,
# nlohmann-json, CLI11, GoogleTest/GoogleMock and Google Benchmark are hidden (headers, CMake
# folders and sources under empty tmpfs mounts, libraries and pkg-config files under /dev/null)
# and every build tool on the PATH (cmake, ninja, make, nvcc, cc/c++/gcc/g++, ld) is a stub that
# records its call and fails. Then it checks, and prints PASS only if all hold:
#   - .gpu-build/ holds every binary, the cp312 extension and wheel, and fits the carry limit;
#   - no build tool was called by the device side;
#   - every step is ok, skipped or refused cleanly (no FAIL, TIMEOUT, "not run"), the test steps
#     report their counts, and the carried extension imported (extension_import ok);
#   - $OUT held exactly summary.txt and logs.tar.gz, and the summary is the last thing printed;
#   - the device side's wall time on this CPU, and the sum of its step limits, are printed: the
#     device-side time budget (docs/gpu-results.md).
# The Python steps run with the 3.12 interpreter the extension was built for (build-py312/venv,
# no torch here: they read "skipped (... lacks: torch)"; extension_import runs without torch).
# Usage: scripts/gpu-check-hidden-deps.sh [work-dir]   (default build-hidden-deps/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/build-hidden-deps}
[ "$(id -u)" -eq 0 ] || { echo "gpu-check-hidden-deps: needs root (unshare -m, mounts)" >&2; exit 2; }
problems=0
fail() { echo "FAIL: $*"; problems=$((problems + 1)); }

t0=$(date +%s)
bash "$root/scripts/gpu-build.sh" "$root/.gpu-build"
build_s=$(( $(date +%s) - t0 ))
carried_mib=$(( $(du -sk "$root/.gpu-build" | cut -f1) / 1024 ))

# Build tools that must never run on the device side: stubs that log and fail.
stubs=$(mktemp -d)
calls=$stubs/calls.log
: > "$calls"
for tool in cmake ninja make nvcc cc c++ gcc g++ ld clang clang++; do
  printf '#!/bin/sh\necho "%s $*" >> %s\necho "%s: a build tool on the device side" >&2\nexit 127\n' \
    "$tool" "$calls" "$tool" > "$stubs/$tool"
  chmod +x "$stubs/$tool"
done
out=$(mktemp -d)
stdout_log=$(mktemp)
mkdir -p "$work"
t1=$(date +%s)
set +e
bash "$root/scripts/with-hidden-deps.sh" -- env OUT="$out" PATH="$stubs:$PATH" \
  GPU_CHECK_PYTHON="${GPU_CHECK_PYTHON:-$root/build-py312/venv/bin/python}" \
  GPU_CHECK_TIME_SCALE="${GPU_CHECK_TIME_SCALE:-3}" \
  bash "$root/scripts/gpu-check.sh" "$work" > "$stdout_log" 2>&1
rc=$?
set -e
device_s=$(( $(date +%s) - t1 ))
cat "$stdout_log"
echo
echo "==================== HIDDEN-DEPENDENCIES CHECK ===================="
[ $rc -eq 0 ] || fail "the namespace run exited with $rc"
for f in bin/pipefill_cuda_tests bin/pipefill_cupti_tests bin/pipefill_fill_jobs_gpu_tests \
         bin/bench_gate_drain bin/bench_bubble_instructions bin/pipeline_engine MANIFEST; do
  [ -f "$root/.gpu-build/$f" ] || fail ".gpu-build/$f missing"
done
ls "$root"/.gpu-build/python/_pipefill.cpython-312-*.so >/dev/null 2>&1 || fail "no cp312 extension carried"
ls "$root"/.gpu-build/wheel/pipefill-*cp312*.whl >/dev/null 2>&1 || fail "no cp312 wheel carried"
echo "carried: .gpu-build/ $carried_mib MiB (built here in ${build_s}s)"
if [ -s "$calls" ]; then fail "the device side called build tools: $(tr '\n' ';' < "$calls")"; fi
summary=$out/summary.txt
[ -f "$summary" ] || { fail "no $summary"; exit 1; }
steps=$(sed -n '/^step  *status/,/^-- /p' "$summary" | sed '1d;$d')
echo "$steps"
while read -r name status _; do
  [ -n "$name" ] || continue
  case "$status" in
    ok | skipped | refused) ;;
    *) fail "$name: $status" ;;
  esac
done <<<"$steps"
for step in cuda_tests cupti_conversion_tests fill_jobs_gpu_tests; do
  grep -qE "^$step +ok [0-9]+p/[0-9]+s/0f" <<<"$steps" || fail "$step did not report its counts"
done
grep -qE '^extension_import +ok' <<<"$steps" || fail "the carried extension did not import"
returned=$(cd "$out" && ls | sort | tr '\n' ' ')
[ "$returned" = "logs.tar.gz summary.txt " ] || fail "\$OUT held '$returned', not exactly logs.tar.gz and summary.txt"
if [ "$(tail -n "$(wc -l < "$summary")" "$stdout_log")" != "$(cat "$summary")" ]; then
  fail "the summary is not the last thing gpu-check.sh printed"
fi
limits=$(grep -oE '^ *([A-Z_]+=[^ ]+ )*run(_binary)? [a-z_]+ [0-9]+' "$root/scripts/gpu-check.sh" |
         grep -v ' probes ' | awk '{s += $NF} END {print s}')
echo "device side: ${device_s}s here (2-core build machine, no GPU: GPU steps skip); step limits $limits s, probes with what is left of 360 s"
rm -rf "$out" "$stubs"
mv "$stdout_log" "$work/hidden-deps-stdout.log"
if [ $problems -eq 0 ]; then
  echo "PASS: built here, carried $carried_mib MiB; the device side built nothing, needed no dev package, every step ok/skipped/refused; summary last"
else
  echo "$problems problem(s)"
  exit 1
fi
