// Two runtimes on one simulated device share its fill partition. A second runtime must reserve
// what the first did (or leave reserved_sms unset and get it); a second runtime that fails, or
// that is created and destroyed, changes neither the first runtime's fill nor the main timeline.
#include <gtest/gtest.h>

#include <string>

#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

// Steps of one 100 µs bubble with the first runtime's job: returns items completed per step.
uint64_t filled_step(ManualStage& stage, pfRuntime_t rt, pfJob_t job, double* step_us) {
  const uint64_t before = info_of(job).items_completed;
  *step_us = stage.step(rt, 100.0);
  EXPECT_EQ(pfRuntimeSynchronize(rt), pfSuccess) << pfGetLastErrorMessage();
  return info_of(job).items_completed - before;
}

struct First {
  ManualStage stage;
  pfRuntime_t rt = nullptr;
  CountingJob job;
  pfJob_t handle = nullptr;
  void init() {
    stage.init(32);
    rt = stage.runtime();  // reserves 4 SMs: 28 fill SMs
    job.items = 1u << 20;
    pfJobDesc_t d = job.desc();
    ASSERT_EQ(pfJobCreate(rt, &d, &handle), pfSuccess);
    double step = 0.0;
    for (int i = 0; i < 3; ++i) filled_step(stage, rt, handle, &step);  // history
    ASSERT_EQ(filled_step(stage, rt, handle, &step), 280u);  // 28 SMs x 10 items of 10 µs
    ASSERT_DOUBLE_EQ(step, 150.0);
  }
  void destroy() {
    EXPECT_EQ(pfJobDestroy(handle), pfSuccess);
    EXPECT_EQ(pfRuntimeDestroy(rt), pfSuccess);
  }
};

TEST(SharedDevice, FailingSecondRuntimeChangesNothing) {
  First first;
  ASSERT_NO_FATAL_FAILURE(first.init());
  double step = 0.0;
  for (const int reserved : {8, 4, 0}) {
    pfConfig_t c = sim_config(first.stage.world.get(), 0, 1, reserved);
    c.arena_bytes = size_t{1} << 50;  // can never fit
    pfRuntime_t second = nullptr;
    EXPECT_NE(pfRuntimeCreate(&c, &second), pfSuccess) << "reserved " << reserved;
    EXPECT_EQ(second, nullptr);
    // The first runtime keeps its 28 fill SMs and the main job its timeline.
    EXPECT_EQ(filled_step(first.stage, first.rt, first.handle, &step), 280u)
        << "after a failed create reserving " << reserved;
    EXPECT_DOUBLE_EQ(step, 150.0);
  }
  first.destroy();
}

TEST(SharedDevice, SecondRuntimeMustKeepThePartition) {
  First first;
  ASSERT_NO_FATAL_FAILURE(first.init());
  pfConfig_t c = sim_config(first.stage.world.get(), 0, 1, 8);
  pfRuntime_t second = nullptr;
  EXPECT_EQ(pfRuntimeCreate(&c, &second), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("reserved_sms = 8"), std::string::npos)
      << pfGetLastErrorMessage();
  EXPECT_EQ(second, nullptr);
  // Unset: the second runtime takes the partition in force.
  c.reserved_sms = PF_UNSET_INT;
  PF_ASSERT_OK(pfRuntimeCreate(&c, &second));
  pfConfig_t got = PF_CONFIG_INITIALIZER;
  PF_ASSERT_OK(pfRuntimeGetConfig(second, &got));
  EXPECT_EQ(got.reserved_sms, 4);
  double step = 0.0;
  EXPECT_EQ(filled_step(first.stage, first.rt, first.handle, &step), 280u);
  PF_ASSERT_OK(pfRuntimeDestroy(second));
  // Destroying the second runtime leaves the first one's partition.
  EXPECT_EQ(filled_step(first.stage, first.rt, first.handle, &step), 280u);
  EXPECT_DOUBLE_EQ(step, 150.0);
  first.destroy();
}

TEST(SharedDevice, BothRuntimesFillTheirOwnBubbles) {
  First first;
  ASSERT_NO_FATAL_FAILURE(first.init());
  pfConfig_t c = sim_config(first.stage.world.get(), 0, 1, 4);
  pfRuntime_t second = nullptr;
  PF_ASSERT_OK(pfRuntimeCreate(&c, &second));
  // The second runtime marks bubbles on its own stream with its own job.
  ManualStage& s = first.stage;
  void* main2 = nullptr;
  PF_ASSERT_OK(pfStreamCreateHighPriority(second, &main2));
  CountingJob job2;
  job2.name = "second";
  job2.items = 1u << 20;
  pfJobDesc_t d = job2.desc();
  pfJob_t handle2 = nullptr;
  PF_ASSERT_OK(pfJobCreate(second, &d, &handle2));
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  PF_ASSERT_OK(pfSimStreamDelay(main2, 1000.0));  // its bubble comes after the first's
  PF_ASSERT_OK(pfBubbleBegin(second, main2, &hint));
  PF_ASSERT_OK(pfSimStreamDelay(main2, 100.0));
  PF_ASSERT_OK(pfBubbleEnd(second, main2));
  double step = 0.0;
  EXPECT_EQ(filled_step(s, first.rt, first.handle, &step), 280u);
  PF_ASSERT_OK(pfSimRunUntilIdle(s.world.get()));
  PF_ASSERT_OK(pfRuntimeSynchronize(second));
  EXPECT_EQ(info_of(handle2).items_completed, 280u);
  EXPECT_EQ(job2.items_run(), 280u);
  PF_ASSERT_OK(pfJobDestroy(handle2));
  PF_ASSERT_OK(pfStreamDestroy(second, main2));
  PF_ASSERT_OK(pfRuntimeDestroy(second));
  first.destroy();
}

}  // namespace
}  // namespace pipefill::testing
