// Conversion of CUPTI activity records into device-agnostic pipefill::ActivityRecord, kept apart
// from the collector (as Kineto does) so it is unit-tested on CPU from constructed record
// structs. Record layouts follow the CUPTI headers of the toolkit we build with (CUDA 13:
// CUpti_ActivityKernel10, CUpti_ActivityMemcpy6, CUpti_ActivityMemset4, CUpti_ActivityMemory4);
// a new toolkit that bumps a struct version needs the matching type here.
#pragma once

#include <cupti.h>

#include <cstddef>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "analysis/activity.hpp"

namespace pipefill::cuda {

// Maps CUPTI timestamps (ns) onto the device clock of the event timings (µs): a CUPTI time
// `cupti_ns` taken at the same moment as device time `device_us`.
struct ClockAlignment {
  uint64_t cupti_ns = 0;
  double device_us = 0.0;
  double to_device_us(uint64_t ns) const {
    return device_us + (static_cast<double>(ns) - static_cast<double>(cupti_ns)) / 1000.0;
  }
};

using CuptiKernelRecord = CUpti_ActivityKernel10;
using CuptiMemcpyRecord = CUpti_ActivityMemcpy6;
using CuptiMemsetRecord = CUpti_ActivityMemset4;
using CuptiMemoryRecord = CUpti_ActivityMemory4;

class ActivityConverter {
 public:
  explicit ActivityConverter(ClockAlignment clock = {}) : clock_(clock) {}

  void set_clock(ClockAlignment clock) { clock_ = clock; }
  // Kernels on this (CUPTI context id, CUPTI stream id) are PipeFill's fill work
  // (ActivityKind::Fill). Stream ids are only unique within a context: the fill stream lives in
  // a green context, and the main job's streams in the primary context can carry the same id.
  void add_fill_stream(uint32_t cupti_context_id, uint32_t cupti_stream_id) {
    fill_streams_.insert({cupti_context_id, cupti_stream_id});
  }
  bool is_fill_stream(uint32_t cupti_context_id, uint32_t cupti_stream_id) const {
    return fill_streams_.count({cupti_context_id, cupti_stream_id}) > 0;
  }

  // Converts one record. false (and *out untouched) for kinds PipeFill does not use or
  // malformed records (end before start, null name).
  bool convert(const CUpti_Activity& record, ActivityRecord* out) const;

  // Typed conversions (what convert() dispatches to).
  ActivityRecord from_kernel(const CuptiKernelRecord& kernel) const;
  ActivityRecord from_memcpy(const CuptiMemcpyRecord& copy) const;
  ActivityRecord from_memset(const CuptiMemsetRecord& set) const;
  // false for operation types other than allocation/release.
  bool from_memory(const CuptiMemoryRecord& memory, ActivityRecord* out) const;

 private:
  ClockAlignment clock_;
  std::set<std::pair<uint32_t, uint32_t>> fill_streams_;  // (context id, stream id)
};

// "Memcpy HtoD" etc., for a CUpti_ActivityMemcpyKind value.
const char* memcpy_kind_name(uint8_t copy_kind);

}  // namespace pipefill::cuda
