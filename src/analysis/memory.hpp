// Device memory in use over time, rebuilt from MemoryAlloc/MemoryFree records.
#pragma once

#include <cstdint>
#include <vector>

#include "analysis/activity.hpp"
#include "analysis/trace_data.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::analysis {

struct MemoryRange {
  bool known = false;     // false: no memory records on the device
  int64_t min_bytes = 0;  // least in use at any instant of the window
  int64_t max_bytes = 0;  // most in use at any instant of the window
};

// A step function: bytes in use after each memory event of one device.
//
// Levels come from producer-given absolute values where a record has in_use_bytes >= 0 (PyTorch
// "Total Allocated"); between those, and when there are none, allocation sizes are summed.
// Without any absolute value the level before the first event is unknown: it is taken as the
// smallest value that keeps every level >= 0, so levels are then lower bounds (absolute() false).
class MemoryTimeline {
 public:
  // Memory records of `device` among `records`; values that would overflow (see below) leave
  // the timeline empty.
  static MemoryTimeline build(const std::vector<ActivityRecord>& records, int device);
  // The memory records among trace.records[i] for i in `indices`. pfErrorInvalidArgument naming
  // the record and the value when a size or level exceeds 2^53 bytes or the running level
  // overflows int64 (checked arithmetic: traces are input).
  static pfResult_t build(const CompactTrace& trace, const std::vector<uint32_t>& indices,
                          MemoryTimeline* out);

  bool empty() const { return times_.empty(); }
  bool absolute() const { return absolute_; }
  size_t event_count() const { return times_.size(); }
  int64_t initial_bytes() const { return initial_; }
  int64_t peak_bytes() const;
  // Bytes in use at `time_us` (after every event at or before it).
  int64_t level_at(double time_us) const;
  // Least and most in use at any instant of [start_us, end_us].
  MemoryRange range(double start_us, double end_us) const;

 private:
  std::vector<double> times_;    // ascending
  std::vector<int64_t> levels_;  // in use right after the event at the same index
  int64_t initial_ = 0;          // in use before the first event
  bool absolute_ = false;
};

}  // namespace pipefill::analysis
