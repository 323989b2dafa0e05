// Graph jobs in SM x us packing (issue 16 item 13): one worker of a graph job runs the graph's
// kernels one item after another, and those kernels may spread over every fill SM. The slice is
// charged the SMs the graph uses - the whole fill partition when the device cannot tell - so a
// ticket job packed into the same bubble gets only the SMs really left (before, a graph slice was
// charged one SM and the ticket job was given the other 27 of 28, oversubscribing the partition).
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "fixtures.hpp"
#include "test_device.hpp"

namespace pipefill::testing {
namespace {

// A ticket job that records the blocks (SMs) of each of its bubble slices.
struct BlockRecordingJob {
  CountingJob counting;
  std::mutex mutex;
  std::vector<int> blocks;  // max_blocks of each slice with items
  static pfResult_t launch(void* user, const pfSliceDesc_t* slice, void* stream) {
    auto* self = static_cast<BlockRecordingJob*>(user);
    if (slice->max_items > 0) {
      std::lock_guard lock(self->mutex);
      self->blocks.push_back(slice->max_blocks);
    }
    return CountingJob::launch(&self->counting, slice, stream);
  }
  pfJobDesc_t desc() {
    pfJobDesc_t d = counting.desc();
    d.user = this;
    d.launch = &launch;
    return d;
  }
};

struct GraphJob {
  uint64_t index_word = 0;
  uint64_t items_run = 0;
  static void on_item(void* user, uint64_t) { ++static_cast<GraphJob*>(user)->items_run; }
  pfGraphJobDesc_t desc(uint64_t items) {
    pfGraphJobDesc_t d = PF_GRAPH_JOB_DESC_INITIALIZER;
    d.name = "graph";
    d.priority = 10;  // packed first under the priority policy
    d.item_count = items;
    d.item_cost_us = 10.0;
    d.index_word = &index_word;
    d.on_item = &on_item;
    d.user = this;
    return d;
  }
};

struct Charge {
  std::vector<int> ticket_blocks;  // per bubble where both jobs ran or were tried
  uint64_t graph_items = 0;
  uint64_t ticket_items = 0;
  double filled_sm_us = 0.0;
  double filled_us = 0.0;
};

// 28 fill SMs (32 - 4 reserved); the graph job reports `graph_sms` (-1: the simulator's own
// answer, one worker; 0: unknown). Bubbles of 100 µs until both jobs have had slices.
Charge run_with(int graph_sms) {
  Charge out;
  ManualStage stage;
  stage.init(32);
  pfConfig_t c = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  c.policy = pfPolicyPriority;
  TestDevice* device = nullptr;
  pfRuntime_t rt = make_test_runtime(stage.world.get(), c, &device, /*hide_driven_clock=*/false,
                                     /*executor_thread=*/false);
  EXPECT_NE(rt, nullptr);
  if (rt == nullptr) return out;
  device->graph_sms_used = graph_sms;
  GraphJob graph;
  BlockRecordingJob ticket;
  ticket.counting.items = 1000000;
  const pfGraphJobDesc_t gd = graph.desc(1000000);
  pfJobDesc_t td = ticket.desc();
  pfJob_t g = nullptr, t = nullptr;
  EXPECT_EQ(pfJobCreateGraph(rt, &gd, &g), pfSuccess) << pfGetLastErrorMessage();
  EXPECT_EQ(pfJobCreate(rt, &td, &t), pfSuccess) << pfGetLastErrorMessage();
  for (int i = 0; i < 6; ++i) {
    stage.step(rt, 100.0);
    EXPECT_EQ(pfRuntimeSynchronize(rt), pfSuccess) << pfGetLastErrorMessage();
  }
  out.graph_items = graph.items_run;
  out.ticket_items = ticket.counting.items_run();
  out.ticket_blocks = ticket.blocks;
  pfStats_t stats{};
  EXPECT_EQ(pfRuntimeGetStatsV2(rt, &stats, sizeof stats), pfSuccess);
  out.filled_sm_us = stats.filled_sm_us;
  out.filled_us = stats.filled_time_us;
  EXPECT_EQ(pfJobDestroy(g), pfSuccess);
  EXPECT_EQ(pfJobDestroy(t), pfSuccess);
  EXPECT_EQ(pfRuntimeDestroy(rt), pfSuccess);
  return out;
}

TEST(GraphSmCharge, UnknownSmUseChargesTheWholePartition) {
  const Charge charge = run_with(/*graph_sms=*/0);
  ASSERT_GT(charge.graph_items, 0u) << "the graph job was filled";
  // The graph slice held all 28 fill SMs: the ticket job, packed after it, got no slice.
  EXPECT_TRUE(charge.ticket_blocks.empty())
      << "ticket slice of " << (charge.ticket_blocks.empty() ? 0 : charge.ticket_blocks[0])
      << " SMs packed beside a graph that may use every fill SM";
  EXPECT_EQ(charge.ticket_items, 0u);
  // Filled SM-µs count the graph's 28 SMs over its filled time.
  EXPECT_NEAR(charge.filled_sm_us, 28.0 * charge.filled_us, 1e-6 * charge.filled_sm_us);
}

TEST(GraphSmCharge, KnownSmUseLeavesTheRestToOtherJobs) {
  const Charge charge = run_with(/*graph_sms=*/6);
  ASSERT_GT(charge.graph_items, 0u);
  ASSERT_FALSE(charge.ticket_blocks.empty()) << "the ticket job got no SMs beside the graph";
  for (int blocks : charge.ticket_blocks) EXPECT_EQ(blocks, 28 - 6);
  EXPECT_GT(charge.ticket_items, 0u);
}

TEST(GraphSmCharge, MoreSmsThanThePartitionAreCappedAtIt) {
  const Charge charge = run_with(/*graph_sms=*/500);
  ASSERT_GT(charge.graph_items, 0u) << "a graph reporting more SMs than the partition still runs";
  EXPECT_TRUE(charge.ticket_blocks.empty());
}

// The simulator's graph items run on one worker: charged one SM, as before.
TEST(GraphSmCharge, TheSimulatorsOneWorkerGraphIsChargedOneSm) {
  const Charge charge = run_with(/*graph_sms=*/-1);
  ASSERT_GT(charge.graph_items, 0u);
  ASSERT_FALSE(charge.ticket_blocks.empty());
  for (int blocks : charge.ticket_blocks) EXPECT_EQ(blocks, 27);
}

}  // namespace
}  // namespace pipefill::testing
