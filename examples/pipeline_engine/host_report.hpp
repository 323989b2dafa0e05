// The per-stage report of a filled run on the host transport: for every stage, over its bubble
// classes at least `min_factor` x the item cost long (mean over the counted iterations), the
// bubble time, the share the runtime filled (its filled_time_us: slice time inside the bubbles),
// the items per bubble-second against the same job alone on the same device, and - from the
// host timeline - where the rest of the bubble time went and why a stage falls short.
#pragma once

#include <string>
#include <vector>

#include "engine.hpp"
#include "host_timeline.hpp"

namespace engine {

// The fill job of `options` alone: one host device (PIPEFILL_HOST_SMS SM threads, all of them
// fill SMs, as in a bubble), the job's own launch callback on one never-closing ticket slice of
// `items` items; items per second of wall time (launch to the stream passing the slice).
struct AloneRate {
  uint64_t items = 0;
  double seconds = 0.0;
  double items_per_s = 0.0;
};
Status measure_alone(const EngineOptions& options, uint64_t items, AloneRate* out);

struct StageRow {
  int stage = 0;
  int long_classes = 0;            // classes >= min_factor x item cost
  double longest_class_us = 0.0;   // the longest class's mean bubble (any length)
  uint64_t bubbles = 0;
  double bubble_us = 0.0, filled_us = 0.0;
  uint64_t items = 0;
  uint64_t skipped = 0;            // bubbles of those classes without a slice
  double rate_per_bubble_s = 0.0;  // items / bubble seconds
  double ratio = 0.0;              // rate / alone rate
  double learned_cost_us = 0.0;    // the item cost the planner used at the end
  StageBreakdown breakdown;        // the same classes, from the timeline
  std::string why;                 // empty when the stage meets both goals
};

// filled: a PipeFill run on the host transport; timeline: its transport's; alone: the job alone.
std::vector<StageRow> host_stage_rows(const RunResult& filled, const HostTimeline& timeline,
                                      int first_counted_iteration, double item_cost_us,
                                      double min_factor, double alone_items_per_s);

// The table (one line per stage, then the breakdown, then the verdicts).
std::string format_host_stage_table(const std::vector<StageRow>& rows, double item_cost_us,
                                    double min_factor, const AloneRate& alone);

// Goals of issue 32 item 2 (printed with the table).
inline constexpr double kFilledGoal = 0.80;
inline constexpr double kRatioGoal = 0.80;

}  // namespace engine
