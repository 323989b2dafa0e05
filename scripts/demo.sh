#!/usr/bin/env bash
# PipeFill demo: builds the example pipeline engine and runs a 4-stage 1F1B pipeline whose
# bubbles are filled with batch inference of an MLP, next to the same run without filling and
# the naive baseline (ungated fill stream, no SM reservation), and prints the table.
# Works from a fresh clone on a machine without a GPU (simulated device); with a GPU and nvcc
# the CUDA backend is built and `--transport auto` runs on the GPU.
#
# Extra arguments go to pipeline_engine, e.g.  bash scripts/demo.sh --fill train --iterations 12
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

cuda=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then cuda=AUTO; fi
gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi

echo "=== configure build-demo (Release, CUDA backend: $cuda) ==="
cmake -S . -B build-demo -G Ninja -DCMAKE_BUILD_TYPE=Release -DPIPEFILL_ENABLE_CUDA="$cuda" \
  -DBUILD_TESTING=OFF -DPIPEFILL_BUILD_BENCHMARKS=OFF -DPIPEFILL_BUILD_TOOLS=OFF >/dev/null

targets=(pipeline_engine)
[ -f examples/c_trainer/CMakeLists.txt ] && targets+=(c_trainer)
echo "=== build ${targets[*]} ==="
cmake --build build-demo --target "${targets[@]}" -j "$(nproc)"

transport=sim
if [ "$gpu" = 1 ] && [ "$cuda" != OFF ]; then transport=auto; fi

echo
echo "=== pipeline_engine: 4-stage 1F1B, 8 micro-batches, MLP batch inference in the bubbles (transport $transport) ==="
./build-demo/examples/pipeline_engine/pipeline_engine --transport "$transport" --stages 4 \
  --microbatches 8 --fill mlp --iterations 8 --naive "$@"

if [ "$transport" = sim ]; then
  echo
  echo "=== the same pipeline with kernel durations jittered 5% (bubbles vary, predictions matter): every fill mode side by side ==="
  ./build-demo/examples/pipeline_engine/pipeline_engine --transport sim --stages 4 \
    --microbatches 8 --fill mlp --iterations 20 --jitter 0.05 --keep-every 0 --peers "$@"
  echo
  echo "=== the same with the sender's notice: each sender tells its receiver 10 us before the send (the notice's own trip), which closes that bubble's fill (pfBubbleCloseFill) ==="
  ./build-demo/examples/pipeline_engine/pipeline_engine --transport sim --stages 4 \
    --microbatches 8 --fill mlp --iterations 20 --jitter 0.05 --keep-every 0 --notice-lead 10 "$@" |
    grep -E '^(PipeFill|mean from|fill check)'
fi

if [ -x build-demo/examples/c_trainer/c_trainer ]; then
  echo
  echo "=== c_trainer: the same idea from plain C (simulated device) ==="
  ./build-demo/examples/c_trainer/c_trainer --iterations 6
fi
