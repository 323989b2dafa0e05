// Launchers of the graph-fill-job GPU test's kernels (graph_job_kernels.cu).
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

namespace pipefill::cuda::testing {

// One item: reads the item index from *index_word, spins spin_ns, writes out[item] = 2*item + 1
// and counts runs[item].
cudaError_t launch_indexed_item(cudaStream_t stream, const uint64_t* index_word, float* out, uint32_t* runs,
                                uint64_t spin_ns);
// A one-block kernel that spins spin_ns (the main stream's receive wait).
cudaError_t launch_spin(cudaStream_t stream, uint64_t spin_ns);

}  // namespace pipefill::cuda::testing
