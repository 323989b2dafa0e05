// Bubble finding in an unmodified (or filled) job's trace, per device: gaps in compute, what
// filled their time (idle / comm-only / copy), iterations, bubble classes, memory during
// bubbles and "what would filling give". Everything is computed from trace records (compact
// TraceRecords, or ActivityRecords converted to them), so it runs the same on CUPTI records,
// simulated device records and imported PyTorch profiler traces. The cost is linear in the
// records (plus sorting) however many devices the trace has: records are grouped by device and
// host step markers by process once per trace (TraceAnalyzer).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "analysis/activity.hpp"
#include "analysis/memory.hpp"
#include "analysis/stats.hpp"
#include "analysis/trace_data.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::analysis {

struct AnalysisOptions {
  // Gaps in compute shorter than this are launch gaps, not bubbles.
  double min_gap_us = 50.0;
  // Iterations, first that applies: a fixed period (> 0) starting at iteration_origin_us (NaN:
  // the first compute kernel); markers whose name starts with iteration_marker (GPU-side ones on
  // the device unless they end before their step's kernels, else the host-side ones of the
  // process that launched the device's kernels); otherwise the whole trace is one iteration.
  double iteration_period_us = 0.0;
  // Bound on the iterations a period makes of a trace (span / period, work the input sets, not
  // the trace's size): more is refused naming --max-iterations (pipefill-analyze).
  uint64_t max_iterations = 1'000'000;
  double iteration_origin_us = std::numeric_limits<double>::quiet_NaN();
  std::string iteration_marker = "ProfilerStep";
  bool iteration_marker_required = false;  // true: no such marker is an error, not a fallback
  // Memory of the device (0: unknown), for free memory per bubble class.
  uint64_t device_memory_bytes = 0;
  // Fill estimate, mirroring the runtime: the class's duration at `quantile` (nearest rank),
  // minus safety_margin_fraction of it, minus safety_margin_us.
  double quantile = 0.1;
  double safety_margin_us = 20.0;
  double safety_margin_fraction = 0.05;
  // A fill job to estimate for (item_cost_us 0: time only). item_cost_us is the time of one
  // item; item_parallelism items run at once; each needs item_memory_bytes of bubble memory.
  double item_cost_us = 0.0;
  int item_parallelism = 1;
  uint64_t item_memory_bytes = 0;
};

// pfErrorInvalidArgument naming the first bad field.
pfResult_t validate_options(const AnalysisOptions& options);

// What the main job's device did during (part of) a bubble. A bubble's time splits into the
// three; the bubble is labelled by the largest share (ties: idle, then comm-only).
enum class BubbleKind {
  Idle,      // nothing of the main job runs
  CommOnly,  // only communication kernels run (e.g. a spinning NCCL recv)
  Copy       // copies or memsets run (with or without communication)
};
const char* bubble_kind_name(BubbleKind kind);

struct Bubble {
  double start_us = 0.0;  // end of the last compute kernel before it
  double end_us = 0.0;    // start of the next compute kernel
  double duration_us() const { return end_us - start_us; }
  BubbleKind kind = BubbleKind::Idle;  // the largest of the three shares below
  // The bubble's time split: idle_us + comm_only_us + copy_us == duration_us().
  double idle_us = 0.0;       // no communication, copy or memset of the main job runs
  double comm_only_us = 0.0;  // communication kernels run, no copy
  double copy_us = 0.0;       // memcpy/memset run (with or without communication)
  double comm_us = 0.0;  // time covered by communication kernels (overlapping copies included)
  double fill_us = 0.0;  // ... by fill kernels (a filled trace)
  double share(BubbleKind k) const;  // of duration_us(); 0 for an empty bubble
  // End of the last communication or copy that finished inside the bubble: what released the
  // next compute kernel. NaN when none did.
  double wake_us = std::numeric_limits<double>::quiet_NaN();
  // end_us - wake_us, the main job's start delay after the transfer it waited for: defined
  // (finite) only when the bubble is labelled comm-only or copy, i.e. the device spent most of
  // it waiting on a transfer, and that transfer ended inside it. NaN otherwise: an idle bubble
  // was not waiting on the copy or kernel that happened to end in it.
  double start_delay_us = std::numeric_limits<double>::quiet_NaN();
  int iteration = -1;     // index into DeviceAnalysis::iterations; -1: outside every iteration
  int class_index = -1;   // k: the k-th bubble of its iteration
  double offset_us = 0.0; // start - start of its iteration
  MemoryRange memory;     // bytes in use during the bubble
};

enum class IterationSource { WholeTrace, Period, Markers };
const char* iteration_source_name(IterationSource source);

struct Iteration {
  std::string label;  // marker name, "period#k" or "trace"
  double start_us = 0.0;
  double end_us = 0.0;
  double duration_us() const { return end_us - start_us; }
  int bubble_count = 0;
  double bubble_us = 0.0;
};

struct BubbleClass {
  int index = 0;          // k
  std::string label;      // "#k", or the class key of PipeFill bubble markers
  Summary duration;       // over the iterations that have a k-th bubble
  Summary offset;         // start relative to the iteration start
  size_t idle = 0;        // occurrences by label
  size_t comm_only = 0;
  size_t copy = 0;
  double idle_us = 0.0;   // time shares summed over the occurrences
  double comm_only_us = 0.0;
  double copy_us = 0.0;
  BubbleKind kind() const;  // by the largest summed share
  MemoryRange memory;     // in use during any occurrence
  double fill_us = 0.0;   // fill kernels' coverage of its occurrences (a filled trace)
  int64_t free_bytes = -1;  // device memory - peak in use; -1 when either is unknown
  double occurrence = 0.0;  // occurrences per iteration
  double predicted_us = 0.0;  // nearest-rank quantile of the duration (the runtime's view)
  double usable_us = 0.0;     // predicted minus the safety margins, >= 0
  int item_slots = 0;         // items that may run at once (parallelism, capped by memory)
  double items_per_occurrence = 0.0;
};

struct FillEstimate {
  double fillable_us_per_iteration = 0.0;  // sum of usable_us x occurrence
  double fillable_share = 0.0;             // of the mean iteration time
  double fill_efficiency = 0.0;            // fillable / bubble time per iteration
  bool items_estimated = false;            // an item cost was given
  double items_per_iteration = 0.0;
  double items_per_second = 0.0;
  double dedicated_gpu_share = 0.0;  // items x cost / (parallelism x iteration time)
};

struct DeviceAnalysis {
  int device = 0;
  // true: the device has no compute kernels but PipeFill bubble markers (a pfTraceWrite trace);
  // the markers are the bubbles, classes are their class keys, span = first to last bubble.
  bool explicit_bubbles = false;
  double span_start_us = 0.0;  // first compute kernel start
  double span_end_us = 0.0;    // last compute kernel end
  double span_us() const { return span_end_us - span_start_us; }
  size_t compute_kernels = 0;
  size_t comm_kernels = 0;
  size_t fill_kernels = 0;
  double compute_busy_us = 0.0;  // union of compute kernels
  double bubble_us = 0.0;        // all bubbles >= min_gap_us
  double idle_bubble_us = 0.0;   // ... split by what ran (sums of the bubbles' shares)
  double comm_only_bubble_us = 0.0;
  double copy_bubble_us = 0.0;
  size_t idle_bubbles = 0;       // bubbles by label
  size_t comm_only_bubbles = 0;
  size_t copy_bubbles = 0;
  double fill_in_bubbles_us = 0.0;  // fill kernels' coverage of the bubbles
  double fill_busy_us = 0.0;        // union of fill kernels within the span (explicit: all)
  double fill_outside_bubbles_us = 0.0;  // fill running while the main job computes (overrun)
  double bubble_share = 0.0;        // bubble_us / span_us
  Summary start_delay;              // over the bubbles where it is defined (Bubble)
  // The host process (pid) that launched most of the device's compute kernels; -1 unknown.
  int64_t process = -1;

  IterationSource iteration_source = IterationSource::WholeTrace;
  bool host_markers = false;  // the iterations come from host-side markers
  std::vector<Iteration> iterations;
  double mean_iteration_us = 0.0;
  double bubble_us_per_iteration = 0.0;  // bubbles inside iterations / iteration count
  double iteration_bubble_share = 0.0;   // bubbles inside iterations / iteration time

  std::vector<Bubble> bubbles;  // ascending
  std::vector<BubbleClass> classes;

  bool memory_known = false;
  bool memory_absolute = false;  // false: levels are lower bounds (see MemoryTimeline)
  int64_t memory_peak_bytes = 0;

  FillEstimate fill;
  std::vector<std::string> notes;  // caveats worth printing
};

// Devices that ran at least one compute kernel, ascending.
std::vector<int> devices_with_compute(const std::vector<ActivityRecord>& records);
// Devices analyse_device accepts: with compute kernels or PipeFill bubble markers, ascending.
std::vector<int> analysable_devices(const std::vector<ActivityRecord>& records);
std::vector<int> analysable_devices(const CompactTrace& trace);

// The analysis of every device of one trace. Records are grouped by device, and host step
// markers by process, once; each device's analysis then reads only its own records (and the
// steps that overlap it), so analysing all devices costs O(records) plus sorting.
class TraceAnalyzer {
 public:
  explicit TraceAnalyzer(const CompactTrace& trace);
  ~TraceAnalyzer();
  TraceAnalyzer(const TraceAnalyzer&) = delete;
  TraceAnalyzer& operator=(const TraceAnalyzer&) = delete;

  // Devices with compute kernels or PipeFill bubble markers, ascending.
  const std::vector<int>& analysable_devices() const;
  // Analyses one device. pfErrorInvalidArgument for bad options, a record with end < start or
  // an absurd byte count (named by its event index and value), a device without compute
  // kernels or bubble markers, or a required marker that is not there.
  pfResult_t analyze(int device, const AnalysisOptions& options, DeviceAnalysis* out);
  // Indices into trace.records of the device's records, in trace order (empty when none).
  const std::vector<uint32_t>& records_of(int device) const;
  const CompactTrace& trace() const;
  // Records read so far (grouping included): the complexity test's operation count.
  size_t records_visited() const;
  void count_visits(size_t n);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// One device of a trace (or of a list of ActivityRecords, converted first).
pfResult_t analyze_device(const CompactTrace& trace, int device, const AnalysisOptions& options,
                          DeviceAnalysis* out);
pfResult_t analyze_device(const std::vector<ActivityRecord>& records, int device,
                          const AnalysisOptions& options, DeviceAnalysis* out);

}  // namespace pipefill::analysis
