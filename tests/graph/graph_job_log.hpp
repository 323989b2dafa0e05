// The host side of a graph fill job on the simulated device, shared by the graph-job and
// streaming-job tests of this folder: the index word the "graph" reads and a log of every item
// run (virtual completion time, item, the index word's value when it ran), plus the items run at
// or beyond the bound a streaming test set last. graph_job_desc builds the description of such a
// host side (this one, or the host-device tests' own).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipefill/pipefill.h"
#include "sim/sim_world.hpp"

namespace pipefill::testing {

// The description of the graph job whose host side is `job`: a struct with `items`,
// `item_cost_us`, `index_word` and static `on_item` / `teardown` that take it as their user.
template <typename HostSide>
pfGraphJobDesc_t graph_job_desc(HostSide& job, const char* name) {
  pfGraphJobDesc_t d = PF_GRAPH_JOB_DESC_INITIALIZER;
  d.name = name;
  d.item_count = job.items;
  d.item_cost_us = job.item_cost_us;
  d.index_word = &job.index_word;
  d.on_item = &HostSide::on_item;
  d.user = &job;
  d.teardown = &HostSide::teardown;
  return d;
}

struct GraphJobLog {
  struct Run {
    double end_us;
    uint64_t item;
    uint64_t index_word;
  };
  std::string name = "graph-infer";
  uint64_t items = 100;
  double item_cost_us = 10.0;
  alignas(8) uint64_t index_word = ~uint64_t{0};
  std::vector<Run> runs;
  int teardowns = 0;
  // Streaming: the available bound the test set last (the world runs on the test's thread, so
  // the item callbacks read it without a race) and the items run at or beyond it.
  uint64_t bound = UINT64_MAX;
  uint64_t beyond_bound = 0;

  static void on_item(void* user, uint64_t item) {
    auto* self = static_cast<GraphJobLog*>(user);
    if (item >= self->bound) ++self->beyond_bound;
    self->runs.push_back(Run{sim::World::callback_time_us(), item, self->index_word});
  }
  static void teardown(void* user) { ++static_cast<GraphJobLog*>(user)->teardowns; }

  pfGraphJobDesc_t desc() { return graph_job_desc(*this, name.c_str()); }
};

}  // namespace pipefill::testing
