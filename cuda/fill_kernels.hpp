// Ready-made fill kernels (written with include/pipefill/device.cuh) and instrumentation kernels
// for tests and benchmarks, behind host launch functions that need no CUDA header: streams are
// `void*` (cudaStream_t), device buffers are plain pointers. Launch functions never allocate or
// synchronise, so a job's launch callback may call them inside a bubble.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pipefill/pipefill.h"

namespace pipefill::cuda {

// Optional per-item / per-block records of the spin-item kernel (each may be null).
struct SpinItemsRecords {
  uint32_t* item_runs = nullptr;       // [total_items] atomically incremented per run (exactly-once)
  uint64_t* item_start_ns = nullptr;   // [total_items] %globaltimer when the item started
  uint32_t* item_sm = nullptr;         // [total_items] %smid of the block that ran the item
  uint64_t* block_start_ns = nullptr;  // [grid] %globaltimer when the block started (before its first claim)
  uint64_t* block_exit_ns = nullptr;   // [grid] %globaltimer when the block left the item loop
  uint64_t* block_items = nullptr;     // [grid] items the block ran
};

struct SpinItemsParams {
  uint64_t item_ns = 10'000;     // busy time per item (%globaltimer)
  int block_threads = 128;
  size_t dynamic_smem_bytes = 0; // > 0 emulates SM-filling blocks (a big GEMM tile's smem)
  int max_grid = 0;              // > 0: further cap on the grid (benchmarks); 0: slice.max_blocks
  SpinItemsRecords records;
};

// The "spin item" ticket kernel: each item busy-waits params.item_ns and writes its records.
// Grid = min(slice.max_blocks, params.max_grid if set, resident capacity). *grid gets the grid
// used (may be null). A slice with max_items == 0 launches an empty kernel that touches no memory.
pfResult_t launch_spin_items(const pfSliceDesc_t& slice, void* stream,
                             const SpinItemsParams& params, int* grid = nullptr);

// Loads every shipped kernel into the current (primary) context now, so no lazy module load can
// happen inside a bubble (cudaFuncGetAttributes forces the load), and raises the spin kernel's
// dynamic shared-memory limit to the device's opt-in maximum.
pfResult_t load_fill_kernels();

// Cluster occupancy of a stream's context (issue 33 item 6): how many clusters of `cluster_size`
// blocks (128 threads, no shared memory) can be resident at once when launched on `stream` - on a
// stream of the fill partition's green context, what the partition's GPC layout leaves for
// cluster launches (a green context's SMs need not fill whole GPCs). Setup only.
pfResult_t max_active_clusters(void* stream, int cluster_size, int* clusters);
// Launches every shipped fill kernel once, empty, on `stream` and waits for it: loads the
// kernels into the stream's context (a green context has its own module state). Setup only.
pfResult_t warm_up_fill_kernels(void* stream);

// ---- Instrumentation kernels (tests, benchmarks) -------------------------------------------
// One block busy-waits `ns`, then writes its end time to *end_ns (may be null): a stand-in for
// the main job's spinning receive that defines a bubble. When `started` is given (a device
// pointer to host-mapped memory), the block sets it to 1 as soon as it runs, so the host can
// confirm the kernel is resident before it fills the other SMs (see wait_for_flag).
pfResult_t launch_spin_and_stamp(void* stream, uint64_t ns, uint64_t* end_ns,
                                 volatile uint32_t* started = nullptr);
// Polls a host-mapped flag (host pointer) until it is non-zero or `timeout_us` passes (then
// pfErrorTimeout naming `what`). For benchmarks and tests, never inside a bubble.
pfResult_t wait_for_flag(const volatile uint32_t* flag, double timeout_us, const char* what);
// A full-width "main job" kernel: `blocks` blocks each record their start time and SM, then spin
// `spin_ns`. dynamic_smem_bytes lets blocks refuse to share an SM with fill blocks.
pfResult_t launch_stamp_blocks(void* stream, int blocks, int block_threads,
                               size_t dynamic_smem_bytes, uint64_t spin_ns, uint64_t* start_ns,
                               uint32_t* sm);
// Device property helper for tests/benchmarks: the largest dynamic shared memory a block may opt
// into on the current device.
pfResult_t max_dynamic_smem_per_block(size_t* bytes);

}  // namespace pipefill::cuda
