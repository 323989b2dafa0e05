#include "analysis/trace_data.hpp"

#include <set>

#include <fmt/format.h>

namespace pipefill::analysis {

NameTable::NameTable(const NameTable& other) {
  for (const std::string_view name : other.views_) intern(name);
}

NameTable& NameTable::operator=(const NameTable& other) {
  if (this != &other) {
    NameTable copy(other);
    *this = std::move(copy);
  }
  return *this;
}

uint32_t NameTable::intern(std::string_view name) {
  const auto it = index_.find(name);
  if (it != index_.end()) return it->second;
  const std::string& stored = storage_.emplace_back(name);
  const auto id = static_cast<uint32_t>(views_.size());
  views_.push_back(stored);
  index_.emplace(views_.back(), id);
  return id;
}

size_t NameTable::heap_bytes() const {
  size_t bytes = views_.capacity() * sizeof(std::string_view) +
                 index_.size() * (sizeof(std::string_view) + sizeof(uint32_t) + 2 * sizeof(void*)) +
                 storage_.size() * sizeof(std::string);
  for (const std::string& s : storage_) bytes += s.capacity() > 15 ? s.capacity() + 1 : 0;
  return bytes;
}

std::string CompactTrace::where(const TraceRecord& r) const {
  return indexed_by_event ? fmt::format("traceEvents[{}]", r.event_index)
                          : fmt::format("record {}", r.event_index);
}

std::vector<int> CompactTrace::devices() const {
  std::set<int> devices;
  for (const TraceRecord& r : records) {
    if (r.device != kHostDevice) devices.insert(r.device);
  }
  return {devices.begin(), devices.end()};
}

size_t CompactTrace::heap_bytes() const {
  return records.capacity() * sizeof(TraceRecord) + names.heap_bytes();
}

CompactTrace compact_from_activity(const std::vector<ActivityRecord>& records, std::string source) {
  CompactTrace trace;
  trace.source = std::move(source);
  trace.indexed_by_event = false;
  trace.events_total = records.size();
  trace.records.reserve(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    const ActivityRecord& a = records[i];
    TraceRecord r;
    r.kind = a.kind;
    r.name = trace.names.intern(a.name);
    r.device = a.device;
    r.stream = a.stream;
    r.start_us = a.start_us;
    r.end_us = a.end_us;
    r.bytes = a.bytes;
    r.correlation = a.correlation;
    r.grid_blocks = a.grid_blocks;
    r.in_use_bytes = a.in_use_bytes;
    r.process = a.process;
    r.event_index = i;
    trace.records.push_back(r);
  }
  return trace;
}

std::vector<ActivityRecord> activity_from_compact(const CompactTrace& trace) {
  std::vector<ActivityRecord> out;
  out.reserve(trace.records.size());
  for (const TraceRecord& r : trace.records) {
    ActivityRecord a;
    a.kind = r.kind;
    a.name = std::string(trace.name_of(r));
    a.device = r.device;
    a.stream = r.stream;
    a.start_us = r.start_us;
    a.end_us = r.end_us;
    a.bytes = r.bytes;
    a.correlation = r.correlation;
    a.grid_blocks = r.grid_blocks;
    a.in_use_bytes = r.in_use_bytes;
    a.process = r.process;
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace pipefill::analysis
