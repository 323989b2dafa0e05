#!/usr/bin/env bash
# Runs a command where a GPU node's image would leave it: in a private mount namespace (unshare -m
# as root, else in a user namespace of its own) in which the system copies of PipeFill's C++
# dependencies are hidden - the headers, CMake package folders and /usr/src sources of fmt,
# spdlog, nlohmann-json, CLI11, GoogleTest/GoogleMock and Google Benchmark under empty read-only
# tmpfs mounts, their libraries and pkg-config files under /dev/null. Before the command starts
# it checks that none of them is still visible.
#
# --hide-cuda-toolkit: the CUDA toolkit too (each /usr/local/cuda* folder: nvcc, headers, static
# and shared libraries, the folder the loader's cache points at). Its shared libraries stay
# readable at $HIDDEN_CUDA_TOOLKIT_LIBS (exported to the command), a path nothing searches: a program
# that brings its own CUDA libraries on a GPU node (torch, from its nvidia-* wheels; here torch
# was installed without them, scripts/test.sh) is pointed there with LD_LIBRARY_PATH.
#
# Users: scripts/gpu-check-hidden-deps.sh (the GPU check builds from .gpu-deps/ alone) and
# scripts/test.sh's wheel stage (the wheel installs and runs without the dev packages or the toolkit).
# Usage: scripts/with-hidden-deps.sh [--hide-cuda-toolkit] [--] command [args...]
set -euo pipefail
hide_toolkit=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hide-cuda-toolkit) hide_toolkit=1; shift ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: $0 [--hide-cuda-toolkit] [--] command [args...]" >&2; exit 2; }

if [ "${_PIPEFILL_HIDDEN_NAMESPACE:-}" != "$$" ]; then
  flags=()
  [ $hide_toolkit -eq 1 ] && flags=(--hide-cuda-toolkit)
  # The same script again, inside the new namespace (exec keeps the pid the marker names). Not
  # root: in a user namespace of its own, where this user is root and may mount.
  namespace=(unshare --mount)
  [ "$(id -u)" -eq 0 ] || namespace+=(--map-root-user)
  export _PIPEFILL_HIDDEN_NAMESPACE=$$
  exec "${namespace[@]}" bash "$0" "${flags[@]}" -- "$@"
fi
unset _PIPEFILL_HIDDEN_NAMESPACE
mount --make-rprivate /

hidden_dirs=(
  /usr/include/fmt /usr/include/spdlog /usr/include/nlohmann /usr/include/CLI
  /usr/include/gtest /usr/include/gmock /usr/include/benchmark
  /usr/lib/x86_64-linux-gnu/cmake/fmt /usr/lib/x86_64-linux-gnu/cmake/spdlog
  /usr/lib/x86_64-linux-gnu/cmake/GTest /usr/lib/x86_64-linux-gnu/cmake/benchmark
  /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json
  /usr/src/googletest /usr/src/gtest
)
hidden_files=()
for pattern in 'libfmt.*' 'libspdlog.*' 'libgtest*' 'libgmock*' 'libbenchmark*' \
               'pkgconfig/fmt.pc' 'pkgconfig/spdlog.pc' 'pkgconfig/gtest*.pc' 'pkgconfig/gmock*.pc' \
               'pkgconfig/benchmark.pc'; do
  for f in /usr/lib/x86_64-linux-gnu/$pattern; do [ -e "$f" ] && hidden_files+=("$f"); done
done
for f in /usr/share/pkgconfig/CLI11.pc /usr/share/pkgconfig/nlohmann_json.pc; do
  [ -e "$f" ] && hidden_files+=("$f")
done
probes=(/usr/include/fmt/format.h /usr/include/spdlog/spdlog.h /usr/include/nlohmann/json.hpp
        /usr/include/CLI/CLI.hpp /usr/include/gtest/gtest.h /usr/include/benchmark/benchmark.h
        /usr/src/googletest/CMakeLists.txt)

if [ $hide_toolkit -eq 1 ]; then
  toolkits=()
  for d in /usr/local/cuda /usr/local/cuda-*; do
    [ -d "$d" ] || continue
    real=$(readlink -f "$d")
    [[ " ${toolkits[*]} " == *" $real "* ]] || toolkits+=("$real")
  done
  [ ${#toolkits[@]} -gt 0 ] || { echo "with-hidden-deps: no CUDA toolkit under /usr/local to hide" >&2; exit 2; }
  # The shared libraries, kept readable elsewhere first (a bind mount survives the tmpfs above
  # its source).
  libs_dir=$(mktemp -d "${TMPDIR:-/tmp}/pipefill-cuda-libs.XXXXXX")
  mount --bind "$(readlink -f "${toolkits[0]}/lib64")" "$libs_dir"
  export HIDDEN_CUDA_TOOLKIT_LIBS=$libs_dir
  hidden_dirs+=("${toolkits[@]}")
  probes+=("${toolkits[0]}/bin/nvcc" "${toolkits[0]}/include/cuda_runtime.h")
fi

for d in "${hidden_dirs[@]}"; do
  [ -d "$d" ] && mount -t tmpfs -o size=1m,ro tmpfs "$d"
done
for f in "${hidden_files[@]}"; do mount --bind /dev/null "$f"; done
for probe in "${probes[@]}"; do
  [ ! -e "$probe" ] || { echo "with-hidden-deps: still visible: $probe" >&2; exit 3; }
done
[ ! -s /usr/lib/x86_64-linux-gnu/libfmt.so ] || { echo "with-hidden-deps: still visible: libfmt.so" >&2; exit 3; }
what="system fmt, spdlog, nlohmann-json, CLI11, GoogleTest, Google Benchmark"
[ $hide_toolkit -eq 1 ] && what="$what; the CUDA toolkit (${toolkits[*]}; its shared libraries at $HIDDEN_CUDA_TOOLKIT_LIBS)"
echo "hidden: $what"
set +e
"$@"
rc=$?
if [ $hide_toolkit -eq 1 ]; then umount "$libs_dir" && rmdir "$libs_dir"; fi
exit $rc
