#include "analysis/memory.hpp"

#include <algorithm>
#include <numeric>

namespace pipefill::analysis {

MemoryTimeline MemoryTimeline::build(const std::vector<ActivityRecord>& records, int device) {
  struct Step {
    double time_us;
    int64_t delta;
    int64_t absolute;  // -1: not known
  };
  std::vector<Step> steps;
  for (const ActivityRecord& r : records) {
    if (r.device != device) continue;
    if (r.kind != ActivityKind::MemoryAlloc && r.kind != ActivityKind::MemoryFree) continue;
    const int64_t size = static_cast<int64_t>(r.bytes);
    steps.push_back({r.start_us, r.kind == ActivityKind::MemoryAlloc ? size : -size,
                     r.in_use_bytes});
  }
  // Stable: events at the same instant keep the producer's order.
  std::stable_sort(steps.begin(), steps.end(),
                   [](const Step& a, const Step& b) { return a.time_us < b.time_us; });

  MemoryTimeline timeline;
  if (steps.empty()) return timeline;

  // Level before the first event: anchored by the first absolute value when there is one,
  // else the least value keeping every level non-negative.
  const auto first_absolute = std::find_if(steps.begin(), steps.end(),
                                           [](const Step& s) { return s.absolute >= 0; });
  int64_t initial = 0;
  if (first_absolute != steps.end()) {
    timeline.absolute_ = true;
    int64_t deltas = 0;
    for (auto it = steps.begin(); it != first_absolute + 1; ++it) deltas += it->delta;
    initial = std::max<int64_t>(0, first_absolute->absolute - deltas);
  } else {
    int64_t level = 0;
    int64_t lowest = 0;
    for (const Step& s : steps) {
      level += s.delta;
      lowest = std::min(lowest, level);
    }
    initial = -lowest;
  }

  timeline.initial_ = initial;
  timeline.times_.reserve(steps.size());
  timeline.levels_.reserve(steps.size());
  int64_t level = initial;
  for (const Step& s : steps) {
    level = s.absolute >= 0 ? s.absolute : std::max<int64_t>(0, level + s.delta);
    timeline.times_.push_back(s.time_us);
    timeline.levels_.push_back(level);
  }
  return timeline;
}

int64_t MemoryTimeline::peak_bytes() const {
  if (levels_.empty()) return initial_;
  return std::max(initial_, *std::max_element(levels_.begin(), levels_.end()));
}

int64_t MemoryTimeline::level_at(double time_us) const {
  const auto after = std::upper_bound(times_.begin(), times_.end(), time_us);
  if (after == times_.begin()) return initial_;
  return levels_[static_cast<size_t>(after - times_.begin()) - 1];
}

MemoryRange MemoryTimeline::range(double start_us, double end_us) const {
  MemoryRange r;
  if (times_.empty()) return r;
  r.known = true;
  r.min_bytes = r.max_bytes = level_at(start_us);
  auto it = std::upper_bound(times_.begin(), times_.end(), start_us);
  for (; it != times_.end() && *it <= end_us; ++it) {
    const int64_t level = levels_[static_cast<size_t>(it - times_.begin())];
    r.min_bytes = std::min(r.min_bytes, level);
    r.max_bytes = std::max(r.max_bytes, level);
  }
  return r;
}

}  // namespace pipefill::analysis
