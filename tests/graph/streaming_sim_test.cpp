// Streaming jobs (pfJobSetAvailable / pfJobEndInput) on the simulated device: items are never
// claimed beyond the available bound, across raised bounds, bubbles that close mid-item and a job
// that ran dry; each item runs once, in index order; a dry job is neither failed nor finished.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/fixtures.hpp"

namespace pipefill::testing {
namespace {

struct StreamLog {
  alignas(8) uint64_t index_word = ~uint64_t{0};
  uint64_t bound_at_claim = 0;  // the bound the test set last (the world runs on this thread)
  std::vector<uint64_t> items;
  uint64_t beyond_bound = 0;

  static void on_item(void* user, uint64_t item) {
    auto* self = static_cast<StreamLog*>(user);
    if (item >= self->bound_at_claim) ++self->beyond_bound;
    self->items.push_back(item);
  }
};

TEST(StreamingSim, ItemsAreNeverClaimedBeyondTheAvailableBound) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  ASSERT_NE(rt, nullptr);
  StreamLog log;
  pfGraphJobDesc_t d = PF_GRAPH_JOB_DESC_INITIALIZER;
  d.name = "streamed";
  d.item_count = 1000;
  d.item_cost_us = 7.0;
  d.index_word = &log.index_word;
  d.on_item = &StreamLog::on_item;
  d.user = &log;
  d.available = 0;
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreateGraph(rt, &d, &handle));
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  const double lengths[] = {100.0, 37.0, 64.0, 55.0, 120.0};
  auto steps = [&](int n) {
    for (int i = 0; i < n; ++i) {
      hint.expected_duration_us = lengths[i % 5];
      stage.step(rt, lengths[i % 5], &hint);
    }
    EXPECT_EQ(pfRuntimeSynchronize(rt), pfSuccess);
  };

  steps(4);
  EXPECT_TRUE(log.items.empty()) << "nothing available: nothing claimed";
  EXPECT_EQ(info_of(handle).status, pfJobPending);

  // Bounds raised between bubbles, not on item boundaries of the bubbles: 23, 23 (no raise), 61.
  const uint64_t bounds[] = {23, 23, 61, 150};
  for (const uint64_t bound : bounds) {
    log.bound_at_claim = bound;
    PF_ASSERT_OK(pfJobSetAvailable(handle, bound));
    steps(12);  // more than enough bubbles to run dry at each bound
    EXPECT_EQ(log.items.size(), bound) << "the job ran up to the bound and no further";
    EXPECT_NE(info_of(handle).status, pfJobFailed) << "dry is not failure";
    EXPECT_EQ(pfJobWait(handle, 0.0), pfErrorTimeout) << "a dry job is not finished";
  }
  EXPECT_EQ(log.beyond_bound, 0u);
  EXPECT_EQ(info_of(handle).items_completed, 150u);

  log.bound_at_claim = 170;
  PF_ASSERT_OK(pfJobSetAvailable(handle, 170));
  PF_ASSERT_OK(pfJobEndInput(handle));
  steps(12);
  const pfJobInfo_t info = info_of(handle);
  EXPECT_EQ(info.status, pfJobCompleted);
  EXPECT_EQ(info.item_count, 170u);
  EXPECT_EQ(info.items_completed, 170u);
  ASSERT_EQ(log.items.size(), 170u);
  for (uint64_t i = 0; i < 170; ++i) EXPECT_EQ(log.items[i], i) << "once each, in index order";
  EXPECT_EQ(log.beyond_bound, 0u);
  PF_ASSERT_OK(pfJobWait(handle, 0.0));
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST(StreamingSim, AnOldCallersDescriptionHasNoBound) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  ASSERT_NE(rt, nullptr);
  StreamLog log;
  log.bound_at_claim = 40;
  pfGraphJobDesc_t d = PF_GRAPH_JOB_DESC_INITIALIZER;
  d.size = offsetof(pfGraphJobDesc_t, available);  // a caller built before `available`
  d.item_count = 40;
  d.item_cost_us = 7.0;
  d.index_word = &log.index_word;
  d.on_item = &StreamLog::on_item;
  d.user = &log;
  d.available = 0;  // past the caller's size: not read
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreateGraph(rt, &d, &handle));
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  for (int i = 0; i < 20 && info_of(handle).status != pfJobCompleted; ++i) stage.step(rt, 100.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  EXPECT_EQ(info_of(handle).status, pfJobCompleted);
  EXPECT_EQ(log.items.size(), 40u);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

}  // namespace
}  // namespace pipefill::testing
