// The inline launch mode (issue 8 item 7, PIPEFILL_LAUNCH / pfConfig_t::launch_mode): with one
// hardware queue for every stream, a slice enqueued after the main stream's wait would start
// only once the gate closed, so pfBubbleBegin enqueues the bubble's slices itself and
// pfBubbleEnd their read-backs (after the gate write).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "fixtures.hpp"
#include "test_device.hpp"

namespace pipefill::testing {
namespace {

pfBubbleHint_t hint_of(double us) {
  pfBubbleHint_t h = PF_BUBBLE_HINT_INITIALIZER;
  h.expected_duration_us = us;
  return h;
}

struct InlineStage {
  ManualStage stage;
  TestDevice* device = nullptr;
  pfRuntime_t rt = nullptr;

  void init(int launch_mode, bool single_queue) {
    ASSERT_NO_FATAL_FAILURE(stage.init(32));
    pfConfig_t c = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
    c.launch_mode = launch_mode;
    rt = make_test_runtime(stage.world.get(), c, &device, /*hide_driven_clock=*/false,
                           /*executor_thread=*/false, nullptr, single_queue);
    ASSERT_NE(rt, nullptr);
  }
  int resolved_mode() {
    pfConfig_t c = PF_CONFIG_INITIALIZER;
    EXPECT_EQ(pfRuntimeGetConfig(rt, &c), pfSuccess) << pfGetLastErrorMessage();
    return c.launch_mode;
  }
};

// What pfBubbleBegin and pfBubbleEnd leave on the fill streams before the world runs.
struct Enqueued {
  size_t fill_ops_after_begin = 0;
  int copies_after_begin = 0;
  int copies_after_end = 0;
};

Enqueued one_bubble_by_hand(InlineStage& s, double bubble_us) {
  Enqueued e;
  ManualStage& st = s.stage;
  const pfBubbleHint_t hint = hint_of(bubble_us);
  const size_t ops0 = s.device->operations_on_fill_streams();
  const int copies0 = s.device->copies.load();
  EXPECT_EQ(pfSimStreamDelay(st.peer, bubble_us), pfSuccess);
  EXPECT_EQ(pfSimEventRecord(st.ready, st.peer), pfSuccess);
  EXPECT_EQ(pfBubbleBegin(s.rt, st.main, &hint), pfSuccess) << pfGetLastErrorMessage();
  e.fill_ops_after_begin = s.device->operations_on_fill_streams() - ops0;
  e.copies_after_begin = s.device->copies.load() - copies0;
  EXPECT_EQ(pfSimStreamWaitEvent(st.main, st.ready, 0.0, st.comm_sms), pfSuccess);
  EXPECT_EQ(pfBubbleEnd(s.rt, st.main), pfSuccess) << pfGetLastErrorMessage();
  e.copies_after_end = s.device->copies.load() - copies0;
  EXPECT_EQ(pfSimLaunchKernel(st.main, st.compute_us, st.sms), pfSuccess);
  EXPECT_EQ(pfIterationEnd(s.rt), pfSuccess);
  EXPECT_EQ(pfSimRunUntilIdle(st.world.get()), pfSuccess) << pfGetLastErrorMessage();
  return e;
}

TEST(InlineLaunch, BubbleBeginEnqueuesTheSlicesAndBubbleEndTheirReadBacks) {
  InlineStage s;
  ASSERT_NO_FATAL_FAILURE(s.init(pfLaunchInline, /*single_queue=*/false));
  EXPECT_EQ(s.resolved_mode(), pfLaunchInline);
  CountingJob job;
  job.items = 3000;
  pfJobDesc_t d = job.desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(s.rt, &d, &handle));
  const Enqueued e = one_bubble_by_hand(s, 100.0);
  // The slice (budget zeroing, begin wait, start record) is on a fill stream when
  // pfBubbleBegin returns; its cursor read-back comes only with pfBubbleEnd.
  EXPECT_GE(e.fill_ops_after_begin, 3u);
  EXPECT_EQ(e.copies_after_begin, 0);
  EXPECT_EQ(e.copies_after_end, 1);
  PF_ASSERT_OK(pfRuntimeSynchronize(s.rt));
  // The slice ran the whole bubble: 28 fill SMs x floor(100 / 10) items.
  EXPECT_EQ(job.items_run(), 28u * 10u);
  EXPECT_EQ(info_of(handle).items_completed, job.items_run());

  // To the end, with measured history (prepared plans) after the first bubbles.
  for (int i = 0; i < 50 && info_of(handle).status != pfJobCompleted; ++i) {
    one_bubble_by_hand(s, 100.0);
    PF_ASSERT_OK(pfRuntimeSynchronize(s.rt));
  }
  EXPECT_EQ(info_of(handle).status, pfJobCompleted);
  EXPECT_TRUE(job.every_item_once());
  pfStats_t stats{};
  PF_ASSERT_OK(pfRuntimeGetStatsV2(s.rt, &stats, sizeof(stats)));
  EXPECT_EQ(stats.items_completed, job.items);
  EXPECT_DOUBLE_EQ(stats.max_overrun_us, 0.0);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(s.rt));
}

// The executor mode on the same device: nothing reaches a fill stream during pfBubbleBegin (the
// simulator's pump handles the message when the world runs).
TEST(InlineLaunch, ExecutorModeEnqueuesNothingInBubbleBegin) {
  InlineStage s;
  ASSERT_NO_FATAL_FAILURE(s.init(pfLaunchExecutor, /*single_queue=*/true));
  EXPECT_EQ(s.resolved_mode(), pfLaunchExecutor);
  CountingJob job;
  pfJobDesc_t d = job.desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(s.rt, &d, &handle));
  const Enqueued e = one_bubble_by_hand(s, 100.0);
  EXPECT_EQ(e.fill_ops_after_begin, 0u);
  EXPECT_EQ(e.copies_after_end, 0);
  PF_ASSERT_OK(pfRuntimeSynchronize(s.rt));
  EXPECT_EQ(job.items_run(), 28u * 10u);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(s.rt));
}

TEST(InlineLaunch, AutoGoesInlineOnlyOnASingleHardwareQueue) {
  {
    InlineStage s;
    ASSERT_NO_FATAL_FAILURE(s.init(pfLaunchAuto, /*single_queue=*/true));
    EXPECT_EQ(s.resolved_mode(), pfLaunchInline);
    PF_ASSERT_OK(pfRuntimeDestroy(s.rt));
  }
  {
    InlineStage s;
    ASSERT_NO_FATAL_FAILURE(s.init(pfLaunchAuto, /*single_queue=*/false));
    EXPECT_EQ(s.resolved_mode(), pfLaunchExecutor);
    PF_ASSERT_OK(pfRuntimeDestroy(s.rt));
  }
}

TEST(InlineLaunch, BadLaunchModeIsRefusedByName) {
  WorldPtr world = make_world(1, 32);
  pfConfig_t c = sim_config(world.get(), 0, 1, 4);
  c.launch_mode = 7;
  pfRuntime_t rt = nullptr;
  EXPECT_EQ(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("launch_mode = 7"), std::string::npos)
      << pfGetLastErrorMessage();
  c.launch_mode = PF_UNSET_INT;
  ASSERT_EQ(setenv("PIPEFILL_LAUNCH", "sideways", 1), 0);
  EXPECT_EQ(pfRuntimeCreate(&c, &rt), pfErrorInvalidArgument);
  const std::string message = pfGetLastErrorMessage();
  unsetenv("PIPEFILL_LAUNCH");
  EXPECT_NE(message.find("PIPEFILL_LAUNCH='sideways'"), std::string::npos) << message;
  EXPECT_EQ(rt, nullptr);
}

}  // namespace
}  // namespace pipefill::testing
