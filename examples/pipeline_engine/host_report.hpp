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

// The fill job of `options` alone: on each of `devices` host devices at once (PIPEFILL_HOST_SMS
// SM threads each, all of them fill SMs, as in a bubble), the job's own launch callback on one
// never-closing ticket slice of `items` items; items per second of wall time per device (launch
// to its stream passing the slice, averaged over the devices).
//
// Why `devices`: the host transport's stages are host devices sharing this machine's cores, as
// the stages of a real pipeline do not share their GPUs. With one device alone, the ratio would
// also count the other stages' fill competing for the cores; with every stage's job alone at
// once, only what PipeFill's bubbles cost. Reports print both.
struct AloneRate {
  int devices = 1;
  uint64_t items = 0;
  double seconds = 0.0;
  double items_per_s = 0.0;
};
Status measure_alone(const EngineOptions& options, uint64_t items, int devices, AloneRate* out);
// Items for measure_alone: about 0.15 s of the device's SM threads at the nominal item cost.
uint64_t host_alone_items(double item_cost_us);

struct StageRow {
  int stage = 0;
  int long_classes = 0;            // classes >= min_factor x item cost
  double longest_class_us = 0.0;   // the longest class's mean bubble (any length)
  uint64_t bubbles = 0;
  double bubble_us = 0.0, filled_us = 0.0;
  uint64_t items = 0;
  uint64_t skipped = 0;            // bubbles of those classes without a slice
  double rate_per_bubble_s = 0.0;  // items / bubble seconds
  double ratio = 0.0;              // rate / alone rate (every stage's job alone at once)
  double ratio_single = 0.0;       // rate / one device's job alone
  double learned_cost_us = 0.0;    // the item cost the planner used at the end
  StageBreakdown breakdown;        // the same classes, from the timeline
  std::string why;                 // empty when the stage meets both goals
};

// filled: a PipeFill run on the host transport; timeline: its transport's; alone: the job
// alone on every stage's device at once (the ratio) and on one device (ratio_single).
std::vector<StageRow> host_stage_rows(const RunResult& filled, const HostTimeline& timeline,
                                      int first_counted_iteration, double item_cost_us,
                                      double min_factor, const AloneRate& alone,
                                      const AloneRate& alone_single);

// The table (one line per stage, then the breakdown).
std::string format_host_stage_table(const std::vector<StageRow>& rows, double item_cost_us,
                                    double min_factor, const AloneRate& alone,
                                    const AloneRate& alone_single);

// Goals of issue 32 item 2 (printed with the table).
inline constexpr double kFilledGoal = 0.80;
inline constexpr double kRatioGoal = 0.80;

}  // namespace engine
