#!/usr/bin/env bash
# Every public header compiled alone (a translation unit that includes only it), by gcc and
# clang-14 (each where installed; at least one must be), with -Wall -Wextra -Wpedantic -Werror:
#   pipefill.h                  as C99 and C11, and as C++17 and C++20 (+ -Wold-style-cast)
#   pipefill.hpp, devices.hpp,  as C++17 and C++20 (+ -Wold-style-cast)
#   item_protocol.hpp
# and initializers.c, which expands every PF_*_INITIALIZER macro, in all four modes (a macro is
# only checked where it is used). device.cuh is CUDA (nvcc) and is compiled by the CUDA build.
# Usage: check_headers.sh <include-dir>. Run by the ctest package.public_headers_compile_alone.
set -euo pipefail
include=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
warnings=(-Wall -Wextra -Wpedantic -Werror)
cxx_warnings=("${warnings[@]}" -Wold-style-cast)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# HEADERS: the headers compiled as C++ (default all four; an override checks an older tree).
HEADERS=${HEADERS:-pipefill.h pipefill.hpp devices.hpp item_protocol.hpp}
pairs=()
command -v gcc >/dev/null && command -v g++ >/dev/null && pairs+=("gcc g++")
command -v clang-14 >/dev/null && command -v clang++-14 >/dev/null && pairs+=("clang-14 clang++-14")
[ ${#pairs[@]} -gt 0 ] || { echo "FAIL: neither gcc nor clang-14 is installed"; exit 1; }

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

for header in pipefill.h $HEADERS; do
  printf '#include <pipefill/%s>\n' "$header" > "$out/$header.tu"
done
for pair in "${pairs[@]}"; do
  read -r cc cxx <<<"$pair"
  for std in c99 c11; do
    compile "$cc" c "$std" "$out/pipefill.h.tu" "${warnings[@]}"
    compile "$cc" c "$std" "$here/initializers.c" "${warnings[@]}"
  done
  for std in c++17 c++20; do
    for header in $HEADERS; do
      compile "$cxx" c++ "$std" "$out/$header.tu" "${cxx_warnings[@]}"
    done
    compile "$cxx" c++ "$std" "$here/initializers.c" "${cxx_warnings[@]}"
  done
done
echo "PASS: $checked compilations (${pairs[*]}): every public header alone, every initializer macro"
