// Device-agnostic activity records: what the CUPTI collector (cuda/), the simulated device and
// the Chrome-trace importer (PyTorch profiler JSON) all produce, and what the trace analyser
// consumes. Kept free of CUDA types so the analysis is tested on CPU with recorded records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
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
  // Simulated kernels: when the last of their blocks started, i.e. when the kernel held every SM
  // it asked for (-1: unknown; real traces do not say).
  double all_blocks_started_us = -1.0;
  // Memory records only: bytes in use on the device right after this event when the producer
  // knows it (PyTorch's "[memory]" events carry "Total Allocated"), else -1. Lets the analyser
  // use absolute levels instead of summing deltas from an unknown starting point.
  int64_t in_use_bytes = -1;
  // Host records (device kHostDevice): the trace's process id (pid), so that the step markers
  // of several processes (ranks) in one trace stay apart. Device records: the process that
  // launched them when the producer knows it. -1: unknown.
  int64_t process = -1;
};

const char* activity_kind_name(ActivityKind kind);

// Heuristic used when the producer does not know: a kernel whose name contains one of
// `patterns` (case-insensitively) is communication. The default patterns are
// default_comm_name_patterns().
bool is_communication_kernel_name(std::string_view name, const std::vector<std::string>& patterns);
bool is_communication_kernel_name(std::string_view name);

// "nccl" (ncclKernel_* <= 2.18, ncclDevKernel_* >= 2.19, e.g. the SendRecv kernel that spins
// for a pipeline receive), "rccl", "msccl" (same stems), "nvshmem" (NVSHMEM's kernels and
// collectives) and "userbuffers" (Transformer Engine's comm-overlap kernels, also
// "kuserbuffers_*").
const std::vector<std::string>& default_comm_name_patterns();

// Device id used for host-side records (CPU annotations such as ProfilerStep#N).
inline constexpr int kHostDevice = -1;

// A Marker whose name starts with this is a bubble PipeFill measured ("bubble <class key>", as
// pfTraceWrite writes it): its interval is the bubble, the rest of the name its class.
inline constexpr const char* kBubbleMarkerPrefix = "bubble ";
bool is_bubble_marker(const ActivityRecord& record);

// A CPU range whose name starts with this is a fill slice PipeFill ran ("fill slice <job name>"): what
// pipefill._profiler puts into a torch.profiler trace on the host backend (a user_annotation on
// the fill stream's thread), read as fill activity of the process, next to its bubble markers.
inline constexpr const char* kFillSpanPrefix = "fill slice ";

}  // namespace pipefill
