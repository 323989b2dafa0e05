#include "analysis/interference.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "common/error.hpp"

namespace pipefill::analysis {
namespace {

struct Occurrences {
  ActivityKind kind = ActivityKind::Kernel;
  std::vector<double> durations;  // in start order
};

// Main-job kernels of the device by name, each name's durations in start order.
std::map<std::string, Occurrences> main_kernels(TraceAnalyzer& analyzer, int device,
                                                size_t* count) {
  const CompactTrace& trace = analyzer.trace();
  const std::vector<uint32_t>& indices = analyzer.records_of(device);
  analyzer.count_visits(indices.size());
  std::vector<const TraceRecord*> kernels;
  for (const uint32_t i : indices) {
    const TraceRecord& r = trace.records[i];
    if (r.kind == ActivityKind::Kernel || r.kind == ActivityKind::Comm) kernels.push_back(&r);
  }
  std::stable_sort(kernels.begin(), kernels.end(), [](const TraceRecord* a, const TraceRecord* b) {
    return a->start_us < b->start_us;
  });
  std::map<std::string, Occurrences> by_name;
  for (const TraceRecord* r : kernels) {
    Occurrences& o = by_name[std::string(trace.name_of(*r))];
    o.kind = r->kind;
    o.durations.push_back(r->end_us - r->start_us);
  }
  *count = kernels.size();
  return by_name;
}

}  // namespace

pfResult_t compare_traces(const std::vector<ActivityRecord>& baseline,
                          const std::vector<ActivityRecord>& filled, int device,
                          const AnalysisOptions& options, InterferenceAnalysis* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "compare_traces: out is null");
  const CompactTrace base_trace = compact_from_activity(baseline);
  const CompactTrace filled_trace = compact_from_activity(filled);
  TraceAnalyzer base(base_trace), fill(filled_trace);
  return compare_traces(base, fill, device, options, out);
}

pfResult_t compare_traces(TraceAnalyzer& baseline, TraceAnalyzer& filled, int device,
                          const AnalysisOptions& options, InterferenceAnalysis* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "compare_traces: out is null");
  DeviceAnalysis base_analysis, filled_analysis;
  {
    const pfResult_t r = baseline.analyze(device, options, &base_analysis);
    if (r != pfSuccess) {
      return fail(r, "baseline trace: {}", std::string(last_error_message()));
    }
  }
  {
    const pfResult_t r = filled.analyze(device, options, &filled_analysis);
    if (r != pfSuccess) {
      return fail(r, "filled trace: {}", std::string(last_error_message()));
    }
  }

  InterferenceAnalysis a;
  a.device = device;
  const auto base_kernels = main_kernels(baseline, device, &a.baseline_kernels);
  const auto filled_kernels = main_kernels(filled, device, &a.filled_kernels);
  for (const auto& [name, base] : base_kernels) {
    const auto it = filled_kernels.find(name);
    if (it == filled_kernels.end()) continue;
    KernelSlowdown k;
    k.name = name;
    k.kind = base.kind;
    k.matched = std::min(base.durations.size(), it->second.durations.size());
    for (size_t i = 0; i < k.matched; ++i) {
      k.baseline_us += base.durations[i];
      k.filled_us += it->second.durations[i];
    }
    a.matched_kernels += k.matched;
    if (k.kind == ActivityKind::Comm) {
      a.comm_baseline_us += k.baseline_us;
      a.comm_filled_us += k.filled_us;
    } else {
      a.compute_baseline_us += k.baseline_us;
      a.compute_filled_us += k.filled_us;
    }
    a.kernels.push_back(std::move(k));
  }
  std::stable_sort(a.kernels.begin(), a.kernels.end(), [](const KernelSlowdown& x, const KernelSlowdown& y) {
    return x.extra_us() > y.extra_us();
  });
  if (a.compute_baseline_us > 0.0) a.compute_slowdown = a.compute_filled_us / a.compute_baseline_us;
  if (a.comm_baseline_us > 0.0) a.comm_slowdown = a.comm_filled_us / a.comm_baseline_us;

  a.baseline_start_delay = base_analysis.start_delay;
  a.filled_start_delay = filled_analysis.start_delay;
  a.baseline_iteration_us = base_analysis.mean_iteration_us;
  a.filled_iteration_us = filled_analysis.mean_iteration_us;
  if (a.baseline_iteration_us > 0.0) {
    a.iteration_slowdown = a.filled_iteration_us / a.baseline_iteration_us;
  }
  a.filled_bubble_us = filled_analysis.bubble_us;
  a.fill_in_bubbles_us = filled_analysis.fill_in_bubbles_us;

  const size_t larger = std::max(a.baseline_kernels, a.filled_kernels);
  if (larger > 0 && a.matched_kernels * 10 < larger * 9) {
    a.notes.push_back(fmt::format(
        "device {}: only {} of {} main-job kernels matched by name and order; the traces may "
        "cover different steps or the fill kernels were not recognised (--fill-stream)",
        device, a.matched_kernels, larger));
  }
  if (base_analysis.iteration_source != filled_analysis.iteration_source) {
    a.notes.push_back(fmt::format("device {}: iterations came from {} in the baseline but {} in "
                                  "the filled trace; the iteration times are not comparable",
                                  device, iteration_source_name(base_analysis.iteration_source),
                                  iteration_source_name(filled_analysis.iteration_source)));
  }
  *out = std::move(a);
  return pfSuccess;
}

}  // namespace pipefill::analysis
