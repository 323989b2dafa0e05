// The analyser's report: text tables for people, JSON for scripts.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "analysis/bubbles.hpp"
#include "analysis/interference.hpp"

namespace pipefill::analysis {

struct TraceReport {
  std::string source;           // the analysed (possibly filled) trace
  size_t record_count = 0;
  std::string baseline_source;  // empty: no interference section
  AnalysisOptions options;
  std::vector<DeviceAnalysis> devices;
  std::vector<uint64_t> device_memory_bytes;  // per entry of `devices` (0: unknown)
  std::vector<InterferenceAnalysis> interference;  // one per device, when a baseline is given
};

// Analyses every listed device (and compares with the baseline when `baseline` is non-null).
// When options.device_memory_bytes is 0, a device's memory is taken from `device_memory` (e.g.
// ImportedTrace::device_memory_bytes) where it has an entry.
pfResult_t build_report(const std::string& source, const std::vector<ActivityRecord>& records,
                        const std::string& baseline_source,
                        const std::vector<ActivityRecord>* baseline, const std::vector<int>& devices,
                        const AnalysisOptions& options, TraceReport* out,
                        const std::map<int, uint64_t>& device_memory = {});

// Human-readable tables; at most `max_class_rows` bubble classes and `max_kernel_rows` kernels
// per device, and the first `max_bubble_rows` bubbles of each device, iteration by iteration.
std::string format_report(const TraceReport& report, size_t max_class_rows = 32,
                          size_t max_kernel_rows = 10, size_t max_bubble_rows = 0);

// Everything, including every bubble (times in us, memory in bytes).
nlohmann::json report_to_json(const TraceReport& report);

}  // namespace pipefill::analysis
