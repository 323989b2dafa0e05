#include "core/planner.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace pipefill {
namespace {

// Workers (blocks / items in flight) a config gets: its parallelism capped by the fill SMs.
int workers_for(const JobConfigModel& c, int fill_sms) {
  if (fill_sms <= 0) return 0;
  return c.parallelism > 0 ? std::min(c.parallelism, fill_sms) : fill_sms;
}

double work_of(const JobConfigModel& c) { return c.work_per_item > 0 ? c.work_per_item : 1.0; }

int sms_per_worker(const JobConfigModel& c) { return std::max(1, c.sms_per_worker); }

}  // namespace

SlicePlan plan_slice(const PlanRequest& r, std::span<const JobConfigModel> configs) {
  SlicePlan plan;
  if (r.remaining_items == 0) {
    plan.reason = "no items left";
    plan.cause = pfSkipNoJob;
    return plan;
  }
  if (r.fill_sms <= 0) {
    plan.reason = "no fill SMs";
    plan.cause = pfSkipNoResources;
    return plan;
  }
  const double budget =
      r.predicted_us * (1.0 - r.margin_fraction) - r.margin_us - r.launch_overhead_us;
  if (!(budget > 0)) {
    plan.reason = fmt::format("bubble too short: {:.3f} us predicted leaves {:.3f} us",
                              r.predicted_us, budget);
    plan.cause = pfSkipTooShort;
    return plan;
  }
  bool memory_limited = false;
  bool too_long = false;
  int sms_needed = 0;  // > 0: a config whose one worker needs more SMs than are free
  for (size_t i = 0; i < configs.size(); ++i) {
    const JobConfigModel& c = configs[i];
    if (!(c.item_cost_us > 0) || c.resident_bytes > r.resident_limit) continue;
    // Workers whose SMs fit the free SMs (a graph worker may hold many).
    int workers = workers_for(c, r.fill_sms / sms_per_worker(c));
    if (workers <= 0) {
      sms_needed = sms_per_worker(c);
      continue;
    }
    if (c.workspace_bytes_per_item > 0) {
      const size_t fit = r.free_bytes / c.workspace_bytes_per_item;
      if (fit < static_cast<size_t>(workers)) workers = static_cast<int>(fit);
    }
    if (workers <= 0) {
      memory_limited = true;
      continue;
    }
    // Whole items per worker that finish within the budget. Both kinds are planned in whole
    // items; for gated work this is the item budget of the slice and the gate only catches
    // mispredictions, for opaque work it is a hard promise (nothing stops it).
    // The epsilon keeps an exact fit (budget == k * cost) from losing an item to rounding.
    const double per_worker_d =
        std::floor(std::max(0.0, budget - c.slice_tail_us) / c.item_cost_us + 1e-9);
    if (per_worker_d < 1) {
      too_long = true;
      continue;
    }
    const uint64_t capacity =
        static_cast<uint64_t>(std::min(per_worker_d, 1e15)) * static_cast<uint64_t>(workers);
    const uint64_t items = std::min<uint64_t>(capacity, r.remaining_items);
    const uint64_t per_worker = static_cast<uint64_t>(std::min(per_worker_d, 1e15));
    // Packed: the fewest workers that still run the items within the budget.
    const uint64_t needed = r.pack_sms ? (items + per_worker - 1) / per_worker : items;
    const int used = static_cast<int>(std::min<uint64_t>(needed, static_cast<uint64_t>(workers)));
    const uint64_t rounds = (items + static_cast<uint64_t>(used) - 1) / static_cast<uint64_t>(used);
    const double work = static_cast<double>(items) * work_of(c);
    // Highest planned work (= work per µs of this bubble); ties keep the lower index.
    if (!plan.fill || work > plan.work) {
      plan.fill = true;
      plan.config_index = static_cast<int>(i);
      plan.items = items;
      plan.workers = used;
      plan.sms = used * sms_per_worker(c);
      plan.expected_us = static_cast<double>(rounds) * c.item_cost_us;
      plan.workspace_bytes = c.workspace_bytes_per_item * static_cast<size_t>(used);
      plan.work = work;
    }
  }
  if (!plan.fill) {
    if (too_long) {
      plan.reason = fmt::format("every item is longer than the {:.3f} us budget", budget);
      plan.cause = pfSkipTooShort;
    } else if (sms_needed > 0 && !memory_limited) {
      plan.reason = fmt::format("one worker holds {} SMs (its graph's kernels) but only {} are free",
                                sms_needed, r.fill_sms);
      plan.cause = pfSkipNoResources;
    } else if (memory_limited) {
      plan.reason = fmt::format("workspace does not fit the {} free bytes", r.free_bytes);
      plan.cause = pfSkipNoMemory;
    } else {
      plan.reason = "no eligible configuration";
    }
  }
  return plan;
}

SlicePlan plan_probe(const PlanRequest& r, std::span<const JobConfigModel> configs,
                     int config_index) {
  SlicePlan plan;
  plan.cause = pfSkipTooShort;
  const double budget =
      r.predicted_us * (1.0 - r.margin_fraction) - r.margin_us - r.launch_overhead_us;
  if (config_index < 0 || static_cast<size_t>(config_index) >= configs.size()) {
    plan.reason = fmt::format("probe: no configuration {}", config_index);
    return plan;
  }
  const JobConfigModel& c = configs[static_cast<size_t>(config_index)];
  if (r.remaining_items == 0 || !(budget > 0)) {
    plan.reason = "probe: no item left or no time";
    return plan;
  }
  if (c.resident_bytes > r.resident_limit || sms_per_worker(c) > r.fill_sms ||
      c.workspace_bytes_per_item > r.free_bytes) {
    plan.reason = "probe: one worker's SMs or one item's workspace do not fit";
    plan.cause = c.workspace_bytes_per_item > r.free_bytes ? pfSkipNoMemory : pfSkipNoResources;
    return plan;
  }
  plan.fill = true;
  plan.probe = true;
  plan.config_index = config_index;
  plan.items = 1;
  plan.workers = 1;
  plan.sms = sms_per_worker(c);
  plan.expected_us = budget;
  plan.workspace_bytes = c.workspace_bytes_per_item;
  plan.work = work_of(c);
  plan.cause = pfSkipOther;
  return plan;
}

int choose_setup_config(std::span<const JobConfigModel> configs, size_t arena_free, int fill_sms) {
  int best = -1;
  double best_rate = 0.0;
  for (size_t i = 0; i < configs.size(); ++i) {
    const JobConfigModel& c = configs[i];
    if (!(c.item_cost_us > 0) || c.resident_bytes > arena_free) continue;
    const int workers = std::max(1, workers_for(c, fill_sms));
    const double rate = workers * work_of(c) / c.item_cost_us;
    if (best < 0 || rate > best_rate) {
      best = static_cast<int>(i);
      best_rate = rate;
    }
  }
  return best;
}

}  // namespace pipefill
