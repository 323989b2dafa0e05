// Interference of filling with the main job: the same job traced without filling (baseline)
// and with it (filled), compared kernel by kernel.
//
// Main-job kernels (compute and communication; fill kernels are left out) are matched by name
// and occurrence order on the device: the i-th "gemm_x" of the baseline with the i-th "gemm_x"
// of the filled trace. Durations of matched occurrences are summed per name; the slowdown is
// filled / baseline (1.0 = unaffected).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "analysis/activity.hpp"
#include "analysis/bubbles.hpp"
#include "analysis/stats.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::analysis {

struct KernelSlowdown {
  std::string name;
  ActivityKind kind = ActivityKind::Kernel;  // Kernel or Comm
  size_t matched = 0;                        // occurrences present in both traces
  double baseline_us = 0.0;                  // summed over the matched occurrences
  double filled_us = 0.0;
  double slowdown() const { return baseline_us > 0.0 ? filled_us / baseline_us : 1.0; }
  double extra_us() const { return filled_us - baseline_us; }
};

struct InterferenceAnalysis {
  int device = 0;
  size_t baseline_kernels = 0;  // main-job kernels (compute + comm) in each trace
  size_t filled_kernels = 0;
  size_t matched_kernels = 0;
  double compute_baseline_us = 0.0;  // matched compute kernels
  double compute_filled_us = 0.0;
  double compute_slowdown = 1.0;     // filled / baseline
  double comm_baseline_us = 0.0;     // matched communication kernels (include waiting)
  double comm_filled_us = 0.0;
  double comm_slowdown = 1.0;
  std::vector<KernelSlowdown> kernels;  // by extra time, largest first
  // Main-job start delay after a bubble: from the end of the communication or copy that ended
  // the bubble to the next compute kernel's start (DeviceAnalysis::start_delay) in each trace.
  Summary baseline_start_delay;
  Summary filled_start_delay;
  // Mean iteration time of each trace (from the analysis options' iteration source).
  double baseline_iteration_us = 0.0;
  double filled_iteration_us = 0.0;
  double iteration_slowdown = 1.0;
  // Filling actually done in the filled trace.
  double filled_bubble_us = 0.0;
  double fill_in_bubbles_us = 0.0;
  std::vector<std::string> notes;
};

// Compares `device` of both record sets. Errors as analyze_device (on either trace).
pfResult_t compare_traces(const std::vector<ActivityRecord>& baseline,
                          const std::vector<ActivityRecord>& filled, int device,
                          const AnalysisOptions& options, InterferenceAnalysis* out);
// The same on analysers of both traces (reads only the device's records of each).
pfResult_t compare_traces(TraceAnalyzer& baseline, TraceAnalyzer& filled, int device,
                          const AnalysisOptions& options, InterferenceAnalysis* out);

}  // namespace pipefill::analysis
