// Stage statistics snapshots and their differences (stage_stats.hpp).
#include "stage_stats.hpp"

#include <cstring>

namespace engine {

Status take_stage_snapshot(pfRuntime_t runtime, StageSnapshot* out) {
  ENGINE_PF(pfRuntimeGetStats(runtime, &out->stats));
  size_t count = 0;
  ENGINE_PF(pfRuntimeGetClassCount(runtime, &count));
  out->classes.assign(count, pfClassStats_t{});
  for (size_t i = 0; i < count; ++i) {
    out->classes[i].size = sizeof(pfClassStats_t);
    ENGINE_PF(pfRuntimeGetClassStats(runtime, i, &out->classes[i]));
  }
  return {};
}

void summarize_stage(const StageSnapshot& before, const StageSnapshot& after,
                     StageFillSummary* summary) {
  summary->counted_bubbles = after.stats.bubbles - before.stats.bubbles;
  summary->counted_items = after.stats.items_completed - before.stats.items_completed;
  summary->counted_bubble_us = after.stats.bubble_time_us - before.stats.bubble_time_us;
  summary->counted_filled_us = after.stats.filled_time_us - before.stats.filled_time_us;
  summary->classes.clear();
  for (size_t i = 0; i < after.classes.size(); ++i) {
    // Classes are numbered in order of their first harvest and never renumbered.
    const pfClassStats_t zero{};
    const pfClassStats_t& b = i < before.classes.size() ? before.classes[i] : zero;
    const pfClassStats_t& a = after.classes[i];
    ClassSummary c;
    c.key = a.key;
    c.bubbles = a.bubbles - b.bubbles;
    c.bubbles_filled = a.bubbles_filled - b.bubbles_filled;
    c.bubble_us = a.bubble_time_us - b.bubble_time_us;
    c.filled_us = a.filled_time_us - b.filled_time_us;
    c.items = a.items_completed - b.items_completed;
    for (int k = 0; k < PF_SKIP_CAUSE_COUNT; ++k) c.skips[k] = a.skips[k] - b.skips[k];
    summary->classes.push_back(std::move(c));
  }
}

}  // namespace engine
