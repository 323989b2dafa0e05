#include "core/harvester.hpp"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

namespace pipefill::core {

SliceAccounting account_slice(double begin_us, double end_us, const SliceObservation& s) {
  SliceAccounting a;
  a.items_completed_after = s.items_completed_before;
  if (s.kind != pfJobOpaque) {  // gated: ticket and graph jobs
    const uint64_t done_total = std::min(s.cursor_readback, s.item_count);
    if (done_total > s.items_completed_before) {
      a.items_done = done_total - s.items_completed_before;
      a.items_completed_after = done_total;
    }
  } else {
    // Opaque work cannot report what it did: its planned items are taken as done.
    a.items_completed_after = std::min(s.item_count, s.items_completed_before + s.planned_items);
    a.items_done = a.items_completed_after - std::min(a.items_completed_after, s.items_completed_before);
  }
  a.late = s.start_us >= end_us;
  a.ran_work = a.items_done > 0 || s.kind == pfJobOpaque;
  if (a.ran_work) {
    a.filled_us = std::max(0.0, std::min(s.end_us, end_us) - std::max(s.start_us, begin_us));
    a.filled_sm_us = a.filled_us * std::max(0, s.sms);
    a.overrun_us = s.end_us - end_us;
    a.busy_us = std::max(0.0, s.end_us - s.start_us);
  }
  return a;
}

BubbleAccounting account_bubble(double begin_us, double end_us,
                                std::span<const SliceObservation> slices) {
  BubbleAccounting b;
  b.duration_us = std::max(0.0, end_us - begin_us);
  b.slices.reserve(slices.size());
  // The filled parts of the bubble, to take their union (slices run side by side).
  std::vector<std::pair<double, double>> filled;
  filled.reserve(slices.size());
  for (const SliceObservation& s : slices) {
    const SliceAccounting a = account_slice(begin_us, end_us, s);
    if (a.filled_us > 0) {
      const double from = std::max(s.start_us, begin_us);
      filled.emplace_back(from, from + a.filled_us);
    }
    b.filled_sm_us += a.filled_sm_us;
    if (a.ran_work) {
      b.overrun_us = std::max(b.overrun_us, a.overrun_us);
      if (a.overrun_us > 0) ++b.slices_past_end;
      const double delay = std::max(0.0, s.start_us - begin_us);
      b.fill_start_delay_us = b.fill_start_delay_us < 0 ? delay : std::min(b.fill_start_delay_us, delay);
    }
    b.slices.push_back(a);
  }
  std::sort(filled.begin(), filled.end());
  double covered_to = -std::numeric_limits<double>::infinity();
  for (const auto& [from, to] : filled) {
    if (to <= covered_to) continue;
    b.filled_us += to - std::max(from, covered_to);
    covered_to = to;
  }
  return b;
}

}  // namespace pipefill::core
