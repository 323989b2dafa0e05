// A gated job whose every slice starts only after its bubble ended (issue 16 item 3): on a GPU
// with CUDA_DEVICE_MAX_CONNECTIONS=1, a slice enqueued behind the main stream's wait reaches the
// hardware only once the gate is closed, runs no item, and is classed late - which the
// no-progress check (it counts slices that ran in open bubbles) never saw, so the job took a
// slice of every bubble forever without progress. Since issue 34 it backs off instead of failing
// (the trainer's schedule is not the job's error). The simulated stand-in: the test device delays
// every fill slice past its bubble's end.
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

// Issue 34: a run of late slices is the trainer's schedule (too short or mis-hinted bubbles, one
// hardware queue), not the job's error. Old behaviour: the job ended FAILED after 16. Now it backs
// off: held out of such bubbles (one warning naming the cause), retried after 16 held bubbles, and
// it resumes as soon as a slice can run again.
TEST(LateSlices, AJobWhoseSlicesAreLateBacksOffAndResumes) {
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
    for (int i = 0; i < 40; ++i) s.step();
    pfJobInfo_t info = info_of(handle);
    EXPECT_NE(info.status, pfJobFailed) << "late slices are not the job's error";
    EXPECT_EQ(info.error, pfSuccess);
    EXPECT_EQ(info.items_completed, 0u);
    EXPECT_EQ(job.items_run(), 0u);
    // 16 late slices, then held out for 16 bubbles, then one late retry (the backoff doubles).
    EXPECT_EQ(info.slices_launched, core::kMaxLateSlicesWithoutProgress + 1);
    EXPECT_EQ(pfJobWait(handle, 0.0), pfErrorTimeout);
    pfResult_t async = pfSuccess;
    PF_ASSERT_OK(pfRuntimeGetAsyncError(s.rt, &async));
    EXPECT_EQ(async, pfSuccess);
    pfClassStats_t c{};
    c.size = sizeof c;
    PF_ASSERT_OK(pfRuntimeGetClassStats(s.rt, 0, &c));
    EXPECT_EQ(c.late_backoffs, 2u) << "the hold and the late retry";
    uint64_t counts[PF_SKIP_CAUSE_COUNT] = {};
    PF_ASSERT_OK(pfRuntimeGetSkipCounts(s.rt, counts, PF_SKIP_CAUSE_COUNT));
    EXPECT_GE(counts[pfSkipLate], 16u) << "the held bubbles are skipped as late";
    // The schedule recovers: at the next retry (after 32 held bubbles) the slice runs items and
    // the job resumes for good.
    s.device->fill_wait_delay_us = 0.0;
    int steps = 0;
    for (; steps < 40 && info_of(handle).items_completed == 0; ++steps) s.step();
    EXPECT_GT(info_of(handle).items_completed, 0u) << "never resumed";
    const uint64_t before = info_of(handle).items_completed;
    for (int i = 0; i < 3; ++i) s.step();
    EXPECT_GT(info_of(handle).items_completed, before) << "every bubble filled again";
    EXPECT_EQ(info_of(handle).status, pfJobRunning);
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
