// The host transport's per-bubble moments and their breakdown (host_timeline.hpp).
#include "host_timeline.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace engine {

namespace {
void store_min(std::atomic<double>& slot, double value) {
  double seen = slot.load(std::memory_order_relaxed);
  while ((seen < 0 || value < seen) &&
         !slot.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}
void store_max(std::atomic<double>& slot, double value) {
  double seen = slot.load(std::memory_order_relaxed);
  while (value > seen && !slot.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}
}  // namespace

HostTimeline::HostTimeline(int stages, size_t capacity)
    : origin_(std::chrono::steady_clock::now()),
      capacity_(capacity),
      stages_(static_cast<size_t>(stages)) {
  for (StageMoments& s : stages_) s.bubbles = std::make_unique<BubbleMoments[]>(capacity);
}

double HostTimeline::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_)
      .count();
}

BubbleMoments* HostTimeline::at(int stage, uint64_t bubble_id) {
  if (stage < 0 || static_cast<size_t>(stage) >= stages_.size()) return nullptr;
  if (bubble_id == 0 || bubble_id > capacity_) return nullptr;
  return &stages_[static_cast<size_t>(stage)].bubbles[bubble_id - 1];
}

void HostTimeline::set_running(int stage, uint64_t bubble_id) {
  if (stage < 0 || static_cast<size_t>(stage) >= stages_.size()) return;
  stages_[static_cast<size_t>(stage)].running.store(bubble_id, std::memory_order_relaxed);
}

void HostTimeline::item_done(int stage) {
  if (stage < 0 || static_cast<size_t>(stage) >= stages_.size()) return;
  const uint64_t id = stages_[static_cast<size_t>(stage)].running.load(std::memory_order_relaxed);
  BubbleMoments* b = at(stage, id);
  if (b == nullptr) return;
  const double now = now_us();
  store_min(b->first_item, now);
  store_max(b->last_item, now);
  b->items.fetch_add(1, std::memory_order_relaxed);
  const double end = b->end.load(std::memory_order_relaxed);
  if (end >= 0 && now > end) b->late_items.fetch_add(1, std::memory_order_relaxed);
}

StageBreakdown HostTimeline::breakdown(int stage, int first_iteration,
                                       const std::vector<bool>& classes,
                                       double item_cost_us) const {
  StageBreakdown out;
  out.stage = stage;
  if (stage < 0 || static_cast<size_t>(stage) >= stages_.size()) return out;
  const StageMoments& s = stages_[static_cast<size_t>(stage)];
  for (size_t i = 0; i < capacity_; ++i) {
    const BubbleMoments& b = s.bubbles[i];
    const double begin = b.begin.load(), end = b.end.load();
    if (begin < 0 || end < 0) continue;
    if (b.iteration.load() < first_iteration) continue;
    const int index = b.index.load();
    if (index < 0 || static_cast<size_t>(index) >= classes.size() || !classes[static_cast<size_t>(index)])
      continue;
    const double length = end - begin;
    ++out.bubbles;
    out.bubble_us += length;
    const double launched = b.launched.load(), started = b.started.load();
    if (started < 0) {
      out.unfilled_us += length;
      continue;
    }
    ++out.bubbles_with_slice;
    // The blocks can start once the bubble began, the executor enqueued the launch and the fill
    // stream passed the slice's start (when the executor was late, the stream passed it first and
    // then waited for the launch: that wait shows as the blocks' hop).
    const double ready = std::max(begin, launched);
    const double running = std::max(ready, started);
    out.executor_late_us += std::clamp(launched - begin, 0.0, length);
    out.stream_wake_us += std::clamp(started - ready, 0.0, length);
    const double first = b.first_item.load(), last = b.last_item.load();
    const uint64_t items = b.items.load();
    out.items += items;
    out.late_items += b.late_items.load();
    if (items == 0 || first < 0) {
      out.tail_us += std::clamp(end - running, 0.0, length);
    } else {
      const double first_start = first - item_cost_us;
      out.first_item_us += std::clamp(first_start - running, 0.0, length);
      out.items_span_us += std::clamp(std::min(last, end) - std::max(first_start, begin), 0.0, length);
      out.tail_us += std::clamp(end - last, 0.0, length);
    }
    const double stopped = b.stopped.load();
    if (stopped > end) out.stop_after_end_us += stopped - end;
  }
  return out;
}

std::string HostTimeline::csv() const {
  std::string out =
      "stage,id,iteration,index,begin,launched,started,first_item,last_item,end,stopped,items,late\n";
  for (size_t st = 0; st < stages_.size(); ++st) {
    for (size_t i = 0; i < capacity_; ++i) {
      const BubbleMoments& b = stages_[st].bubbles[i];
      if (b.begin.load() < 0) continue;
      out += fmt::format("{},{},{},{},{:.1f},{:.1f},{:.1f},{:.1f},{:.1f},{:.1f},{:.1f},{},{}\n", st,
                         i + 1, b.iteration.load(), b.index.load(), b.begin.load(), b.launched.load(),
                         b.started.load(), b.first_item.load(), b.last_item.load(), b.end.load(),
                         b.stopped.load(), b.items.load(), b.late_items.load());
    }
  }
  return out;
}

}  // namespace engine
