#!/usr/bin/env bash
# The version rule (docs/api.md, "Versions"): one version, in CMake's project(VERSION), written
# the same in pipefill.h's PIPEFILL_VERSION_MAJOR/MINOR/PATCH and pyproject.toml's `version`.
# Usage: check_version.sh <source-dir> <cmake-project-version>. Run by the ctest package.one_version.
set -euo pipefail
src=$1
expected=$2
header=$src/include/pipefill/pipefill.h
field() { sed -n "s/^#define PIPEFILL_VERSION_$1 \([0-9][0-9]*\)$/\1/p" "$header"; }
from_header="$(field MAJOR).$(field MINOR).$(field PATCH)"
from_pyproject=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$src/pyproject.toml" | head -1)
status=0
[ "$from_header" = "$expected" ] || { echo "FAIL: pipefill.h says $from_header, CMake project(VERSION) $expected"; status=1; }
[ "$from_pyproject" = "$expected" ] || { echo "FAIL: pyproject.toml says $from_pyproject, CMake project(VERSION) $expected"; status=1; }
[ $status -eq 0 ] && echo "PASS: version $expected in CMakeLists.txt, pipefill.h and pyproject.toml"
exit $status
