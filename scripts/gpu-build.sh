#!/usr/bin/env bash
# Builds HERE everything the GPU check runs, so the GPU machine (15 minutes of device time in all,
# machine start included) only runs tests and measurements (issue 33 item 8). Output: one
# git-ignored folder, .gpu-build/ (at most 40 MiB), carried with the device call:
#
#   bin/        the GPU test and benchmark binaries, sm_90, Release, stripped: pipefill_cuda_tests,
#               pipefill_cupti_tests, pipefill_fill_jobs_gpu_tests, bench_gate_drain,
#               bench_bubble_instructions, pipeline_engine, and the design probes (gpu-probes/
#               probes.cu built with run.sh's own nvcc line) when gpu-probes/ is present
#   python/     the extension for the GPU image's Python 3.12 (_pipefill.cpython-312-*.so)
#   wheel/      that extension as a repaired manylinux cp312 wheel (scripts/build-wheel.sh)
#   MANIFEST    the commit, the source folder the binaries were built in (the CPU-side tests read
#               sources there), the toolkit, each file's size; scripts/gpu-check.sh prints it
#
# Every binary's DT_NEEDED is checked against what the GPU image has (glibc, libstdc++, libgcc_s;
# the probes also libcuda and CUPTI, the example engine the toolkit's cuBLAS): fmt, spdlog, GoogleTest and Google Benchmark are built from
# .gpu-deps/ (scripts/stage-gpu-deps.sh) as static, hidden-symbol archives, the CUDA runtime is
# static, cuBLAS and CUPTI are opened at first use, and NCCL (only the two-GPU test would link it)
# is left out. The Python 3.12 interpreter comes from GPU_BUILD_PYTHON, else python3.12 on the
# PATH (pyenv here), in a venv of its own (build-py312/venv: nanobind and scikit-build-core).
# Usage: scripts/gpu-build.sh [out-dir]   (build tree: GPU_BUILD_DIR, default build-gpu/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/.gpu-build}
build=${GPU_BUILD_DIR:-$root/build-gpu}
limit_mib=40
die() { echo "gpu-build: FAIL: $*" >&2; exit 1; }
t0=$(date +%s) t_last=$t0
stage() { local now; now=$(date +%s); echo "gpu-build: $* ($((now - t_last)) s)"; t_last=$now; }
export PATH=/usr/local/cuda/bin:$PATH

# ---- the interpreter of the GPU image's Python (3.12) ------------------------------------------
venv=$root/build-py312/venv
if [ ! -x "$venv/bin/python" ]; then
  base=${GPU_BUILD_PYTHON:-$(command -v python3.12 || true)}
  # A pyenv shim names python3.12 without running it unless a 3.12 version is selected: take the
  # installed 3.12 interpreter itself then.
  if [ -n "$base" ] && ! "$base" -c '' 2>/dev/null; then
    base=$(ls -d "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 2>/dev/null | tail -1 || true)
  fi
  [ -n "$base" ] || die "no Python 3.12 here (set GPU_BUILD_PYTHON): the GPU image's torch is for 3.12"
  "$base" -m venv "$venv"
  "$venv/bin/python" -m pip install -q nanobind==3.1.0 scikit-build-core==1.1.2 ||
    die "pip install nanobind scikit-build-core into $venv failed"
fi
py=$venv/bin/python
"$py" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' ||
  die "$py is not Python 3.12"

# ---- staged dependencies and the probes' source -------------------------------------------------
bash "$root/scripts/stage-gpu-deps.sh" > /dev/null
probes_src=${GPU_PROBES_DIR:-$root/../shared/gpu-probes}
if [ ! -f "$root/gpu-probes/probes.cu" ] && [ -f "$probes_src/probes.cu" ]; then
  cp -r "$probes_src" "$root/gpu-probes"
fi
stage "staged .gpu-deps/"

# ---- configure and build ------------------------------------------------------------------------
launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
mkdir -p "$build"  # its logs: gpu-build.{configure,build,wheel,probes}.log
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON \
  -DPIPEFILL_ENABLE_CUDA=ON -DPIPEFILL_CUDA_ARCHITECTURES=90 -DPIPEFILL_BUILD_EXAMPLES=ON \
  -DPIPEFILL_BUILD_BENCHMARKS=ON -DPIPEFILL_BUILD_TOOLS=OFF -DPIPEFILL_STAGED_DEPS=ON \
  -DPIPEFILL_BUILD_PYTHON=ON -DPIPEFILL_PYTHON_STUBS=OFF "-DPython_EXECUTABLE=$py" \
  "-Dnanobind_DIR=$("$py" -m nanobind --cmake_dir)" -DPIPEFILL_NCCL_LIBRARY=OFF \
  "${launcher[@]}" ${GPU_BUILD_CMAKE_ARGS:-} > "$build/gpu-build.configure.log" 2>&1 ||
  { tail -n 30 "$build/gpu-build.configure.log"; die "configure failed (log: $build/gpu-build.configure.log)"; }
grep -h 'PipeFill dependencies:' "$build/gpu-build.configure.log" | sed 's/^-- /gpu-build: /' || true
stage "configured $build"
targets=(pipefill_cuda_tests pipefill_cupti_tests pipefill_fill_jobs_gpu_tests bench_gate_drain
         bench_bubble_instructions bench_green_context_ab pipeline_engine _pipefill)
nice -n 10 cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" > "$build/gpu-build.build.log" 2>&1 ||
  { grep -E 'error|FAILED' "$build/gpu-build.build.log" | head -30; die "build failed (log: $build/gpu-build.build.log)"; }
stage "built ${targets[*]}"

# ---- collect ------------------------------------------------------------------------------------
rm -rf "$out.new"
mkdir -p "$out.new/bin" "$out.new/python" "$out.new/wheel"
for binary in tests/pipefill_cuda_tests tests/pipefill_cupti_tests \
              examples/fill_jobs/pipefill_fill_jobs_gpu_tests benchmarks/bench_gate_drain \
              benchmarks/bench_bubble_instructions benchmarks/bench_green_context_ab \
              examples/pipeline_engine/pipeline_engine; do
  [ -x "$build/$binary" ] || die "$build/$binary was not built"
  strip -o "$out.new/bin/$(basename "$binary")" "$build/$binary"
done
cp "$build"/python-package/pipefill/_pipefill.cpython-312-*.so "$out.new/python/" ||
  die "no Python 3.12 extension in $build/python-package/pipefill"
strip --strip-unneeded "$out.new"/python/_pipefill.*.so
bash "$root/scripts/build-wheel.sh" --build-dir "$build" --out "$out.new/wheel" > "$build/gpu-build.wheel.log" 2>&1 ||
  { tail -n 20 "$build/gpu-build.wheel.log"; die "the cp312 wheel failed (log: $build/gpu-build.wheel.log)"; }
stage "collected and stripped; $(basename "$(ls "$out.new"/wheel/*.whl)")"
if [ -f "$root/gpu-probes/probes.cu" ]; then
  # run.sh's own nvcc line (gpu-probes/ is not ours to change): the probes use the driver API and
  # CUPTI directly, linked against the toolkit's stubs and found at run time on the GPU machine.
  cupti=/usr/local/cuda/extras/CUPTI/lib64
  nvcc -std=c++17 -O2 -arch=sm_90 -o "$out.new/bin/probes" "$root/gpu-probes/probes.cu" -lcuda -lcupti \
    -L/usr/local/cuda/lib64 -L/usr/local/cuda/lib64/stubs -L"$cupti" -Xlinker -rpath -Xlinker "$cupti" \
    > "$build/gpu-build.probes.log" 2>&1 || { tail -n 20 "$build/gpu-build.probes.log"; die "the probes did not build"; }
  stage "built the probes"
fi

# ---- what the GPU image must provide: nothing beyond glibc/libstdc++ (and the driver, CUPTI) -----
allowed='^(libc\.so\.6|libm\.so\.6|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libdl\.so\.2|librt\.so\.1|libpthread\.so\.0|ld-linux-x86-64\.so\.2)$'
for f in "$out.new"/bin/* "$out.new"/python/*.so; do
  needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*Shared library: \[\(.*\)\]/\1/p')
  case "$(basename "$f")" in  # the toolkit's (gpu-check.sh puts its folders on their loader path)
    probes) needed=$(grep -vE '^(libcuda\.so\.1|libcupti\.so(\.[0-9.]+)?)$' <<<"$needed" || true) ;;
    pipeline_engine) needed=$(grep -vE '^libcublas\.so(\.[0-9.]+)?$' <<<"$needed" || true) ;;  # the example's own GEMMs
  esac
  bad=$(grep -vE "$allowed" <<<"$needed" | grep -v '^$' || true)
  [ -z "$bad" ] || die "$(basename "$f") needs $(tr '\n' ' ' <<<"$bad")- the GPU image lacks it"
done
stage "DT_NEEDED of every binary: glibc, libstdc++, libgcc_s only (probes: + libcuda, CUPTI; engine: + cuBLAS)"

commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$root" diff --quiet HEAD 2>/dev/null || commit="$commit+uncommitted-changes"
{
  echo "commit $commit"
  echo "built $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores in $(( $(date +%s) - t0 )) s"
  echo "source_dir $root"
  echo "cuda_include $(grep -oE 'PIPEFILL_CUDA_INCLUDE_DIR=[^ ]+' "$build/build.ninja" | head -1 | cut -d= -f2 | tr -d '\\"')"
  echo "nvcc $(nvcc --version | grep -oE 'release [0-9.]+' | head -1)"
  echo "python $("$py" -c 'import sys; print(sys.version.split()[0])')"
  (cd "$out.new" && find . -type f -printf '%P %s\n' | sort)
} > "$out.new/MANIFEST"
size_kib=$(du -sk "$out.new" | cut -f1)
[ "$size_kib" -le $((limit_mib * 1024)) ] || die "$out.new is $((size_kib / 1024)) MiB, over ${limit_mib} MiB"
rm -rf "$out"
mv "$out.new" "$out"
stage "$out: $((size_kib / 1024)) MiB, $(find "$out" -type f | wc -l) files; total $(( $(date +%s) - t0 )) s"
