// Raw launchers of the backend's kernels, compiled by nvcc (fill_kernels.cu). They return
// cudaError_t and include no fmt/spdlog (nvcc cannot compile fmt 9's consteval checks); the
// checked, validated entry points are in fill_kernels.hpp.
#pragma once

#include <cuda_runtime_api.h>

#include "fill_kernels.hpp"

namespace pipefill::cuda::detail {

cudaError_t launch_spin_items_kernel(const pfSliceDesc_t& slice, int grid, int block_threads,
                                     size_t dynamic_smem_bytes, cudaStream_t stream, uint64_t item_ns,
                                     const SpinItemsRecords& records);
// One thread: atomicMax(*gate, bubble_id) in stream order (CudaDevice::write_word_max).
cudaError_t launch_gate_max_kernel(cudaStream_t stream, uint64_t* gate, uint64_t bubble_id);
cudaError_t spin_items_occupancy(int* blocks_per_sm, int block_threads, size_t dynamic_smem_bytes);
cudaError_t launch_spin_and_stamp_kernel(cudaStream_t stream, uint64_t ns, uint64_t* end_ns,
                                         volatile uint32_t* started);
cudaError_t launch_stamp_blocks_kernel(cudaStream_t stream, int blocks, int block_threads,
                                       size_t dynamic_smem_bytes, uint64_t spin_ns, uint64_t* start_ns,
                                       uint32_t* sm);
// cudaOccupancyMaxActiveClusters of the stamp-blocks kernel (block_threads threads, no shared
// memory) in clusters of `cluster_size` blocks launched on `stream`.
cudaError_t stamp_blocks_max_active_clusters(cudaStream_t stream, int cluster_size, int block_threads,
                                             int* clusters);
// cudaFuncGetAttributes on every kernel (forces the module load in the current context) and
// raises the dynamic shared-memory limits to `optin_smem_bytes` (minus static use).
cudaError_t load_kernels(int optin_smem_bytes);
// The kernel that sets a conditional graph node's IF condition from the gate:
// gate_condition_kernel(cudaGraphConditionalHandle handle, const volatile uint64_t* gate,
//                       uint64_t bubble_id) sets 1 while *gate < bubble_id (bubble open), else 0.
const void* gate_condition_kernel_function();

}  // namespace pipefill::cuda::detail
