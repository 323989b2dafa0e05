// The fill arena's one device allocation (issue 33 item 5). cudaMalloc allocates on the calling
// thread's current context: on a thread with no context (the runtime's executor, a fresh Python
// thread) the CUDA runtime would bind device 0's primary context, so with device=N the arena would
// land on GPU 0 and the fill kernels on GPU N would fault (a sticky error that ends training). The
// allocation therefore runs with the runtime's device's primary context pushed for the call
// (DeviceContextScope), and the CUDA calls come from a small table so a CPU test can record the
// context each call ran in.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "driver_api.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::cuda {

struct ArenaMemoryApi {
  cudaError_t (*mem_get_info)(size_t* free_bytes, size_t* total_bytes) = &cudaMemGetInfo;
  cudaError_t (*malloc)(void** memory, size_t bytes) = &cudaMalloc;
  cudaError_t (*get_last_error)() = &cudaGetLastError;
};

// Allocates `bytes` (> 0) of device memory in `primary` (the primary context of `device`), the
// calling thread's current context unchanged afterwards. pfErrorOutOfMemory when fewer bytes are
// free or cudaMalloc runs out; the message names both figures.
pfResult_t allocate_arena_memory(const DriverApi& driver, CUcontext primary, CUdevice device, size_t bytes,
                                 void** base, const ArenaMemoryApi& api = {});

}  // namespace pipefill::cuda
