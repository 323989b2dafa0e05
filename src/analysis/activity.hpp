// Device-agnostic activity records: what the CUPTI collector (cuda/), the simulated device and
// the Chrome-trace importer (PyTorch profiler JSON) all produce, and what the trace analyser
// consumes. Kept free of CUDA types so the analysis is tested on CPU with recorded records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pipefill {

enum class ActivityKind {
  Kernel,   // a compute kernel of the main job
  Comm,     // a communication kernel (NCCL send/recv/all-reduce...)
  Fill,     // a fill-job kernel or slice launched by PipeFill
  Memcpy,
  Memset,
  MemoryAlloc,  // bytes > 0: allocation, timestamp in start_us
  MemoryFree,   // bytes > 0: release
  Marker        // bubble begin/end markers etc. (name says which)
};

struct ActivityRecord {
  ActivityKind kind = ActivityKind::Kernel;
  std::string name;
  int device = 0;
  uint64_t stream = 0;     // stream id (CUPTI streamId, sim stream id, trace tid)
  double start_us = 0.0;
  double end_us = 0.0;
  uint64_t bytes = 0;      // memcpy/memset/memory
  uint64_t correlation = 0;
  int grid_blocks = 0;     // kernels: blocks launched (0 unknown)
  // Memory records only: bytes in use on the device right after this event when the producer
  // knows it (PyTorch's "[memory]" events carry "Total Allocated"), else -1. Lets the analyser
  // use absolute levels instead of summing deltas from an unknown starting point.
  int64_t in_use_bytes = -1;
};

const char* activity_kind_name(ActivityKind kind);

// Heuristic used when the producer does not know: NCCL kernels are communication. Matches
// "nccl" (ncclKernel_*, ncclDevKernel_*), "rccl" and "msccl", case-insensitively.
bool is_communication_kernel_name(const std::string& name);

// Device id used for host-side records (CPU annotations such as ProfilerStep#N).
inline constexpr int kHostDevice = -1;

// A Marker whose name starts with this is a bubble PipeFill measured ("bubble <class key>", as
// pfTraceWrite writes it): its interval is the bubble, the rest of the name its class.
inline constexpr const char* kBubbleMarkerPrefix = "bubble ";
bool is_bubble_marker(const ActivityRecord& record);

}  // namespace pipefill
