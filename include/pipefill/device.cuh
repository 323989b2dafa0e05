/*
 * Device-side helpers for fill-kernel authors (include from .cu files only).
 *
 * A ticket fill kernel is a grid of persistent blocks that claim items one at a time from the
 * job's cursor and check the bubble's gate before every claim, following the slice protocol of
 * pfSliceDesc_t (pipefill.h):
 *
 *   stop when   *gate >= bubble_id                               (the bubble has ended)
 *          or   atomicAdd(budget_counter, 1) >= max_items        (the slice's budget is spent)
 *          or   the claimed item >= total_items                  (the job has no items left)
 *
 * The cursor persists across slices, so the next bubble's slice resumes where this one stopped
 * with no host round trip, and every item is processed exactly once: an item is only claimed
 * (cursor advanced) after the gate and budget checks passed, and a claimed item is always run.
 * Overrun past the bubble end is bounded by one item's duration. The claim itself is
 * pipefill/item_protocol.hpp (CUDA-free, shared with the simulator, the host device and the CPU
 * tests of the protocol).
 *
 * Usage:
 *
 *   __global__ void my_fill_kernel(pfSliceDesc_t slice, MyArgs args) {
 *     pipefill::device::for_each_item(slice, [&](uint64_t item) {
 *       ... every thread of the block works on `item` ...
 *     });
 *   }
 *   // host, at setup: pipefill::device::fill_grid_size(my_fill_kernel, 256, 0, slice.max_blocks, &grid)
 *
 * Rules for the item body: it must not return early from the kernel (the loop's barriers need
 * every thread), must not allocate, and should take a bounded, measured time (the planner sizes
 * slices from it). A fault in a fill kernel is a sticky CUDA error that ends the whole context,
 * the training job's included: test fill kernels (compute-sanitizer) before running them in
 * bubbles.
 */
#ifndef PIPEFILL_DEVICE_CUH_
#define PIPEFILL_DEVICE_CUH_

#include <cuda_runtime.h>
#include <stdint.h>

#include "pipefill/item_protocol.hpp"
#include "pipefill/pipefill.h"

namespace pipefill {
namespace device {

/* Item value thread 0 publishes when the block must stop. */
constexpr uint64_t kStopItem = protocol::kStopItem;

/* An atomics policy (pipefill/item_protocol.hpp) from a bare `add(word)`: the gate is read with
 * a volatile load, which is how the device loop has always read it. */
template <typename AtomicAdd>
struct AddOnlyAtomics {
  AtomicAdd& add;
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
  __host__ __device__ uint64_t load(const volatile uint64_t* word) const { return *word; }
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
  __host__ __device__ uint64_t fetch_add_one(uint64_t* word) const { return add(word); }
};

/*
 * The claim decision of the slice protocol (protocol::claim_item), kept for code written against
 * earlier versions of this header: `add(word)` must atomically add 1 to *word and return the old
 * value (atomicAdd on the GPU). Returns the claimed item or kStopItem.
 */
#if defined(__CUDACC__)
#pragma nv_exec_check_disable /* AtomicAdd may be device-only (atomicAdd) or host-only (tests) */
#endif
template <typename AtomicAdd>
__host__ __device__ inline uint64_t claim_item_with(const pfSliceDesc_t& slice, AtomicAdd&& add) {
  return protocol::claim_item(slice, AddOnlyAtomics<AtomicAdd>{add});
}

#if defined(__CUDACC__)
/* The GPU policy: the gate through a volatile load (it is written by a stream-ordered memset or
 * copy of another stream), the counters through atomicAdd. */
struct CudaAtomics {
  __device__ uint64_t load(const volatile uint64_t* word) const { return *word; }
  __device__ uint64_t fetch_add_one(uint64_t* word) const {
    return atomicAdd(reinterpret_cast<unsigned long long*>(word), 1ull);
  }
};
#endif

#if defined(__CUDACC__)
/* Nanoseconds on the GPU's global timer (same clock on every SM; ~1 us resolution on some GPUs). */
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* The SM this thread runs on (for confinement checks). */
__device__ __forceinline__ unsigned sm_id() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

/* Busy-waits `ns` nanoseconds (a stand-in for real work in tests and benchmarks). */
__device__ __forceinline__ void spin_ns(uint64_t ns) {
  const uint64_t start = globaltimer_ns();
  while (globaltimer_ns() - start < ns) {
  }
}

/* Whether the bubble this slice belongs to has ended (the gate holds the last closed id). */
__device__ __forceinline__ bool gate_closed(const pfSliceDesc_t& slice) {
  return protocol::gate_closed(slice, CudaAtomics{});
}

/* Called by thread 0 only: the next item for this block, or kStopItem. */
__device__ __forceinline__ uint64_t claim_item(const pfSliceDesc_t& slice) {
  return protocol::claim_item(slice, CudaAtomics{});
}

/*
 * The item loop. Every thread of the block must call it (it uses __syncthreads). `body(item)` is
 * run by all threads of the block for each claimed item. Returns the number of items this block
 * ran (the same value in every thread).
 */
template <typename Body>
__device__ uint64_t for_each_item(const pfSliceDesc_t& slice, Body&& body) {
  __shared__ uint64_t shared_item;
  uint64_t done = 0;
  for (;;) {
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) shared_item = claim_item(slice);
    __syncthreads();
    const uint64_t item = shared_item;
    /* Second barrier: thread 0 must not overwrite shared_item for the next claim before every
     * thread has read this one. */
    __syncthreads();
    if (item == kStopItem) break;
    body(item);
    ++done;
  }
  return done;
}

#endif /* __CUDACC__ */

/*
 * Host side: the grid for a ticket kernel. As many blocks as fit resident at once on the device
 * (occupancy x SMs), capped by `max_blocks` (the slice's cap: in grid-cap mode one block per
 * fill SM, so fill blocks never occupy the SMs reserved for the main job). Persistent blocks that
 * cannot be resident would only start after others exit, so more never helps.
 */
template <typename Kernel>
inline cudaError_t fill_grid_size(Kernel kernel, int block_threads, size_t dynamic_smem_bytes,
                                  int max_blocks, int* grid) {
  if (grid == nullptr || block_threads <= 0 || max_blocks < 0) return cudaErrorInvalidValue;
  int per_sm = 0;
  cudaError_t error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, kernel, block_threads, dynamic_smem_bytes);
  if (error != cudaSuccess) return error;
  int device = 0, sms = 0;
  if ((error = cudaGetDevice(&device)) != cudaSuccess) return error;
  if ((error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess)
    return error;
  if (per_sm <= 0) return cudaErrorInvalidConfiguration; /* the block does not fit an SM */
  const long long resident = static_cast<long long>(per_sm) * sms;
  *grid = static_cast<int>(resident < max_blocks ? resident : max_blocks);
  return cudaSuccess;
}

} /* namespace device */
} /* namespace pipefill */

#endif /* PIPEFILL_DEVICE_CUH_ */
