// Streaming jobs (pfJobSetAvailable / pfJobEndInput) on the simulated device: items are never
// claimed beyond the available bound, across raised bounds, bubbles that close mid-item and a job
// that ran dry; each item runs once, in index order; a dry job is neither failed nor finished.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "graph/graph_job_log.hpp"
#include "runtime/fixtures.hpp"

namespace pipefill::testing {
namespace {

using StreamingSim = StageRuntimeTest;

TEST_F(StreamingSim, ItemsAreNeverClaimedBeyondTheAvailableBound) {
  GraphJobLog log;
  log.name = "streamed";
  log.items = 1000;
  log.item_cost_us = 7.0;
  log.bound = 0;
  pfGraphJobDesc_t d = log.desc();
  d.available = 0;
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreateGraph(rt, &d, &handle));
  auto steps = [&](int n) {
    for (int i = 0; i < n; ++i) step_varied(stage, rt, i);
    EXPECT_EQ(pfRuntimeSynchronize(rt), pfSuccess);
  };

  steps(4);
  EXPECT_TRUE(log.runs.empty()) << "nothing available: nothing claimed";
  EXPECT_EQ(info_of(handle).status, pfJobPending);

  // Bounds raised between bubbles, not on item boundaries of the bubbles: 23, 23 (no raise), 61.
  const uint64_t bounds[] = {23, 23, 61, 150};
  for (const uint64_t bound : bounds) {
    log.bound = bound;
    PF_ASSERT_OK(pfJobSetAvailable(handle, bound));
    steps(12);  // more than enough bubbles to run dry at each bound
    EXPECT_EQ(log.runs.size(), bound) << "the job ran up to the bound and no further";
    EXPECT_NE(info_of(handle).status, pfJobFailed) << "dry is not failure";
    EXPECT_EQ(pfJobWait(handle, 0.0), pfErrorTimeout) << "a dry job is not finished";
  }
  EXPECT_EQ(log.beyond_bound, 0u);
  EXPECT_EQ(info_of(handle).items_completed, 150u);

  log.bound = 170;
  PF_ASSERT_OK(pfJobSetAvailable(handle, 170));
  PF_ASSERT_OK(pfJobEndInput(handle));
  steps(12);
  const pfJobInfo_t info = info_of(handle);
  EXPECT_EQ(info.status, pfJobCompleted);
  EXPECT_EQ(info.item_count, 170u);
  EXPECT_EQ(info.items_completed, 170u);
  ASSERT_EQ(log.runs.size(), 170u);
  for (uint64_t i = 0; i < 170; ++i) EXPECT_EQ(log.runs[i].item, i) << "once each, in index order";
  EXPECT_EQ(log.beyond_bound, 0u);
  PF_ASSERT_OK(pfJobWait(handle, 0.0));
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST_F(StreamingSim, AnOldCallersDescriptionHasNoBound) {
  GraphJobLog log;
  log.items = 40;
  log.item_cost_us = 7.0;
  log.bound = 40;
  pfGraphJobDesc_t d = log.desc();
  d.size = offsetof(pfGraphJobDesc_t, available);  // a caller built before `available`
  d.available = 0;  // past the caller's size: not read
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreateGraph(rt, &d, &handle));
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  step_until_completed(stage, rt, handle, 100.0, &hint);
  EXPECT_EQ(info_of(handle).status, pfJobCompleted);
  EXPECT_EQ(log.runs.size(), 40u);
  EXPECT_EQ(log.beyond_bound, 0u);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

}  // namespace
}  // namespace pipefill::testing
