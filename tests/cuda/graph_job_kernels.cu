// Kernels of the graph-fill-job GPU test (graph_job_gpu_test.cpp): the "model" of one item, which
// reads its index from the job's index word, and a main-stream receive-wait stand-in.
#include <cuda_runtime.h>
#include <stdint.h>

#include "graph_job_kernels.hpp"

namespace pipefill::cuda::testing {
namespace {

__device__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void indexed_item_kernel(const uint64_t* index_word, float* out, uint32_t* runs, uint64_t spin_ns) {
  const uint64_t item = *reinterpret_cast<const volatile uint64_t*>(index_word);
  const uint64_t start = now_ns();
  while (now_ns() - start < spin_ns) {
  }
  if (threadIdx.x == 0) {
    out[item] = 2.0f * static_cast<float>(item) + 1.0f;
    atomicAdd(&runs[item], 1u);
  }
}

__global__ void spin_kernel(uint64_t spin_ns) {
  const uint64_t start = now_ns();
  while (now_ns() - start < spin_ns) {
  }
}

}  // namespace

cudaError_t launch_indexed_item(cudaStream_t stream, const uint64_t* index_word, float* out, uint32_t* runs,
                                uint64_t spin_ns) {
  indexed_item_kernel<<<1, 32, 0, stream>>>(index_word, out, runs, spin_ns);
  return cudaGetLastError();
}

cudaError_t launch_spin(cudaStream_t stream, uint64_t spin_ns) {
  spin_kernel<<<1, 32, 0, stream>>>(spin_ns);
  return cudaGetLastError();
}

}  // namespace pipefill::cuda::testing
