#!/usr/bin/env bash
# Installs a build tree into a scratch prefix, MOVES the prefix elsewhere (so nothing may point at
# the install location: pipefill.pc must be relative to ${pcfiledir}, the CMake package files to
# their own directory), then builds and runs, from the moved prefix:
#   0. each C API header (pipefill.h and the four it includes) alone, `cc -std=c99 -fsyntax-only`
#   1. main.c with `cc -std=c99 $(pkg-config --cflags --libs pipefill)`
#   2. cxx/main.cpp with `c++ -std=c++17 $(pkg-config --cflags --libs pipefill)`
#   3. docs/integration.md section 4's C trainer, extracted from the doc, the same way
#   4. main.c and cxx/main.cpp through find_package(pipefill) (this folder's CMakeLists.txt,
#      CMAKE_PREFIX_PATH only).
# Usage: check_installed.sh <build-dir> <scratch-dir> <expected-version>
# Environment: CC, CXX, CMAKE, CMAKE_GENERATOR (defaults: cc, c++, cmake, CMake's own default).
# Run by the ctest package.installed_prefix_consumers and by scripts/test.sh.
set -euo pipefail
build=$(cd "$1" && pwd)
mkdir -p "$2"
scratch=$(cd "$2" && pwd)
expected_version=$3
here=$(cd "$(dirname "$0")" && pwd)
cc=${CC:-cc}
cxx=${CXX:-c++}
cmake=${CMAKE:-cmake}
generator=()
[ -n "${CMAKE_GENERATOR:-}" ] && generator=(-G "$CMAKE_GENERATOR")

rm -rf "$scratch/installed" "$scratch/moved" "$scratch/out"
mkdir -p "$scratch/out" "$scratch/moved"
# The consumer's component (lib/CMakeLists.txt): library, headers, CMake and pkg-config files.
"$cmake" --install "$build" --prefix "$scratch/installed" --component pipefill >/dev/null
mv "$scratch/installed" "$scratch/moved/prefix"  # the install location no longer exists
prefix=$scratch/moved/prefix

pc=$(find "$prefix" -name pipefill.pc -path '*/pkgconfig/*' | head -1)
[ -n "$pc" ] || { echo "FAIL: no pipefill.pc under $prefix"; exit 1; }
if grep -n "$scratch/installed" "$pc"; then
  echo "FAIL: $pc names the install location it was moved away from"; exit 1
fi
export PKG_CONFIG_PATH=$(dirname "$pc")
flags=$(pkg-config --cflags --libs pipefill)
libdir=$(pkg-config --variable=libdir pipefill)
version=$(pkg-config --modversion pipefill)
echo "pkg-config from the moved prefix: $flags (version $version)"
[ "$version" = "$expected_version" ] || { echo "FAIL: pipefill.pc says $version, the build is $expected_version"; exit 1; }
[ -f "$libdir/libpipefill.so" ] || { echo "FAIL: libdir $libdir has no libpipefill.so"; exit 1; }
# The C API's headers (pipefill.h includes the other four), each compiled alone from the prefix.
for header in pipefill.h pipefill_graph.h pipefill_observe.h pipefill_sim.h pipefill_host.h; do
  [ -f "$(pkg-config --variable=includedir pipefill)/pipefill/$header" ] || {
    echo "FAIL: includedir has no pipefill/$header"; exit 1; }
  # shellcheck disable=SC2086  # $flags is a list of flags
  printf '#include <pipefill/%s>\n' "$header" | "$cc" -std=c99 -Wall -Wextra -Werror -x c - $flags \
    -fsyntax-only
done

# shellcheck disable=SC2086  # $flags is a list of flags
"$cc" -std=c99 -Wall -Wextra -Werror "$here/main.c" $flags -o "$scratch/out/c_pkgconfig"
# shellcheck disable=SC2086
"$cxx" -std=c++17 -Wall -Wextra -Werror "$here/cxx/main.cpp" $flags -o "$scratch/out/cxx_pkgconfig"
LD_LIBRARY_PATH=$libdir "$scratch/out/c_pkgconfig"
LD_LIBRARY_PATH=$libdir "$scratch/out/cxx_pkgconfig"
# docs/integration.md section 4's complete C trainer, as written there (the ```c block after its
# "package-consumer-test" marker), built the same way.
doc=$here/../../docs/integration.md
awk '/<!-- package-consumer-test: trainer.c -->/ {found = 1; next}
     found == 1 && /^```c$/ {found = 2; next}
     found == 2 && /^```$/ {exit}
     found == 2 {print}' "$doc" > "$scratch/out/trainer.c"
[ -s "$scratch/out/trainer.c" ] || { echo "FAIL: no trainer.c block in $doc"; exit 1; }
# shellcheck disable=SC2086
"$cc" -std=c99 -Wall -Wextra -Werror "$scratch/out/trainer.c" $flags -o "$scratch/out/trainer"
LD_LIBRARY_PATH=$libdir PIPEFILL_DEBUG=error "$scratch/out/trainer"

"$cmake" -S "$here" -B "$scratch/out/cmake" "${generator[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
"$cmake" --build "$scratch/out/cmake" >/dev/null
# The imported target carries the library's location: no LD_LIBRARY_PATH (CMake's build rpath).
"$scratch/out/cmake/consumer"
"$scratch/out/cmake/consumer_cxx"
echo "PASS: C and C++ consumers built and ran through pkg-config and find_package from a moved prefix"
