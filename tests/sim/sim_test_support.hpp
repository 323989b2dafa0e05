// Helpers shared by the simulated-device tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "pipefill/pipefill.h"
#include "sim/sim_world.hpp"

namespace pipefill::sim::testing {

// Interference off except `interference` (beta, the main-kernel slowdown, with fill intensity
// 1: version 1's model); the interference tests build their own descriptions.
inline std::unique_ptr<World> make_world(int devices, int sm_count, double jitter = 0.0,
                                         double interference = 0.0, uint64_t seed = 1) {
  pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_NO_INTERFERENCE_INITIALIZER;
  desc.fill_mem_intensity = 1.0;
  desc.sm_count = sm_count;
  desc.jitter_fraction = jitter;
  desc.interference = interference;
  std::unique_ptr<World> world;
  EXPECT_EQ(World::create(devices, &desc, seed, &world), pfSuccess);
  return world;
}

inline void* make_stream(World& world, int device, int priority, bool fill = false) {
  void* stream = nullptr;
  EXPECT_EQ(world.create_stream(device, priority, fill, &stream), pfSuccess);
  return stream;
}

inline void* make_event(World& world) {
  void* event = nullptr;
  EXPECT_EQ(world.create_event(&event), pfSuccess);
  return event;
}

// The device's records of one kind, in log order.
inline std::vector<ActivityRecord> records_of(const World& world, int device, ActivityKind kind) {
  std::vector<ActivityRecord> out;
  for (const ActivityRecord& record : world.activities(device)) {
    if (record.kind == kind) out.push_back(record);
  }
  return out;
}

inline std::vector<ActivityRecord> records_of_stream(const World& world, int device,
                                                     const void* stream) {
  std::vector<ActivityRecord> out;
  const uint64_t id = world.stream_id(stream);
  for (const ActivityRecord& record : world.activities(device)) {
    if (record.stream == id) out.push_back(record);
  }
  return out;
}

// Words a ticket kernel works on: gate, cursor, budget counter.
struct TicketWords {
  uint64_t gate = 0;
  uint64_t cursor = 0;
  uint64_t budget = 0;

  pfSliceDesc_t slice(uint64_t bubble_id, uint64_t max_items, uint64_t total_items,
                      int max_blocks) {
    pfSliceDesc_t desc{};
    desc.bubble_id = bubble_id;
    desc.max_items = max_items;
    desc.total_items = total_items;
    desc.max_blocks = max_blocks;
    desc.gate = &gate;
    desc.cursor = &cursor;
    desc.budget_counter = &budget;
    return desc;
  }
};

// Records every completed item with its virtual completion time (World::callback_time_us()).
struct ItemLog {
  std::vector<std::pair<double, uint64_t>> items;  // (completion time, item)

  static void on_item(void* user, uint64_t item) {
    static_cast<ItemLog*>(user)->items.emplace_back(World::callback_time_us(), item);
  }

  // The largest number of items in flight at once, given every item took `cost` µs.
  int max_concurrency(double cost) const {
    std::vector<std::pair<double, int>> edges;  // (time, +1 start / -1 end); ends sort first
    for (const auto& [end, item] : items) {
      edges.emplace_back(end - cost, +1);
      edges.emplace_back(end, -1);
    }
    std::sort(edges.begin(), edges.end());
    int current = 0;
    int best = 0;
    for (const auto& [time, delta] : edges) {
      current += delta;
      best = std::max(best, current);
    }
    return best;
  }

  std::vector<uint64_t> sorted_items() const {
    std::vector<uint64_t> out;
    for (const auto& [time, item] : items) out.push_back(item);
    std::sort(out.begin(), out.end());
    return out;
  }
};

}  // namespace pipefill::sim::testing
