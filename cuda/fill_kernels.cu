// The backend's kernels (ticket fill kernels written with pipefill/device.cuh, instrumentation
// kernels, the gate-condition kernel) and their raw launchers. No fmt here: see kernel_launchers.hpp.
#include <cuda_runtime.h>

#include "kernel_launchers.hpp"
#include "pipefill/device.cuh"

namespace pipefill::cuda {
namespace {

__global__ void spin_items_kernel(pfSliceDesc_t slice, uint64_t item_ns, SpinItemsRecords records) {
  using namespace pipefill::device;
  if (threadIdx.x == 0 && records.block_start_ns && slice.max_items != 0)
    records.block_start_ns[blockIdx.x] = globaltimer_ns();
  const uint64_t done = for_each_item(slice, [&](uint64_t item) {
    if (threadIdx.x == 0) {
      if (records.item_start_ns) records.item_start_ns[item] = globaltimer_ns();
      if (records.item_sm) records.item_sm[item] = sm_id();
    }
    spin_ns(item_ns);
    if (threadIdx.x == 0 && records.item_runs) atomicAdd(&records.item_runs[item], 1u);
  });
  if (threadIdx.x == 0 && slice.max_items != 0) {
    if (records.block_exit_ns) records.block_exit_ns[blockIdx.x] = globaltimer_ns();
    if (records.block_items) records.block_items[blockIdx.x] = done;
  }
}

__global__ void spin_and_stamp_kernel(uint64_t ns, uint64_t* end_ns, volatile uint32_t* started) {
  if (threadIdx.x == 0 && started) {
    *started = 1;
    __threadfence_system();  // make the flag visible to the polling host now
  }
  pipefill::device::spin_ns(ns);
  if (threadIdx.x == 0 && end_ns) *end_ns = pipefill::device::globaltimer_ns();
}

__global__ void stamp_blocks_kernel(uint64_t spin_ns, uint64_t* start_ns, uint32_t* sm) {
  if (threadIdx.x == 0) {
    if (start_ns) start_ns[blockIdx.x] = pipefill::device::globaltimer_ns();
    if (sm) sm[blockIdx.x] = pipefill::device::sm_id();
  }
  pipefill::device::spin_ns(spin_ns);
}

// Sets the IF condition of a conditional graph node: run the body only while the bubble is
// open (*gate < bubble_id). The bubble id is a kernel parameter that the host updates in the
// instantiated graph (cudaGraphExecKernelNodeSetParams) before each launch.
__global__ void gate_condition_kernel(cudaGraphConditionalHandle handle, const volatile uint64_t* gate,
                                      uint64_t bubble_id) {
  cudaGraphSetConditional(handle, *gate < bubble_id ? 1u : 0u);
}

// The early gate close of pfBubbleCloseFill: an atomic max, so a close issued on a side stream
// that runs late can never move the gate back below a later bubble's close (the main stream's
// plain writes only ever raise it).
__global__ void gate_max_kernel(unsigned long long* gate, unsigned long long bubble_id) {
  atomicMax(gate, bubble_id);
}

}  // namespace

namespace detail {

cudaError_t launch_gate_max_kernel(cudaStream_t stream, uint64_t* gate, uint64_t bubble_id) {
  gate_max_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<unsigned long long*>(gate),
                                       static_cast<unsigned long long>(bubble_id));
  return cudaGetLastError();
}


cudaError_t launch_spin_items_kernel(const pfSliceDesc_t& slice, int grid, int block_threads,
                                     size_t dynamic_smem_bytes, cudaStream_t stream, uint64_t item_ns,
                                     const SpinItemsRecords& records) {
  spin_items_kernel<<<grid, block_threads, dynamic_smem_bytes, stream>>>(slice, item_ns, records);
  return cudaGetLastError();
}

cudaError_t spin_items_occupancy(int* blocks_per_sm, int block_threads, size_t dynamic_smem_bytes) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, spin_items_kernel, block_threads,
                                                       dynamic_smem_bytes);
}

cudaError_t launch_spin_and_stamp_kernel(cudaStream_t stream, uint64_t ns, uint64_t* end_ns,
                                         volatile uint32_t* started) {
  spin_and_stamp_kernel<<<1, 32, 0, stream>>>(ns, end_ns, started);
  return cudaGetLastError();
}

cudaError_t launch_stamp_blocks_kernel(cudaStream_t stream, int blocks, int block_threads,
                                       size_t dynamic_smem_bytes, uint64_t spin_ns, uint64_t* start_ns,
                                       uint32_t* sm) {
  stamp_blocks_kernel<<<blocks, block_threads, dynamic_smem_bytes, stream>>>(spin_ns, start_ns, sm);
  return cudaGetLastError();
}

cudaError_t stamp_blocks_max_active_clusters(cudaStream_t stream, int cluster_size, int block_threads,
                                             int* clusters) {
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(cluster_size);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(cluster_size));
  config.blockDim = dim3(static_cast<unsigned>(block_threads));
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return cudaOccupancyMaxActiveClusters(clusters, stamp_blocks_kernel, &config);
}

cudaError_t load_kernels(int optin_smem_bytes) {
  cudaFuncAttributes spin{}, other{};
  cudaError_t error = cudaFuncGetAttributes(&spin, spin_items_kernel);
  if (error == cudaSuccess) error = cudaFuncGetAttributes(&other, spin_and_stamp_kernel);
  if (error == cudaSuccess) error = cudaFuncGetAttributes(&other, gate_condition_kernel);
  if (error == cudaSuccess) error = cudaFuncGetAttributes(&other, stamp_blocks_kernel);
  if (error == cudaSuccess) error = cudaFuncGetAttributes(&other, gate_max_kernel);
  if (error != cudaSuccess) return error;
  // Static shared memory (the item loop's word) counts against the same per-block limit.
  error = cudaFuncSetAttribute(spin_items_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               optin_smem_bytes - static_cast<int>(spin.sharedSizeBytes));
  if (error != cudaSuccess) return error;
  return cudaFuncSetAttribute(stamp_blocks_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              optin_smem_bytes - static_cast<int>(other.sharedSizeBytes));
}

const void* gate_condition_kernel_function() {
  return reinterpret_cast<const void*>(gate_condition_kernel);
}

}  // namespace detail
}  // namespace pipefill::cuda
