// The analyser's report: text tables for people, JSON for scripts.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "analysis/bubbles.hpp"
#include "analysis/interference.hpp"

namespace pipefill::analysis {

struct TraceReport {
  std::string source;           // the analysed (possibly filled) trace
  int rank = -1;                // the trace's rank (distributedInfo, file name), -1 unknown
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
// The same on compact traces; `devices` empty: every analysable device. Device memory comes
// from trace.device_memory_bytes where options.device_memory_bytes is 0. The cost is linear
// in the records of both traces, however many devices they hold.
pfResult_t build_report(const CompactTrace& trace, const CompactTrace* baseline,
                        const std::vector<int>& devices, const AnalysisOptions& options,
                        TraceReport* out);

// Renumbers devices of `trace` (e.g. a baseline traced on device 3 compared with device 0):
// every record of device `from` becomes device `to`, for each (from, to). pfErrorInvalidArgument
// when `from` has no records or `to` already has records that are not remapped away.
pfResult_t remap_devices(const std::vector<std::pair<int, int>>& mapping, CompactTrace* trace);

// Human-readable tables; at most `max_class_rows` bubble classes and `max_kernel_rows` kernels
// per device, and the first `max_bubble_rows` bubbles of each device, iteration by iteration.
std::string format_report(const TraceReport& report, size_t max_class_rows = 32,
                          size_t max_kernel_rows = 10, size_t max_bubble_rows = 0);

// Everything, including every bubble (times in us, memory in bytes).
nlohmann::json report_to_json(const TraceReport& report);

// Several ranks of one job (a folder of rank traces): bubble share per rank and across ranks.
struct CrossRankSummary {
  size_t ranks = 0;    // traces
  size_t devices = 0;  // analysed devices over all ranks (rows)
  double share_min = 0.0, share_median = 0.0, share_mean = 0.0, share_max = 0.0;
  int rank_min = -1, rank_max = -1;  // the ranks with the least / most bubble share
  double bubble_us = 0.0;            // summed over every row
  double span_us = 0.0;
  double idle_us = 0.0, comm_only_us = 0.0, copy_us = 0.0;
  double overall_share = 0.0;  // bubble_us / span_us
  double iteration_min_us = 0.0, iteration_max_us = 0.0;  // mean iteration time per row
};
CrossRankSummary summarize_ranks(const std::vector<TraceReport>& reports);
// One row per rank and device, then the cross-rank summary.
std::string format_ranks(const std::vector<TraceReport>& reports, const CrossRankSummary& summary);
nlohmann::json ranks_to_json(const std::vector<TraceReport>& reports,
                             const CrossRankSummary& summary);

// The rank a trace file name carries: the integer after "rank" in its base name (any case,
// "rank-3.json.gz", "trace_rank_12_step_3.json"), else its last integer ("worker7.pt.trace.json"),
// else -1.
int rank_from_file_name(const std::string& path);

}  // namespace pipefill::analysis
