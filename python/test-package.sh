#!/usr/bin/env bash
# The Python stage of scripts/test.sh: builds the pipefill package with `pip install .` into a
# virtual environment (build-py/venv, reused when present, so reruns are incremental) and runs
# its pytest suite (bindings, the C trainer's figures, error paths, example fill jobs,
# torch.distributed.pipelining over gloo on 4 CPU processes, and the DeepSpeed and Megatron-Core
# adapters over gloo on 2 CPU processes, after installing those two frameworks without their
# dependencies).
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
# Environment: PIPEFILL_PY_CMAKE_ARGS (default -DPIPEFILL_ENABLE_CUDA=OFF: the CUDA build of
# the package is checked separately; the core logic the tests exercise is device-agnostic),
# PIPEFILL_BUILD_DIR (the C build whose c_trainer and libpipefill the tests compare with;
# default build/).
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
echo "python: venv ready after $(( $(date +%s) - start )) s"

# The package itself, as a user builds it (scikit-build-core over the repository's CMake);
# --no-build-isolation reuses the venv's scikit-build-core and nanobind, and the build folder
# build-py/cmake/<tag> persists, so a rerun only rebuilds what changed.
CMAKE_ARGS="${PIPEFILL_PY_CMAKE_ARGS:--DPIPEFILL_ENABLE_CUDA=OFF}" \
  "$py" -m pip install -q --no-build-isolation .
echo "python: package installed after $(( $(date +%s) - start )) s"

# ---- The frameworks of the adapter tests (pipefill.deepspeed, pipefill.megatron) ----------
# DeepSpeed and Megatron-Core with --no-deps (so never torch's CUDA wheels), plus the
# pure-Python packages they import, pinned; DS_BUILD_OPS=0: DeepSpeed compiles no op at install
# (the tests also keep it from compiling its CPU shared-memory op at start). Skipped when the
# pinned versions are present. If the install fails (no index), the adapter tests skip, and
# this says so.
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
echo "python: adapter frameworks ready after $(( $(date +%s) - start )) s"

PIPEFILL_BUILD_DIR="${PIPEFILL_BUILD_DIR:-build}" PIPEFILL_REQUIRE_BUILD=1 \
  "$py" -m pytest -q -p no:cacheprovider tests/python
echo "python: stage took $(( $(date +%s) - start )) s"
