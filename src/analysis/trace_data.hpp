// Compact trace records: what the trace importers produce and the analyser reads. One record is
// 80 bytes and names are interned, so a multi-GB Kineto trace fits in a fraction of its size
// (most of a trace is CPU ops, which leave no record at all).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "analysis/activity.hpp"

namespace pipefill::analysis {

// Interned strings: each distinct name is stored once; records hold its id.
class NameTable {
 public:
  NameTable() = default;
  NameTable(const NameTable& other);  // re-interns: the views must point into its own storage
  NameTable& operator=(const NameTable& other);
  NameTable(NameTable&&) noexcept = default;  // moving a deque keeps its elements in place
  NameTable& operator=(NameTable&&) noexcept = default;

  uint32_t intern(std::string_view name);
  std::string_view name(uint32_t id) const { return views_[id]; }
  size_t size() const { return views_.size(); }
  size_t heap_bytes() const;  // an estimate, for the benchmark's accounting

 private:
  std::deque<std::string> storage_;  // stable addresses: views_ and index_ point into it
  std::vector<std::string_view> views_;
  std::unordered_map<std::string_view, uint32_t> index_;
};

struct TraceRecord {
  double start_us = 0.0;
  double end_us = 0.0;
  uint64_t stream = 0;
  uint64_t bytes = 0;
  uint64_t correlation = 0;
  int64_t in_use_bytes = -1;  // memory records: absolute level when the producer gave it
  int64_t process = -1;       // see ActivityRecord::process
  uint64_t event_index = 0;   // position of the event in the trace (for messages)
  uint32_t name = 0;          // NameTable id
  int32_t device = 0;
  int32_t grid_blocks = 0;
  ActivityKind kind = ActivityKind::Kernel;
};

struct CompactTrace {
  std::string source;  // file name, "-" for stdin, or a given name
  NameTable names;
  std::vector<TraceRecord> records;  // in trace order
  size_t events_total = 0;           // entries of traceEvents
  size_t events_skipped = 0;         // not device activity (CPU ops, runtime calls, metadata)
  // Device memory by device id from PyTorch's "deviceProperties" ("id", "totalGlobalMem").
  std::map<int, uint64_t> device_memory_bytes;
  int rank = -1;  // "distributedInfo": {"rank": N}, -1 when absent
  // true: event_index is the index in the file's traceEvents; false: a position in a record list.
  bool indexed_by_event = true;

  std::string_view name_of(const TraceRecord& r) const { return names.name(r.name); }
  // "traceEvents[12]" or "record 12": how messages point at a record.
  std::string where(const TraceRecord& r) const;
  // Devices with at least one non-host record, ascending.
  std::vector<int> devices() const;
  size_t heap_bytes() const;  // records + names, an estimate
};

// Conversions for the ActivityRecord API (CUPTI, the simulator, tests).
CompactTrace compact_from_activity(const std::vector<ActivityRecord>& records,
                                   std::string source = "");
std::vector<ActivityRecord> activity_from_compact(const CompactTrace& trace);

}  // namespace pipefill::analysis
