#include "fill_kernels.hpp"

#include <cuda_runtime_api.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "cuda_check.hpp"
#include "kernel_launchers.hpp"

namespace pipefill::cuda {
namespace {

// Resident spin blocks for the last (device, threads, smem) configuration, so a job's steady
// state does not call the occupancy API on every launch.
struct OccupancyCache {
  std::mutex mutex;
  int device = -1, threads = -1, sms = 0, per_sm = 0;
  size_t smem = ~size_t{0};
};

pfResult_t spin_items_capacity(int threads, size_t smem, int* capacity) {
  static OccupancyCache cache;
  int device = 0;
  PF_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard lock(cache.mutex);
  if (cache.device != device || cache.threads != threads || cache.smem != smem) {
    int per_sm = 0, sms = 0;
    PF_CUDA_CHECK(detail::spin_items_occupancy(&per_sm, threads, smem));
    PF_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    cache.device = device;
    cache.threads = threads;
    cache.smem = smem;
    cache.sms = sms;
    cache.per_sm = per_sm;
  }
  if (cache.per_sm <= 0)
    return fail(pfErrorInvalidArgument,
                "spin items: a block of {} threads with {} bytes of dynamic shared memory does not fit an SM",
                threads, smem);
  *capacity = cache.per_sm * cache.sms;
  return pfSuccess;
}

}  // namespace

pfResult_t launch_spin_items(const pfSliceDesc_t& slice, void* stream, const SpinItemsParams& params,
                             int* grid_out) {
  if (params.block_threads <= 0 || params.block_threads > 1024)
    return fail(pfErrorInvalidArgument, "spin items: block_threads={} must be in 1..1024", params.block_threads);
  int grid = 1;  // an empty slice still launches one block, which loads the kernel and exits
  if (slice.max_items != 0) {
    if (slice.gate == nullptr || slice.cursor == nullptr || slice.budget_counter == nullptr)
      return fail(pfErrorInvalidArgument,
                  "spin items: slice gate/cursor/budget_counter must be device pointers (got {}, {}, {})",
                  static_cast<const void*>(const_cast<const uint64_t*>(slice.gate)),
                  static_cast<const void*>(slice.cursor), static_cast<const void*>(slice.budget_counter));
    if (slice.max_blocks <= 0)
      return fail(pfErrorInvalidArgument, "spin items: slice.max_blocks={} must be > 0", slice.max_blocks);
    int capacity = 0;
    PF_TRY(spin_items_capacity(params.block_threads, params.dynamic_smem_bytes, &capacity));
    grid = slice.max_blocks;
    if (params.max_grid > 0 && params.max_grid < grid) grid = params.max_grid;
    if (capacity < grid) grid = capacity;
  }
  PF_CUDA_CHECK(detail::launch_spin_items_kernel(slice, grid, params.block_threads, params.dynamic_smem_bytes,
                                                 static_cast<cudaStream_t>(stream), params.item_ns,
                                                 params.records));
  if (grid_out) *grid_out = grid;
  return pfSuccess;
}

pfResult_t load_fill_kernels() {
  size_t optin = 0;
  PF_TRY(max_dynamic_smem_per_block(&optin));
  PF_CUDA_CHECK(detail::load_kernels(static_cast<int>(optin)));
  return pfSuccess;
}

pfResult_t max_active_clusters(void* stream, int cluster_size, int* clusters) {
  if (clusters == nullptr) return fail(pfErrorInvalidArgument, "max_active_clusters: clusters is null");
  if (cluster_size < 1 || cluster_size > 8)
    return fail(pfErrorInvalidArgument, "max_active_clusters: cluster_size={} (1..8, the portable maximum)",
                cluster_size);
  PF_CUDA_CHECK(detail::stamp_blocks_max_active_clusters(static_cast<cudaStream_t>(stream), cluster_size, 128,
                                                         clusters));
  return pfSuccess;
}

pfResult_t warm_up_fill_kernels(void* stream) {
  pfSliceDesc_t empty{};
  empty.max_items = 0;
  PF_TRY(launch_spin_items(empty, stream, SpinItemsParams{}));
  PF_TRY(launch_spin_and_stamp(stream, 0, nullptr));
  PF_TRY(launch_stamp_blocks(stream, 1, 32, 0, 0, nullptr, nullptr));
  PF_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  return pfSuccess;
}

pfResult_t launch_spin_and_stamp(void* stream, uint64_t ns, uint64_t* end_ns, volatile uint32_t* started) {
  PF_CUDA_CHECK(detail::launch_spin_and_stamp_kernel(static_cast<cudaStream_t>(stream), ns, end_ns, started));
  return pfSuccess;
}

pfResult_t wait_for_flag(const volatile uint32_t* flag, double timeout_us, const char* what) {
  if (flag == nullptr) return fail(pfErrorInvalidArgument, "wait_for_flag({}): flag is null", what);
  const auto start = std::chrono::steady_clock::now();
  while (*flag == 0) {
    const double waited =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout_us)
      return fail(pfErrorTimeout, "{} did not start within {:.0f} us", what, timeout_us);
    std::this_thread::yield();
  }
  return pfSuccess;
}

pfResult_t launch_stamp_blocks(void* stream, int blocks, int block_threads, size_t dynamic_smem_bytes,
                               uint64_t spin_ns, uint64_t* start_ns, uint32_t* sm) {
  if (blocks <= 0 || block_threads <= 0 || block_threads > 1024)
    return fail(pfErrorInvalidArgument, "stamp blocks: blocks={} block_threads={} out of range", blocks,
                block_threads);
  PF_CUDA_CHECK(detail::launch_stamp_blocks_kernel(static_cast<cudaStream_t>(stream), blocks, block_threads,
                                                   dynamic_smem_bytes, spin_ns, start_ns, sm));
  return pfSuccess;
}

pfResult_t max_dynamic_smem_per_block(size_t* bytes) {
  if (bytes == nullptr) return fail(pfErrorInvalidArgument, "max_dynamic_smem_per_block: bytes is null");
  int device = 0, optin = 0;
  PF_CUDA_CHECK(cudaGetDevice(&device));
  PF_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  *bytes = static_cast<size_t>(optin);
  return pfSuccess;
}

}  // namespace pipefill::cuda
