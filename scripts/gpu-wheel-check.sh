#!/usr/bin/env bash
# The wheel on the GPU machine (a step of scripts/gpu-check.sh, after its build): packs the
# extension gpu-check's tree built into a wheel for the image's own Python (scripts/build-wheel.sh
# --build-dir: no second compile; a cp311 wheel from elsewhere would not install on its 3.12),
# repairs and checks it with auditwheel (from .gpu-deps/wheel-tools: the machine is offline), then
# tests/wheel/check_wheel.py installs it into a fresh venv and runs the README snippet, import
# before and after the image's torch, and Runtime(backend="cuda"), which must start when
# nvidia-smi sees a GPU (--gpu) and refuse with NO_DEVICE otherwise.
# Usage: scripts/gpu-wheel-check.sh <build-dir> [python]   (python: the one the tree was built with)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: $0 <build-dir> [python]}
py=${2:-python3}
rm -rf "$build/dist"
bash "$root/scripts/build-wheel.sh" --build-dir "$build" --out "$build/dist"
wheel=$(ls "$build"/dist/pipefill-*.whl)
gpu=()
nvidia-smi -L >/dev/null 2>&1 && gpu=(--gpu)
"$py" "$root/tests/wheel/check_wheel.py" "$wheel" --expect-cuda 1 --torch-from "$py" "${gpu[@]}"
