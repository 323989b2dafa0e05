#include "analysis/memory.hpp"

#include <algorithm>
#include <numeric>

#include "common/error.hpp"

namespace pipefill::analysis {
namespace {

struct Step {
  double time_us;
  int64_t delta;
  int64_t absolute;  // -1: not known
  size_t record;     // for messages
};

constexpr int64_t kMaxBytes = int64_t{1} << 53;

// Builds the step function from `steps` (any order). Errors name `where(record)`.
template <typename Where>
pfResult_t build_from_steps(std::vector<Step> steps, const Where& where, std::vector<double>* times, std::vector<int64_t>* levels,
                            int64_t* initial_out, bool* absolute_out) {
  // Stable: events at the same instant keep the producer's order.
  std::stable_sort(steps.begin(), steps.end(),
                   [](const Step& a, const Step& b) { return a.time_us < b.time_us; });
  if (steps.empty()) return pfSuccess;

  auto add = [&](int64_t a, int64_t b, const Step& s, int64_t* sum) -> pfResult_t {
    if (__builtin_add_overflow(a, b, sum)) {
      return fail(pfErrorInvalidArgument,
                  "{}: the memory level overflows 64 bits ({} + {} bytes); the trace's byte "
                  "counts are not credible",
                  where(s.record), a, b);
    }
    return pfSuccess;
  };

  // Level before the first event: anchored by the first absolute value when there is one,
  // else the least value keeping every level non-negative.
  const auto first_absolute = std::find_if(steps.begin(), steps.end(),
                                           [](const Step& s) { return s.absolute >= 0; });
  int64_t initial = 0;
  if (first_absolute != steps.end()) {
    *absolute_out = true;
    int64_t deltas = 0;
    for (auto it = steps.begin(); it != first_absolute + 1; ++it) {
      PF_TRY(add(deltas, it->delta, *it, &deltas));
    }
    int64_t anchored = 0;
    if (__builtin_sub_overflow(first_absolute->absolute, deltas, &anchored)) {
      return fail(pfErrorInvalidArgument, "{}: the memory level overflows 64 bits",
                  where(first_absolute->record));
    }
    initial = std::max<int64_t>(0, anchored);
  } else {
    int64_t level = 0;
    int64_t lowest = 0;
    for (const Step& s : steps) {
      PF_TRY(add(level, s.delta, s, &level));
      lowest = std::min(lowest, level);
    }
    if (lowest == INT64_MIN) {
      return fail(pfErrorInvalidArgument, "{}: the memory level overflows 64 bits",
                  where(steps.front().record));
    }
    initial = -lowest;
  }

  *initial_out = initial;
  times->reserve(steps.size());
  levels->reserve(steps.size());
  int64_t level = initial;
  for (const Step& s : steps) {
    if (s.absolute >= 0) {
      level = s.absolute;
    } else {
      PF_TRY(add(level, s.delta, s, &level));
      level = std::max<int64_t>(0, level);
    }
    times->push_back(s.time_us);
    levels->push_back(level);
  }
  return pfSuccess;
}

}  // namespace

MemoryTimeline MemoryTimeline::build(const std::vector<ActivityRecord>& records, int device) {
  std::vector<uint32_t> indices;
  for (size_t i = 0; i < records.size(); ++i) {
    if (records[i].device == device) indices.push_back(static_cast<uint32_t>(i));
  }
  MemoryTimeline timeline;
  const CompactTrace trace = compact_from_activity(records);
  // A failure here just means "no usable memory records" (analyze_device reports it).
  if (build(trace, indices, &timeline) != pfSuccess) return MemoryTimeline{};
  return timeline;
}

pfResult_t MemoryTimeline::build(const CompactTrace& trace, const std::vector<uint32_t>& indices,
                                 MemoryTimeline* out) {
  std::vector<Step> steps;
  for (const uint32_t i : indices) {
    const TraceRecord& r = trace.records[i];
    if (r.kind != ActivityKind::MemoryAlloc && r.kind != ActivityKind::MemoryFree) continue;
    if (r.bytes > static_cast<uint64_t>(kMaxBytes) || r.in_use_bytes > kMaxBytes) {
      return fail(pfErrorInvalidArgument,
                  "{}{} ('{}' on device {}): {} bytes exceed 2^53 (8 PiB)",
                  trace.source.empty() ? std::string() : trace.source + ": ", trace.where(r), trace.name_of(r), r.device,
                  r.bytes > static_cast<uint64_t>(kMaxBytes) ? static_cast<double>(r.bytes)
                                                             : static_cast<double>(r.in_use_bytes));
    }
    const int64_t size = static_cast<int64_t>(r.bytes);
    steps.push_back({r.start_us, r.kind == ActivityKind::MemoryAlloc ? size : -size,
                     r.in_use_bytes, i});
  }
  MemoryTimeline timeline;
  auto where = [&](size_t record) {
    return fmt::format("{}{}", trace.source.empty() ? std::string() : trace.source + ": ",
                       trace.where(trace.records[record]));
  };
  PF_TRY(build_from_steps(std::move(steps), where, &timeline.times_, &timeline.levels_,
                          &timeline.initial_, &timeline.absolute_));
  *out = std::move(timeline);
  return pfSuccess;
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
