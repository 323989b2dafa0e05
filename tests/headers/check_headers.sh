#!/usr/bin/env bash
# Every public header compiled alone (a translation unit that includes only it), by gcc and
# clang-14 (each where installed; at least one must be), with -Wall -Wextra -Wpedantic -Werror:
#   the C API: pipefill.h and the headers it includes    as C99 and C11, and as C++17 and C++20
#   (pipefill_graph.h, pipefill_observe.h,               (+ -Wold-style-cast)
#   pipefill_sim.h, pipefill_host.h)
#   pipefill.hpp, devices.hpp, item_protocol.hpp         as C++17 and C++20 (+ -Wold-style-cast)
# Each C API header's unit takes the address of every PF_API function of all of them: including
# any one of them alone, or first, declares the whole C API (pipefill.h includes the others at its
# end, each of them includes pipefill.h first). As C++, no pf function may be referenced under a
# mangled name (every declaration is inside an extern "C" block; nm reads the object's symbols).
# And initializers.c, which expands every PF_*_INITIALIZER macro, in all four modes (a macro is
# only checked where it is used). device.cuh is CUDA (nvcc) and is compiled by the CUDA build.
# Usage: check_headers.sh <include-dir>. Run by the ctest package.public_headers_compile_alone.
set -euo pipefail
include=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
warnings=(-Wall -Wextra -Wpedantic -Werror)
cxx_warnings=("${warnings[@]}" -Wold-style-cast)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# C_HEADERS: the C API's headers (compiled as C and as C++); CXX_HEADERS: the C++ layer's. An
# override checks an older tree (e.g. C_HEADERS=pipefill.h before the C API was split).
C_HEADERS=${C_HEADERS:-pipefill.h pipefill_graph.h pipefill_observe.h pipefill_sim.h pipefill_host.h}
CXX_HEADERS=${CXX_HEADERS:-pipefill.hpp devices.hpp item_protocol.hpp}
pairs=()
command -v gcc >/dev/null && command -v g++ >/dev/null && pairs+=("gcc g++")
command -v clang-14 >/dev/null && command -v clang++-14 >/dev/null && pairs+=("clang-14 clang++-14")
[ ${#pairs[@]} -gt 0 ] || { echo "FAIL: neither gcc nor clang-14 is installed"; exit 1; }

# Every PF_API function the C API's headers declare (a declaration starts its line with PF_API).
functions=()
for header in $C_HEADERS; do
  [ -f "$include/pipefill/$header" ] || { echo "FAIL: no $include/pipefill/$header"; exit 1; }
  while read -r name; do functions+=("$name"); done < <(
    sed -n 's/^PF_API [^(]*[ *]\(pf[A-Za-z0-9_]*\)(.*/\1/p' "$include/pipefill/$header")
done
[ ${#functions[@]} -gt 0 ] || { echo "FAIL: no PF_API function found in $C_HEADERS"; exit 1; }

checked=0
compile() {  # compile <compiler> <lang> <std> <source-file> <warnings...>
  local compiler=$1 lang=$2 std=$3 source=$4
  shift 4
  if ! "$compiler" -x "$lang" "-std=$std" "$@" -I"$include" -c "$source" -o "$out/o.o" 2>"$out/err"; then
    echo "FAIL: $compiler -x $lang -std=$std $(basename "$source")"
    cat "$out/err"
    exit 1
  fi
  checked=$((checked + 1))
}
c_linkage() {  # c_linkage <compiler> <std> <header>: the last object names no pf function mangled
  if nm -u "$out/o.o" | grep -E ' _Z.*pf[A-Z]'; then
    echo "FAIL: $1 -std=$2 $3: a pf function referenced with C++ linkage (outside extern \"C\")"
    exit 1
  fi
}

for header in $C_HEADERS; do
  {
    printf '#include <pipefill/%s>\n\n' "$header"
    printf 'typedef void (*pf_check_fn)(void);\n'
    printf '#ifdef __cplusplus\n#define PF_CHECK_FN(f) reinterpret_cast<pf_check_fn>(f)\n'
    printf '#else\n#define PF_CHECK_FN(f) (pf_check_fn)(f)\n#endif\n'
    printf 'size_t pipefill_header_check_functions(void);\n'
    printf 'size_t pipefill_header_check_functions(void) {\n  static const pf_check_fn all[] = {\n'
    printf '      PF_CHECK_FN(%s),\n' "${functions[@]}"
    printf '  };\n  return sizeof all / sizeof all[0];\n}\n'
  } > "$out/$header.tu"
done
for header in $CXX_HEADERS; do
  printf '#include <pipefill/%s>\n' "$header" > "$out/$header.tu"
done
for pair in "${pairs[@]}"; do
  read -r cc cxx <<<"$pair"
  for std in c99 c11; do
    for header in $C_HEADERS; do
      compile "$cc" c "$std" "$out/$header.tu" "${warnings[@]}"
    done
    compile "$cc" c "$std" "$here/initializers.c" "${warnings[@]}"
  done
  for std in c++17 c++20; do
    for header in $C_HEADERS; do
      compile "$cxx" c++ "$std" "$out/$header.tu" "${cxx_warnings[@]}"
      c_linkage "$cxx" "$std" "$header"
    done
    for header in $CXX_HEADERS; do
      compile "$cxx" c++ "$std" "$out/$header.tu" "${cxx_warnings[@]}"
    done
    compile "$cxx" c++ "$std" "$here/initializers.c" "${cxx_warnings[@]}"
  done
done
echo "PASS: $checked compilations (${pairs[*]}): every public header alone (C API headers: C99, C11,"
echo "      C++17, C++20; each declares all ${#functions[@]} C functions, with C linkage in C++), every initializer macro"
