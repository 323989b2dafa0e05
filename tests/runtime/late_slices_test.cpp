// A gated job whose every slice starts only after its bubble ended (issue 16 item 3): on a GPU
// with CUDA_DEVICE_MAX_CONNECTIONS=1, a slice enqueued behind the main stream's wait reaches the
// hardware only once the gate is closed, runs no item, and is classed late - which the
// no-progress check (it counts slices that ran in open bubbles) never saw, so the job took a
// slice of every bubble forever without progress. It must end FAILED naming the cause. The
// simulated stand-in: the test device delays every fill slice past its bubble's end.
#include <gtest/gtest.h>

#include <string>

#include "fixtures.hpp"
#include "test_device.hpp"

namespace pipefill::testing {
namespace {

struct LateStage {
  ManualStage stage;
  TestDevice* device = nullptr;
  pfRuntime_t rt = nullptr;

  void init(int launch_mode) {
    ASSERT_NO_FATAL_FAILURE(stage.init(32));
    pfConfig_t c = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
    c.launch_mode = launch_mode;
    rt = make_test_runtime(stage.world.get(), c, &device, /*hide_driven_clock=*/false,
                           /*executor_thread=*/false);
    ASSERT_NE(rt, nullptr);
  }
  // One 100 µs bubble and a 50 µs compute step, then the harvest.
  void step() {
    stage.step(rt, 100.0);
    EXPECT_EQ(pfRuntimeSynchronize(rt), pfSuccess) << pfGetLastErrorMessage();
  }
};

TEST(LateSlices, AJobWhoseEverySliceIsLateEndsFailedNamingTheCause) {
  for (const int mode : {pfLaunchExecutor, pfLaunchInline}) {
    SCOPED_TRACE(mode == pfLaunchExecutor ? "executor launch mode" : "inline launch mode");
    LateStage s;
    ASSERT_NO_FATAL_FAILURE(s.init(mode));
    CountingJob job;
    job.items = 100000;
    pfJobDesc_t d = job.desc();
    pfJob_t handle = nullptr;
    PF_ASSERT_OK(pfJobCreate(s.rt, &d, &handle));
    // Each slice starts 200 µs after its bubble began: 100 µs after the bubble ended.
    s.device->fill_wait_delay_us = 200.0;
    int steps = 0;
    for (; steps < 60 && info_of(handle).status != pfJobFailed; ++steps) s.step();
    const pfJobInfo_t info = info_of(handle);
    ASSERT_EQ(info.status, pfJobFailed) << "the job spun for " << steps << " bubbles";
    EXPECT_EQ(info.error, pfErrorJobFailed);
    EXPECT_EQ(info.items_completed, 0u);
    EXPECT_EQ(job.items_run(), 0u);
    EXPECT_GE(info.slices_launched, core::kMaxLateSlicesWithoutProgress);
    // It failed as soon as the run was long enough, not later.
    EXPECT_EQ(info.slices_launched, core::kMaxLateSlicesWithoutProgress);
    EXPECT_EQ(pfJobWait(handle, 0.0), pfErrorJobFailed);
    const std::string message = pfGetLastErrorMessage();
    EXPECT_NE(message.find("started after their bubble had ended"), std::string::npos) << message;
    EXPECT_NE(message.find("gate"), std::string::npos) << message;
    if (mode == pfLaunchExecutor)
      EXPECT_NE(message.find("CUDA_DEVICE_MAX_CONNECTIONS=1"), std::string::npos) << message;
    pfResult_t async = pfSuccess;
    PF_ASSERT_OK(pfRuntimeGetAsyncError(s.rt, &async));
    EXPECT_EQ(async, pfErrorJobFailed);
    // A failed job gets no further slice.
    const uint64_t launched = info.slices_launched;
    s.step();
    EXPECT_EQ(info_of(handle).slices_launched, launched);
    PF_ASSERT_OK(pfJobDestroy(handle));
    PF_ASSERT_OK(pfRuntimeDestroy(s.rt));
  }
}

// Late slices between slices that complete items are not a stall: the job keeps running.
TEST(LateSlices, LateSlicesBetweenProgressDoNotFailTheJob) {
  LateStage s;
  ASSERT_NO_FATAL_FAILURE(s.init(pfLaunchExecutor));
  CountingJob job;
  job.items = 1000000;
  pfJobDesc_t d = job.desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(s.rt, &d, &handle));
  uint64_t progressed = 0;
  for (int i = 0; i < 4 * static_cast<int>(core::kMaxLateSlicesWithoutProgress); ++i) {
    // Every fifth bubble on time, the others late: runs of 4 late slices.
    s.device->fill_wait_delay_us = i % 5 == 4 ? 0.0 : 200.0;
    const uint64_t before = info_of(handle).items_completed;
    s.step();
    if (info_of(handle).items_completed > before) ++progressed;
  }
  EXPECT_EQ(info_of(handle).status, pfJobRunning) << "runs of 4 late slices between progress";
  EXPECT_GT(progressed, 5u);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(s.rt));
}

}  // namespace
}  // namespace pipefill::testing
