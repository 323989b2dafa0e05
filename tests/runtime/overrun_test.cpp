// A bubble that ends earlier than predicted: the gate bounds the overrun by one item, the main
// job is delayed by exactly that overrun, and the job still completes every item exactly once.
#include <gtest/gtest.h>

#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

TEST(Overrun, EarlyBubbleEndCostsAtMostOneItem) {
  constexpr double kItem = 10.0;
  // Baseline: same steps, no runtime.
  ManualStage base;
  ASSERT_NO_FATAL_FAILURE(base.init());
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  ASSERT_NE(rt, nullptr);
  CountingJob job;
  job.item_cost_us = kItem;
  job.items = 2000;
  pfJobDesc_t desc = job.desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));

  // Three 100 µs bubbles give the class its history (the third is filled exactly).
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(stage.step(rt, 100.0), base.step(nullptr, 100.0)) << "bubble " << i;
  }
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  pfStats_t before;
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &before));
  EXPECT_EQ(before.bubbles_filled, 1u);
  EXPECT_DOUBLE_EQ(before.max_overrun_us, 0.0);

  // Predicted 100 µs, ends at 55 µs: blocks busy with the item started at 50 finish at 60.
  const double filled_step = stage.step(rt, 55.0);
  const double base_step = base.step(nullptr, 55.0);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  pfStats_t after;
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &after));
  const double overrun = after.max_overrun_us;
  EXPECT_DOUBLE_EQ(overrun, 5.0);
  EXPECT_LE(overrun, kItem);
  EXPECT_DOUBLE_EQ(after.overrun_time_us - before.overrun_time_us, overrun);
  EXPECT_DOUBLE_EQ(filled_step - base_step, overrun) << "main-job slowdown equals the overrun";

  // Later bubbles finish the job; every item ran exactly once.
  for (int i = 0; i < 100 && info_of(handle).status != pfJobCompleted; ++i) {
    stage.step(rt, 100.0);
    PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  }
  const pfJobInfo_t info = info_of(handle);
  EXPECT_EQ(info.status, pfJobCompleted);
  EXPECT_EQ(info.items_completed, job.items);
  EXPECT_EQ(info.error, pfSuccess);
  EXPECT_TRUE(job.every_item_once());
  EXPECT_EQ(job.items_run(), job.items);
  EXPECT_EQ(job.teardowns, 1);
  EXPECT_EQ(pfJobWait(handle, 0.0), pfSuccess);
  pfStats_t end;
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &end));
  EXPECT_EQ(end.items_completed, job.items);
  EXPECT_EQ(end.jobs_completed, 1u);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// A bubble that is already over when its slice could start: another main-job kernel holds
// every SM across the (zero-length) bubble, and the next compute kernel takes them before the
// fill blocks (main work is served first). The fill blocks get an SM only after that kernel,
// find the gate closed and exit: the slice's completion event is 150 µs past the bubble end,
// but no fill work ran, so there is no overrun, no filled time and no main-job delay.
TEST(Overrun, SliceThatRanNoItemIsNeitherOverrunNorFill) {
  auto zero_bubble_behind_busy_sms = [](ManualStage& s, pfRuntime_t rt, void* busy) {
    double start = 0.0, end = 0.0;
    EXPECT_EQ(pfSimNow(s.world.get(), &start), pfSuccess);
    EXPECT_EQ(pfSimLaunchKernel(busy, 100.0, s.sms), pfSuccess);
    if (rt != nullptr) EXPECT_EQ(pfBubbleBegin(rt, s.main, nullptr), pfSuccess);
    if (rt != nullptr) EXPECT_EQ(pfBubbleEnd(rt, s.main), pfSuccess);
    EXPECT_EQ(pfSimLaunchKernel(s.main, s.compute_us, s.sms), pfSuccess);
    EXPECT_EQ(pfSimEventRecord(s.done, s.main), pfSuccess);
    if (rt != nullptr) EXPECT_EQ(pfIterationEnd(rt), pfSuccess);
    EXPECT_EQ(pfSimRunUntilIdle(s.world.get()), pfSuccess) << pfGetLastErrorMessage();
    EXPECT_EQ(pfSimEventTime(s.done, &end), pfSuccess);
    return end - start;
  };
  ManualStage base;
  ASSERT_NO_FATAL_FAILURE(base.init());
  void* base_busy = nullptr;
  PF_ASSERT_OK(pfSimStreamCreate(base.world.get(), 0, sim::kHighestPriority, &base_busy));
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  void* busy = nullptr;
  PF_ASSERT_OK(pfSimStreamCreate(stage.world.get(), 0, sim::kHighestPriority, &busy));
  pfRuntime_t rt = stage.runtime();
  ASSERT_NE(rt, nullptr);
  CountingJob job;
  job.item_cost_us = 10.0;
  job.items = 100000;
  pfJobDesc_t desc = job.desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));
  for (int i = 0; i < 3; ++i) stage.step(rt, 100.0);  // history: the class predicts 100 µs
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  pfStats_t before;
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &before));
  const uint64_t items_before = info_of(handle).items_completed;
  ASSERT_GT(items_before, 0u);

  const double filled_step = zero_bubble_behind_busy_sms(stage, rt, busy);
  EXPECT_DOUBLE_EQ(filled_step, zero_bubble_behind_busy_sms(base, nullptr, base_busy));
  EXPECT_DOUBLE_EQ(filled_step, 150.0);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  pfStats_t after;
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &after));
  EXPECT_EQ(after.slices_launched, before.slices_launched + 1) << "the bubble was planned";
  EXPECT_EQ(info_of(handle).items_completed, items_before);
  EXPECT_DOUBLE_EQ(after.overrun_time_us, before.overrun_time_us);
  EXPECT_DOUBLE_EQ(after.max_overrun_us, before.max_overrun_us);
  EXPECT_DOUBLE_EQ(after.filled_time_us, before.filled_time_us);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// Opaque work cannot be stopped, so it is sized from measured history only: a class is filled
// with opaque work once it has min_samples (and at least one) measured durations, in whole items
// whose total fits the prediction.
TEST(Overrun, OpaqueWorkIsAdmittedOnlyWhenItFits) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  CountingJob job;
  job.kind = pfJobOpaque;
  job.item_cost_us = 30.0;
  job.items = 100;
  pfJobDesc_t desc = job.desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.label = "short";  // 20 µs: shorter than one item, nothing may run
  for (int i = 0; i < 3; ++i) stage.step(rt, 20.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  EXPECT_EQ(info_of(handle).slices_launched, 0u);
  hint.label = "long";  // 100 µs: three rounds of 28 workers fit once measured twice
  for (int i = 0; i < 2; ++i) stage.step(rt, 100.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  EXPECT_EQ(info_of(handle).slices_launched, 0u) << "no history yet: no opaque work";
  const double step = stage.step(rt, 100.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  EXPECT_DOUBLE_EQ(step, 150.0) << "opaque work that fits never delays the main job";
  const pfJobInfo_t info = info_of(handle);
  EXPECT_EQ(info.slices_launched, 1u);
  EXPECT_EQ(info.items_completed, 84u);  // 28 fill SMs x 3 items of 30 µs
  EXPECT_EQ(job.items_run(), 84u);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// One expected_duration_us hint far above the real bubble, and no history: gated (ticket) work
// may use it - the gate stops it at the bubble end - but ungated opaque work must not, or it holds
// the SMs long after the bubble and delays the main job.
TEST(Overrun, HintAloneNeverAdmitsUngatedWork) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  CountingJob job;
  job.kind = pfJobOpaque;
  job.item_cost_us = 10.0;
  job.items = 1u << 20;
  pfJobDesc_t desc = job.desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &desc, &handle));
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 1e5;
  EXPECT_DOUBLE_EQ(stage.step(rt, 100.0, &hint), 150.0) << "the main job was delayed";
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  EXPECT_EQ(info_of(handle).slices_launched, 0u);
  EXPECT_EQ(job.items_run(), 0u);
  // The same hint with ticket work: filled, and the gate ends it with the bubble.
  CountingJob ticket;
  ticket.items = 1u << 20;
  pfJobDesc_t td = ticket.desc();
  pfJob_t th = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &td, &th));
  const double step = stage.step(rt, 100.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  // 28 workers x 10 items of 10 µs fill the bubble; an item claimed as the gate closes is the
  // one item of overrun the gate allows.
  EXPECT_GE(ticket.items_run(), 280u);
  EXPECT_LE(ticket.items_run(), 280u + 28u);
  EXPECT_LE(step, 150.0 + ticket.item_cost_us) << "at most one item of overrun";
  PF_ASSERT_OK(pfJobDestroy(th));
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

}  // namespace
}  // namespace pipefill::testing
