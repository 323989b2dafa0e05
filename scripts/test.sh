#!/usr/bin/env bash
# Builds and runs every test: the normal build (CUDA backend compiled when the toolkit is
# present; GPU tests skip without a device), then the whole suite under ASan+UBSan, then the
# executor/runtime tests under TSan, then a clang build with -Wthread-safety -Werror=thread-safety
# (the GUARDED_BY/REQUIRES annotations of src/core) that also runs the fuzz-labelled tests.
# Sanitizer and clang builds leave the CUDA backend out (the CUDA runtime is not sanitizer-clean)
# - the core logic they check is device-agnostic.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)
export CTEST_OUTPUT_ON_FAILURE=1

step() { echo; echo "=== $* ==="; }
# ccache, when installed, makes reruns cheap (it never changes what is built).
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi

step "build (release, CUDA backend if available)"
cmake -S . -B build -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$jobs"
step "tests (release)"
ctest --test-dir build -j "$jobs" --timeout 300

step "build (ASan+UBSan, CUDA off)"
cmake -S . -B build-asan -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=Debug -DPIPEFILL_ENABLE_CUDA=OFF \
  -DPIPEFILL_SANITIZE=address,undefined -DPIPEFILL_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build-asan -j "$jobs"
step "tests (ASan+UBSan)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan -j "$jobs" --timeout 600

step "build (TSan, CUDA off)"
cmake -S . -B build-tsan -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=Debug -DPIPEFILL_ENABLE_CUDA=OFF \
  -DPIPEFILL_SANITIZE=thread -DPIPEFILL_BUILD_BENCHMARKS=OFF -DPIPEFILL_BUILD_EXAMPLES=OFF \
  -DPIPEFILL_BUILD_TOOLS=OFF >/dev/null
cmake --build build-tsan -j "$jobs"
step "tests (TSan: executor, runtime, host-device and graph-job threads)"
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  ctest --test-dir build-tsan -j "$jobs" --timeout 600 -L 'executor|runtime|host|graph'

step "build (clang, -Wthread-safety -Werror=thread-safety, CUDA off)"
# The annotated locks (common/mutex.hpp) are checked at compile time: an access to a GUARDED_BY
# member without its mutex, or a call to a REQUIRES function without it, fails this build.
cmake -S . -B build-clang -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=Debug -DPIPEFILL_ENABLE_CUDA=OFF \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  "-DCMAKE_CXX_FLAGS=-Wthread-safety -Werror=thread-safety" -DPIPEFILL_BUILD_BENCHMARKS=OFF \
  -DPIPEFILL_BUILD_EXAMPLES=OFF -DPIPEFILL_BUILD_TOOLS=ON >/dev/null
cmake --build build-clang -j "$jobs"
step "tests (clang: the libFuzzer trace fuzzer, a fixed number of runs from its seed corpus)"
ctest --test-dir build-clang -j "$jobs" --timeout 600 -L fuzz --no-tests=error

step "python package: pip install . into build-py/venv, then pytest (bindings, gloo pipelines)"
bash python/test-package.sh

echo; echo "All test stages passed."
