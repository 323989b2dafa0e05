// Non-blocking event queries that leave CUDA's per-thread last error clean. cudaEventQuery on an
// event that has not completed returns cudaErrorNotReady *and* stores it as the thread's last
// error; a later `launch<<<...>>>; cudaGetLastError()` on the same thread (the executor thread
// queries slice events and launches fill kernels) would then report the stale NotReady as a
// launch failure and fail a healthy job. PyTorch's CUDAEvent::query clears it the same way.
// The CUDA functions are reached through a small table so the clearing is unit-tested on CPU.
#pragma once

#include <cuda_runtime_api.h>

namespace pipefill::cuda {

struct EventQueryApi {
  cudaError_t (*query)(cudaEvent_t event) = &cudaEventQuery;
  cudaError_t (*get_last_error)() = &cudaGetLastError;
};

enum class EventState { Complete, Pending, Failed };

// Complete: the event's work is done. Pending: not yet (NotReady, cleared from the last-error
// slot). Failed: *error holds the query's error (the caller reports it).
EventState query_event_state(cudaEvent_t event, cudaError_t* error, const EventQueryApi& api = {});

}  // namespace pipefill::cuda
