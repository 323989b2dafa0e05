#!/usr/bin/env bash
# The Python stage of scripts/test.sh: sets up a virtual environment (build-py/venv, reused when
# present), makes the pipefill package importable in it and runs its pytest suite (bindings, the
# C trainer's figures, error paths, example fill jobs, torch.distributed.pipelining over gloo on
# 4 CPU processes, and the DeepSpeed and Megatron-Core adapters over gloo on 2 CPU processes).
#
# Where the package comes from:
#  - PIPEFILL_PY_BUILD_DIR=<build tree> (what scripts/test.sh does): the extension that tree built
#    with -DPIPEFILL_BUILD_PYTHON=ON (<tree>/python-package, put on the venv's sys.path by a .pth
#    file) - the same compile as the C++ tests, CUDA backend included when the toolkit is there,
#    so the library is not built a second time;
#  - otherwise `pip install .`, as a user installs it (CMAKE_ARGS from PIPEFILL_PY_CMAKE_ARGS).
# `--venv-only` sets up the venv and stops (scripts/test.sh needs its nanobind to configure).
#
# torch comes from PyPI (the CPU-only wheel index is not reachable here). Its Linux wheel
# depends on ~3 GB of nvidia-* wheels (CUDA runtime, cuDNN, cuBLAS, NCCL, ...): about 6
# minutes to install on a 2-core machine, for tests that never touch a GPU. So torch is
# installed with --no-deps plus its pure-Python requirements, plus the four shared libraries
# libtorch links that the CUDA toolkit of this machine kind (/usr/local/cuda, scripts/
# install-deps.sh's machine) does not provide; the rest (libcudart, libcublas, libcudnn, ...)
# resolve from the toolkit. If torch does not import that way (another machine), it is
# installed with all its dependencies instead.
#
# Environment: PIPEFILL_PY_BUILD_DIR (above), PIPEFILL_PY_CMAKE_ARGS (pip install only; default
# -DPIPEFILL_ENABLE_CUDA=OFF), PIPEFILL_BUILD_DIR (the C build whose c_trainer and libpipefill
# the tests compare with; default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
venv=build-py/venv
torch_version=2.15.0
# Pins of torch 2.15.0's requirements (its wheel's Requires-Dist) for the minimal install.
torch_native=(nvidia-nccl-cu13==2.30.7 nvidia-cusparselt-cu13==0.8.1 nvidia-nvshmem-cu13==3.7.2
              nvidia-cufile==1.17.1.22)
torch_python=(filelock "typing-extensions>=4.13.0" "setuptools>=77.0.3" "sympy>=1.13.3"
              "networkx>=2.5.1" jinja2 "fsspec>=0.8.5" numpy)

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py=$venv/bin/python
if ! "$py" -c "import torch, pytest, nanobind, scikit_build_core" 2>/dev/null; then
  echo "python: setting up $venv (pip install; torch without its nvidia-* dependencies)"
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q "scikit-build-core>=0.9" "nanobind>=2.0" pytest "${torch_python[@]}"
  "$py" -m pip install -q --no-deps "torch==$torch_version" "${torch_native[@]}"
  if ! "$py" -c "import torch" 2>/dev/null; then
    echo "python: torch does not import without its dependencies here; installing them all"
    "$py" -m pip install -q "torch==$torch_version"
  fi
fi
# --- fill-job service (issue 20): psycopg 3, the PostgreSQL driver of pipefill.service and its
# tests (tests/python/service, which start their own PostgreSQL server). Installed only if
# missing.
if ! "$py" -c "import psycopg" 2>/dev/null; then
  echo "python: installing psycopg[binary] (pipefill.service)"
  "$py" -m pip install -q "psycopg[binary]"
fi
# --- end of the fill-job service block
# --- framework adapters (issue 17): DeepSpeed and Megatron-Core for the tests of
# pipefill.deepspeed / pipefill.megatron, with --no-deps (so never torch's CUDA wheels), plus
# the pure-Python packages they import, pinned; DS_BUILD_OPS=0: DeepSpeed compiles no op at
# install (the tests also keep it from compiling its CPU shared-memory op at start). Installed
# only when the pinned versions are missing. If the install fails (no index), the adapter tests
# skip, and this says so.
deepspeed_version=0.19.8
megatron_core_version=0.16.1   # the newest megatron-core that installs on Python 3.11 (2026-12)
adapter_python=(psutil==7.2.2 py-cpuinfo==9.0.0 hjson==3.1.0 msgpack==1.2.4 einops==0.8.2
                tqdm==4.70.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
                typing-inspection==0.4.5)
if ! "$py" - "$deepspeed_version" "$megatron_core_version" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if (version("deepspeed"), version("megatron-core")) == tuple(sys.argv[1:3]) else 1)
PY
then
  echo "python: installing deepspeed $deepspeed_version and megatron-core $megatron_core_version (--no-deps)"
  if ! { "$py" -m pip install -q "${adapter_python[@]}" &&
         DS_BUILD_OPS=0 "$py" -m pip install -q --no-deps --no-build-isolation \
           "deepspeed==$deepspeed_version" "megatron-core==$megatron_core_version"; }; then
    echo "python: WARNING: DeepSpeed / Megatron-Core did not install: their adapter tests will skip"
  fi
fi
# --- end of the framework adapters block
echo "python: venv ready after $(( $(date +%s) - start )) s"

[ "${1:-}" = "--venv-only" ] && exit 0

site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
if [ -n "${PIPEFILL_PY_BUILD_DIR:-}" ]; then
  package_dir=$(cd "$PIPEFILL_PY_BUILD_DIR" && pwd)/python-package
  ls "$package_dir"/pipefill/_pipefill*.so >/dev/null 2>&1 ||
    { echo "python: no extension in $package_dir (configure the tree with -DPIPEFILL_BUILD_PYTHON=ON)" >&2; exit 1; }
  # An installed copy would shadow the build tree's (site-packages comes first on sys.path).
  "$py" -m pip uninstall -q -y pipefill >/dev/null 2>&1 || true
  echo "$package_dir" > "$site/pipefill-build-tree.pth"
  echo "python: using the package built in $PIPEFILL_PY_BUILD_DIR ($package_dir)"
else
  rm -f "$site/pipefill-build-tree.pth"
  # The package itself, as a user builds it (scikit-build-core over the repository's CMake);
  # --no-build-isolation reuses the venv's scikit-build-core and nanobind, and the build folder
  # build-py/cmake/<tag> persists, so a rerun only rebuilds what changed.
  CMAKE_ARGS="${PIPEFILL_PY_CMAKE_ARGS:--DPIPEFILL_ENABLE_CUDA=OFF}" \
    "$py" -m pip install -q --no-build-isolation .
  echo "python: package installed after $(( $(date +%s) - start )) s"
fi

PIPEFILL_BUILD_DIR="${PIPEFILL_BUILD_DIR:-build}" PIPEFILL_REQUIRE_BUILD=1 \
  "$py" -m pytest -q -p no:cacheprovider tests/python
echo "python: stage took $(( $(date +%s) - start )) s"
