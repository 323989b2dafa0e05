// The fixed pools of a runtime run out gracefully: 512 bubble event pairs, the slice slots, the
// 4096-message ring and 256 job slots. Running out never fails a bubble instruction, never
// changes the main stream beyond what the documented fallback says, and never loses an item.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "test_device.hpp"

namespace pipefill::testing {
namespace {

// `bubbles` bubbles of 20 µs on the main stream, every one begun and ended before the world runs
// (the executor cannot harvest anything meanwhile), then one run.
void many_bubbles_without_running(ManualStage& stage, pfRuntime_t rt, int bubbles,
                                  const pfBubbleHint_t* hint) {
  for (int i = 0; i < bubbles; ++i) {
    ASSERT_EQ(pfSimStreamDelay(stage.peer, 20.0), pfSuccess);
    ASSERT_EQ(pfSimEventRecord(stage.ready, stage.peer), pfSuccess);
    ASSERT_EQ(pfBubbleBegin(rt, stage.main, hint), pfSuccess) << i << pfGetLastErrorMessage();
    ASSERT_EQ(pfSimStreamWaitEvent(stage.main, stage.ready, 0.0, stage.comm_sms), pfSuccess);
    ASSERT_EQ(pfBubbleEnd(rt, stage.main), pfSuccess) << i << pfGetLastErrorMessage();
    ASSERT_EQ(pfSimLaunchKernel(stage.main, 10.0, stage.sms), pfSuccess);
    ASSERT_EQ(pfIterationEnd(rt), pfSuccess);
  }
  ASSERT_EQ(pfSimRunUntilIdle(stage.world.get()), pfSuccess) << pfGetLastErrorMessage();
  ASSERT_EQ(pfRuntimeSynchronize(rt), pfSuccess) << pfGetLastErrorMessage();
}

class Pools : public ::testing::TestWithParam<bool> {};  // true: executor thread

// Bubble k uses event pair k % 512, free once bubble k - 512 is harvested. 600 bubbles before
// any harvest: the first 512 are timed and filled, the other 88 run untimed and unfilled (only
// their gate write reaches the main stream), and the next bubble is tracked again.
TEST_P(Pools, BubbleEventPairsRunOut) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  TestDevice* device = nullptr;
  pfRuntime_t rt = make_stage_test_runtime(stage, GetParam(), &device);
  ASSERT_NE(rt, nullptr);
  CountingJob job;
  job.items = 1u << 20;
  job.item_cost_us = 1.0;
  pfJob_t handle = create_job(rt, job);
  ASSERT_NE(handle, nullptr);
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 20.0;
  const size_t main_ops_before = device->operations_on(stage.main);
  ASSERT_NO_FATAL_FAILURE(many_bubbles_without_running(stage, rt, 600, &hint));
  pfStats_t s;
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &s));
  // Every harvested bubble counts (issue 34): the 88 untimed ones are bubbles, skipped as untimed.
  EXPECT_EQ(s.bubbles, 600u);
  EXPECT_EQ(s.bubbles_filled, 512u);
  EXPECT_EQ(s.bubbles_skipped, 88u);
  EXPECT_LE(s.bubbles_skipped, s.bubbles);
  EXPECT_EQ(s.slices_launched, 512u);
  // Tracked: begin record + gate write + end record; untracked: the gate write alone.
  EXPECT_EQ(device->operations_on(stage.main) - main_ops_before, 512u * 3 + 88u * 1);
  EXPECT_EQ(s.items_completed, job.items_run());
  for (uint32_t r : job.runs) ASSERT_LE(r, 1u);
  stage.step(rt, 20.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &s));
  EXPECT_EQ(s.bubbles, 601u) << "pairs are free again once harvested";
  EXPECT_EQ(s.bubbles_filled, 513u) << "pairs are free again once harvested";
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// 2100 bubbles = 4200 messages without running the world: more than the ring's 4096. No call
// blocks or fails; on the pre-run hook path the backlog is handled by the pushing thread.
TEST_P(Pools, MessageRingOverflows) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = make_stage_test_runtime(stage, GetParam());
  ASSERT_NE(rt, nullptr);
  CountingJob job;
  job.items = 1u << 20;
  job.item_cost_us = 1.0;
  pfJob_t handle = create_job(rt, job);
  ASSERT_NE(handle, nullptr);
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 20.0;
  ASSERT_NO_FATAL_FAILURE(many_bubbles_without_running(stage, rt, 2100, &hint));
  pfStats_t s;
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &s));
  EXPECT_EQ(s.bubbles, 2100u) << "every bubble was accounted";
  EXPECT_EQ(s.bubbles_skipped, 2100u - 512u) << "the untimed ones";
  EXPECT_EQ(s.iterations, 2100u);
  EXPECT_EQ(s.items_completed, job.items_run());
  for (uint32_t r : job.runs) ASSERT_LE(r, 1u);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// The slice slots (1024 by default; a tiny pool here). With every slot taken by slices not yet
// harvested, a bubble is skipped ("slice event pool exhausted"); once harvested, slots are
// reused, and no item is lost or run twice.
TEST_P(Pools, SliceSlotsRunOut) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfConfig_t c = sim_config(stage.world.get(), 0, 1, 4);
  c.sim_world = stage.world.get();
  RuntimeOptions options;
  ASSERT_EQ(resolve_config(&c, &options), pfSuccess);
  options.sim_messages_in_hook = !GetParam();
  options.slice_slots = 4;
  std::unique_ptr<core::Runtime> created;
  ASSERT_EQ(core::Runtime::create(options, &created), pfSuccess) << pfGetLastErrorMessage();
  pfRuntime_t rt = core::publish_runtime(std::move(created));
  CountingJob job;
  job.items = 1u << 20;
  job.item_cost_us = 1.0;
  pfJob_t handle = create_job(rt, job);
  ASSERT_NE(handle, nullptr);
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 20.0;
  ASSERT_NO_FATAL_FAILURE(many_bubbles_without_running(stage, rt, 6, &hint));
  pfStats_t s;
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &s));
  EXPECT_EQ(s.bubbles, 6u);
  EXPECT_EQ(s.bubbles_filled, 4u);
  EXPECT_EQ(s.bubbles_skipped, 2u);
  // Harvested: all four slots are free again.
  ASSERT_NO_FATAL_FAILURE(many_bubbles_without_running(stage, rt, 4, &hint));
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &s));
  EXPECT_EQ(s.bubbles_filled, 8u);
  EXPECT_EQ(s.items_completed, job.items_run());
  for (uint32_t r : job.runs) ASSERT_LE(r, 1u);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

INSTANTIATE_TEST_SUITE_P(MessagePath, Pools, ::testing::Values(false, true),
                         message_path_name);

// 256 job slots (each with its own cursor and budget word). The 257th job is refused with
// pfErrorBusy; a destroyed job's slot is reused with its cursor reset, so the new job starts at
// item 0 and runs every item exactly once.
TEST(Pools, JobSlotsRunOutAndAreReused) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = stage.runtime();
  std::vector<std::unique_ptr<CountingJob>> jobs;
  std::vector<pfJob_t> handles;
  for (int i = 0; i < 256; ++i) {
    auto job = std::make_unique<CountingJob>();
    job->name = "job" + std::to_string(i);
    job->items = 1000;
    pfJobDesc_t d = job->desc();
    pfJob_t h = nullptr;
    ASSERT_EQ(pfJobCreate(rt, &d, &h), pfSuccess) << i << ": " << pfGetLastErrorMessage();
    handles.push_back(h);
    jobs.push_back(std::move(job));
  }
  CountingJob extra;
  extra.name = "extra";
  extra.items = 500;
  pfJobDesc_t ed = extra.desc();
  pfJob_t extra_handle = nullptr;
  EXPECT_EQ(pfJobCreate(rt, &ed, &extra_handle), pfErrorBusy);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("256 jobs"), std::string::npos)
      << pfGetLastErrorMessage();
  EXPECT_EQ(extra_handle, nullptr);
  EXPECT_EQ(extra.setups, 0);
  // FIFO: job0 gets the bubble and moves its cursor to 280.
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  stage.step(rt, 100.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  EXPECT_EQ(info_of(handles[0]).items_completed, 280u);
  PF_ASSERT_OK(pfJobDestroy(handles[0]));
  handles.erase(handles.begin());
  for (pfJob_t h : handles) PF_ASSERT_OK(pfJobCancel(h));
  PF_ASSERT_OK(pfJobCreate(rt, &ed, &extra_handle));
  for (int i = 0; i < 5 && info_of(extra_handle).status != pfJobCompleted; ++i) {
    stage.step(rt, 100.0, &hint);
    PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  }
  EXPECT_EQ(info_of(extra_handle).status, pfJobCompleted);
  EXPECT_TRUE(extra.every_item_once()) << "the reused slot's cursor was reset";
  PF_ASSERT_OK(pfJobDestroy(extra_handle));
  for (pfJob_t h : handles) PF_ASSERT_OK(pfJobDestroy(h));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

}  // namespace
}  // namespace pipefill::testing
