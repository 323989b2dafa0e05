// Builders for synthetic activity records used by the analysis tests.
#pragma once

#include <string>
#include <vector>

#include "analysis/activity.hpp"

namespace pipefill::analysis::testing {

inline ActivityRecord record(ActivityKind kind, double start_us, double end_us,
                             std::string name = "gemm", int device = 0, uint64_t stream = 7) {
  ActivityRecord r;
  r.kind = kind;
  r.name = std::move(name);
  r.device = device;
  r.stream = stream;
  r.start_us = start_us;
  r.end_us = end_us;
  return r;
}

inline ActivityRecord kernel(double start_us, double end_us, std::string name = "gemm",
                             int device = 0, uint64_t stream = 7) {
  return record(ActivityKind::Kernel, start_us, end_us, std::move(name), device, stream);
}

inline ActivityRecord comm(double start_us, double end_us, int device = 0) {
  return record(ActivityKind::Comm, start_us, end_us, "ncclDevKernel_SendRecv", device, 20);
}

inline ActivityRecord memory(ActivityKind kind, double time_us, uint64_t bytes,
                             int64_t in_use = -1, int device = 0) {
  ActivityRecord r = record(kind, time_us, time_us, "[memory]", device, 0);
  r.bytes = bytes;
  r.in_use_bytes = in_use;
  return r;
}

inline ActivityRecord marker(double start_us, double end_us, std::string name, int device = 0,
                             uint64_t stream = 7) {
  return record(ActivityKind::Marker, start_us, end_us, std::move(name), device, stream);
}

// Five iterations of 1000 us starting at 0. Iteration i: kernels [b, b+100),
// [b+300+10i, b+400), [b+600, b+650), [b+900, b+1000) with b = 1000 i, so its bubbles are
// [b+100, b+300+10i) (200 + 10 i us), [b+400, b+600) (200 us) and [b+650, b+900) (250 us).
inline std::vector<ActivityRecord> five_iterations() {
  std::vector<ActivityRecord> records;
  for (int i = 0; i < 5; ++i) {
    const double b = 1000.0 * i;
    records.push_back(kernel(b, b + 100, "fwd"));
    records.push_back(kernel(b + 300 + 10 * i, b + 400, "fwd"));
    records.push_back(kernel(b + 600, b + 650, "bwd"));
    records.push_back(kernel(b + 900, b + 1000, "bwd"));
  }
  return records;
}

}  // namespace pipefill::analysis::testing
