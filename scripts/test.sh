#!/usr/bin/env bash
# Builds and runs every test, each build once:
#  1. the release build (CUDA backend compiled when the toolkit is present; GPU tests skip without
#     a device) with the Python extension in the same tree, its ctest suite, the library installed
#     into a scratch prefix (moved, then C and C++ consumers built against it), then the Python
#     package's pytest suite on that very extension (no second build of the library), then that
#     extension as a manylinux wheel, installed and run where the dev packages and toolkit are hidden;
#  2. the whole suite under ASan+UBSan;
#  3. the executor/runtime/host/graph tests under TSan;
#  4. clang with -Wthread-safety -Werror=thread-safety over the core (the GUARDED_BY/REQUIRES
#     annotations are checked at compile time, so the core's objects are all it builds) and the
#     libFuzzer trace fuzzer, which runs a fixed number of executions.
# Sanitizer and clang builds leave the CUDA backend out (the CUDA runtime is not sanitizer-clean)
# - the core logic they check is device-agnostic. Each stage prints its duration.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)
export CTEST_OUTPUT_ON_FAILURE=1

t_start=$(date +%s)
t_last=$t_start
step() {
  local now
  now=$(date +%s)
  [ "$now" -gt "$t_start" ] && echo "--- previous stage: $((now - t_last)) s (total $((now - t_start)) s)"
  t_last=$now
  echo; echo "=== $* ==="
}
# ccache, when installed, makes reruns cheap (it never changes what is built).
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi

step "python: virtual environment (build-py/venv: torch without its nvidia wheels, nanobind)"
bash python/test-package.sh --venv-only
py=$PWD/build-py/venv/bin/python

step "build (release, CUDA backend if available, the Python extension in the same tree)"
cmake -S . -B build -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPIPEFILL_BUILD_PYTHON=ON -DPython_EXECUTABLE="$py" >/dev/null
cmake --build build -j "$jobs"
step "tests (release)"
# package.installed_prefix_consumers runs as the next stage, on its own.
ctest --test-dir build -j "$jobs" --timeout 300 -E '^package[.]installed_prefix_consumers$'

step "install: the release tree into a scratch prefix, moved; C and C++ consumers through pkg-config and find_package"
# The ctest package.installed_prefix_consumers (tests/package_consumer/check_installed.sh): pipefill.pc
# relative to itself, the CMake package files, docs/integration.md section 4's program.
ctest --test-dir build --timeout 300 -R '^package[.]installed_prefix_consumers$' --no-tests=error

step "python package: the release tree's extension (CUDA backend included), pytest (bindings, gloo pipelines)"
# With the toolkit here the extension must be the CUDA build, the one `pip install .` gives users.
require_cuda=0
{ [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; } && require_cuda=1
# PIPEFILL_REQUIRE_SERVICE: the fill-job service tests fail (not skip) without psycopg or PostgreSQL.
PIPEFILL_REQUIRE_SERVICE=1 PIPEFILL_REQUIRE_CUDA_BUILD=$require_cuda PIPEFILL_PY_BUILD_DIR=build bash python/test-package.sh

step "wheel: packed from the release tree, repaired by auditwheel, installed and run without the dev packages or the toolkit"
# scripts/build-wheel.sh packs the extension the Python stage just tested (no second compile),
# makes it a manylinux wheel and checks it (nothing grafted, DT_NEEDED, exports, no fmt/spdlog
# symbol); tests/wheel/check_wheel.py installs it into a fresh venv where the Debian dev packages
# and the CUDA toolkit are hidden (scripts/with-hidden-deps.sh), as on a GPU node: the README
# snippet, no library of fmt/spdlog/CUDA mapped, import before and after torch.
rm -rf build/dist
bash scripts/build-wheel.sh --build-dir build --out build/dist
wheel=$(ls build/dist/pipefill-*.whl)
hide_toolkit=()
[ $require_cuda -eq 1 ] && hide_toolkit=(--hide-cuda-toolkit)
bash scripts/with-hidden-deps.sh "${hide_toolkit[@]}" -- \
  "$("$py" -c 'import sys; print(sys._base_executable)')" tests/wheel/check_wheel.py "$wheel" \
  --expect-cuda $require_cuda --torch-from "$py"

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

step "build (clang, -Wthread-safety -Werror=thread-safety over the core; the libFuzzer trace fuzzer)"
# The annotated locks (common/mutex.hpp) are checked at compile time: an access to a GUARDED_BY
# member without its mutex, or a call to a REQUIRES function without it, fails this build. The
# analysis runs per translation unit of the core, so the core's objects and the fuzzer are all
# this build compiles (the tests are compiled and run by the three builds above).
cmake -S . -B build-clang -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=Debug -DPIPEFILL_ENABLE_CUDA=OFF \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  "-DCMAKE_CXX_FLAGS=-Wthread-safety -Werror=thread-safety" -DPIPEFILL_BUILD_BENCHMARKS=OFF \
  -DPIPEFILL_BUILD_EXAMPLES=OFF -DPIPEFILL_BUILD_TOOLS=ON -DPIPEFILL_BUILD_FUZZERS=ON >/dev/null
cmake --build build-clang -j "$jobs" --target pipefill_core pipefill_trace_fuzzer
step "tests (clang: the libFuzzer trace fuzzer, a fixed number of runs from its seed corpus)"
ctest --test-dir build-clang -j "$jobs" --timeout 600 -L fuzz --no-tests=error

step "done"
echo "All test stages passed in $(( $(date +%s) - t_start )) s."
