// pfBubbleCloseFill: the stream-ordered early end of the open bubble's fill (an engine that learns
// the bubble's end before its wait completes: the sending stage's notice). The close stops the
// bubble's claims when the side stream reaches it; it never lands before the bubble's begin (so
// it cannot close the previous bubble's fill); it is an atomic max (a close that arrives after a
// later bubble ended leaves that bubble closed); a class whose last bubble was closed early plans
// its gated work to the noticed quantile (the window's longest bubble); bad calls are refused
// and change nothing.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

constexpr double kItemUs = 10.0;
constexpr int kWorkers = 28;  // the fill SMs (32 - 4 reserved)

struct CloseFillTest : ::testing::Test {
  ManualStage stage;
  pfRuntime_t rt = nullptr;
  SliceRecordingJob job;
  pfJob_t handle = nullptr;
  void* side = nullptr;        // the engine's side stream that closes the fill
  pfSimEvent_t began = nullptr;  // marks the bubble's begin on the main stream
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(stage.init());
    pfConfig_t config = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
    config.launch_mode = pfLaunchInline;
    rt = stage.runtime(&config);
    ASSERT_NE(rt, nullptr);
    pfJobDesc_t desc = job.desc(kItemUs, kWorkers);
    PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));
    PF_ASSERT_OK(pfSimStreamCreate(stage.world.get(), 0, sim::kHighestPriority, &side));
    PF_ASSERT_OK(pfSimEventCreate(stage.world.get(), &began));
    hint.label = "recv";
  }
  void TearDown() override {
    if (handle != nullptr) EXPECT_EQ(pfJobDestroy(handle), pfSuccess);
    if (rt != nullptr) EXPECT_EQ(pfRuntimeDestroy(rt), pfSuccess);
    if (side != nullptr) pfSimStreamDestroy(side);
    if (began != nullptr) pfSimEventDestroy(began);
  }

  // One bubble of `bubble_us` whose fill `side` closes `close_after_us` after its begin (< 0: no
  // close), then a compute kernel; runs the world. Returns the items the bubble's fill ran.
  uint64_t step(double bubble_us, double close_after_us) {
    const uint64_t before = job.items_run();
    EXPECT_EQ(pfSimStreamDelay(stage.peer, bubble_us), pfSuccess);
    EXPECT_EQ(pfSimEventRecord(stage.ready, stage.peer), pfSuccess);
    EXPECT_EQ(pfBubbleBegin(rt, stage.main, &hint), pfSuccess) << pfGetLastErrorMessage();
    if (close_after_us >= 0) {
      EXPECT_EQ(pfSimEventRecord(began, stage.main), pfSuccess);
      EXPECT_EQ(pfSimStreamWaitEvent(side, began, close_after_us, 0), pfSuccess);
      EXPECT_EQ(pfBubbleCloseFill(rt, side), pfSuccess) << pfGetLastErrorMessage();
    }
    EXPECT_EQ(pfSimStreamWaitEvent(stage.main, stage.ready, 0.0, stage.comm_sms), pfSuccess);
    EXPECT_EQ(pfBubbleEnd(rt, stage.main), pfSuccess) << pfGetLastErrorMessage();
    EXPECT_EQ(pfSimLaunchKernel(stage.main, stage.compute_us, stage.sms), pfSuccess);
    EXPECT_EQ(pfIterationEnd(rt), pfSuccess);
    EXPECT_EQ(pfSimRunUntilIdle(stage.world.get()), pfSuccess) << pfGetLastErrorMessage();
    return job.items_run() - before;
  }
};

// 400 us bubbles, 10 us items on 28 workers, no margins: an open bubble runs 40 rounds; one
// closed 100 us after its begin runs the 10 rounds started before the close (the round claimed
// at the close itself may or may not start), never more.
TEST_F(CloseFillTest, StopsTheOpenBubblesClaimsWhenTheSideStreamReachesIt) {
  for (int i = 0; i < 3; ++i) step(400.0, -1);  // history
  const uint64_t open = step(400.0, -1);
  EXPECT_GE(open, uint64_t{38} * kWorkers) << "an unclosed bubble fills to its end";
  const uint64_t closed = step(400.0, 100.0);
  EXPECT_GE(closed, uint64_t{9} * kWorkers) << "the fill runs until the close";
  EXPECT_LE(closed, uint64_t{11} * kWorkers) << "no claim after the close (one item in flight)";
  // The next bubble is not affected by the last one's close.
  EXPECT_GE(step(400.0, -1), uint64_t{38} * kWorkers);
}

// The close on an idle side stream, called while the main stream is still busy before the
// bubble (a kernel of 300 us ahead of it): without waiting for the bubble's begin it would land
// at once, inside the previous bubble, and close that one's fill (and the previous bubble's own
// end write would then reopen this one: about 1 + 20 rounds in all). It lands at this bubble's
// begin: the previous bubble (400 us) is filled in full, this one (200 us) not at all.
TEST_F(CloseFillTest, NeverLandsBeforeTheBubblesBegin) {
  for (int i = 0; i < 3; ++i) step(400.0, -1);
  const uint64_t before = job.items_run();
  // Bubble A (no close) and, behind a 300 us kernel, bubble B closed at once on the side stream;
  // everything is enqueued before the world runs.
  PF_ASSERT_OK(pfSimStreamDelay(stage.peer, 400.0));
  PF_ASSERT_OK(pfSimEventRecord(stage.ready, stage.peer));
  PF_ASSERT_OK(pfBubbleBegin(rt, stage.main, &hint));
  PF_ASSERT_OK(pfSimStreamWaitEvent(stage.main, stage.ready, 0.0, stage.comm_sms));
  PF_ASSERT_OK(pfBubbleEnd(rt, stage.main));
  PF_ASSERT_OK(pfSimLaunchKernel(stage.main, 300.0, stage.sms));
  PF_ASSERT_OK(pfIterationEnd(rt));
  pfSimEvent_t ready_b = nullptr;
  PF_ASSERT_OK(pfSimEventCreate(stage.world.get(), &ready_b));
  PF_ASSERT_OK(pfSimStreamDelay(stage.peer, 500.0));  // B ends 200 us after its begin
  PF_ASSERT_OK(pfSimEventRecord(ready_b, stage.peer));
  PF_ASSERT_OK(pfBubbleBegin(rt, stage.main, &hint));
  PF_ASSERT_OK(pfBubbleCloseFill(rt, side));
  PF_ASSERT_OK(pfSimStreamWaitEvent(stage.main, ready_b, 0.0, stage.comm_sms));
  PF_ASSERT_OK(pfBubbleEnd(rt, stage.main));
  PF_ASSERT_OK(pfIterationEnd(rt));
  PF_ASSERT_OK(pfSimRunUntilIdle(stage.world.get()));
  pfSimEventDestroy(ready_b);
  const uint64_t ran = job.items_run() - before;
  EXPECT_GE(ran, uint64_t{38} * kWorkers) << "bubble A was filled to its end";
  EXPECT_LE(ran, uint64_t{41} * kWorkers) << "bubble B's fill was closed at its begin";
}

// A close that lands long after its bubble ended - after the next bubble's end too - must not
// move the gate back to its bubble's id: that would reopen the next bubble's leftover claims.
// Both bubbles are enqueued before the world runs, so the late close lands last.
TEST_F(CloseFillTest, ALateCloseNeverMovesTheGateBack) {
  for (int i = 0; i < 3; ++i) step(400.0, -1);
  job.slices.clear();
  for (int b = 0; b < 2; ++b) {
    PF_ASSERT_OK(pfSimStreamDelay(stage.peer, b == 0 ? 400.0 : 450.0));
    PF_ASSERT_OK(pfSimEventRecord(stage.ready, stage.peer));
    PF_ASSERT_OK(pfBubbleBegin(rt, stage.main, &hint));
    if (b == 0) {  // lands ~4600 us after this bubble's end, long after the second one's
      PF_ASSERT_OK(pfSimEventRecord(began, stage.main));
      PF_ASSERT_OK(pfSimStreamWaitEvent(side, began, 5000.0, 0));
      PF_ASSERT_OK(pfBubbleCloseFill(rt, side));
    }
    PF_ASSERT_OK(pfSimStreamWaitEvent(stage.main, stage.ready, 0.0, stage.comm_sms));
    PF_ASSERT_OK(pfBubbleEnd(rt, stage.main));
    PF_ASSERT_OK(pfSimLaunchKernel(stage.main, stage.compute_us, stage.sms));
    PF_ASSERT_OK(pfIterationEnd(rt));
  }
  PF_ASSERT_OK(pfSimRunUntilIdle(stage.world.get()));
  ASSERT_EQ(job.slices.size(), 2u);
  const pfSliceDesc_t& second = job.slices.back();
  EXPECT_EQ(second.bubble_id, job.slices.front().bubble_id + 1);
  // Both bubbles have ended; the gate holds the second one's id, not the late close's.
  EXPECT_EQ(*second.gate, second.bubble_id);
}

// After a closed bubble the class plans to its longest bubble (PIPEFILL_NOTICED_QUANTILE = 1 by
// default) instead of the median; after an unclosed one, the median again. History: 300 and 500
// us in turn (median - nearest rank 0.5 of an even count - 300, longest 500).
TEST_F(CloseFillTest, AClosedClassPlansToItsLongestBubble) {
  for (int i = 0; i < 3; ++i) {
    step(300.0, -1);
    step(500.0, -1);
  }
  job.slices.clear();
  step(300.0, -1);
  ASSERT_EQ(job.slices.size(), 1u);
  EXPECT_DOUBLE_EQ(job.slices.back().time_budget_us, 300.0) << "unclosed: the median";
  step(500.0, 450.0);  // closed (its own budget was planned before the close: the median)
  job.slices.clear();
  step(300.0, 250.0);
  ASSERT_EQ(job.slices.size(), 1u);
  EXPECT_DOUBLE_EQ(job.slices.back().time_budget_us, 500.0) << "closed class: the longest";
  step(500.0, -1);  // planned to the longest still; this one is not closed
  job.slices.clear();
  step(300.0, -1);
  ASSERT_EQ(job.slices.size(), 1u);
  EXPECT_DOUBLE_EQ(job.slices.back().time_budget_us, 300.0) << "unclosed again: the median";
}

TEST_F(CloseFillTest, BadCallsAreRefusedAndChangeNothing) {
  EXPECT_EQ(pfBubbleCloseFill(rt, side), pfErrorInvalidState);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("no bubble is open"), std::string::npos)
      << pfGetLastErrorMessage();
  EXPECT_EQ(pfBubbleCloseFill(nullptr, side), pfErrorInvalidArgument);
  for (int i = 0; i < 3; ++i) step(400.0, -1);
  void* fill_streams[8] = {};
  size_t count = 0;
  PF_ASSERT_OK(pfRuntimeGetFillStreams(rt, fill_streams, 8, &count));
  ASSERT_GT(count, 0u);
  const uint64_t before = job.items_run();
  PF_ASSERT_OK(pfSimStreamDelay(stage.peer, 400.0));
  PF_ASSERT_OK(pfSimEventRecord(stage.ready, stage.peer));
  PF_ASSERT_OK(pfBubbleBegin(rt, stage.main, &hint));
  EXPECT_EQ(pfBubbleCloseFill(rt, nullptr), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("stream is NULL"), std::string::npos);
  EXPECT_EQ(pfBubbleCloseFill(rt, fill_streams[0]), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("not a main-job stream"), std::string::npos)
      << pfGetLastErrorMessage();
  PF_ASSERT_OK(pfSimStreamWaitEvent(stage.main, stage.ready, 0.0, stage.comm_sms));
  PF_ASSERT_OK(pfBubbleEnd(rt, stage.main));
  PF_ASSERT_OK(pfIterationEnd(rt));
  PF_ASSERT_OK(pfSimRunUntilIdle(stage.world.get()));
  EXPECT_GE(job.items_run() - before, uint64_t{38} * kWorkers) << "the refused calls closed nothing";
}

}  // namespace
}  // namespace pipefill::testing
