// Handle lifetimes: a runtime or job handle used after its destroy, a handle of the wrong kind or
// a wild pointer is refused with pfErrorInvalidArgument (never a crash or a read of freed
// memory); pfJobWait racing pfJobDestroy is safe; an infinite wait waits.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "core/handles.hpp"
#include "core/runtime.hpp"
#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

using Lifetime = StageRuntimeTest;

TEST_F(Lifetime, JobHandleAfterDestroyIsInvalidArgument) {
  CountingJob job;
  pfJob_t handle = create_job(rt, job);
  ASSERT_NE(handle, nullptr);
  PF_ASSERT_OK(pfJobDestroy(handle));
  pfJobInfo_t info{};
  expect_error(pfJobGetStatus(handle, &info), pfErrorInvalidArgument, "not a live job");
  expect_error(pfJobCancel(handle), pfErrorInvalidArgument, "not a live job");
  expect_error(pfJobWait(handle, 0.0), pfErrorInvalidArgument, "not a live job");
  expect_error(pfJobDestroy(handle), pfErrorInvalidArgument, "not a live job");
  EXPECT_EQ(job.teardowns, 1);
  // A new job (its memory may well reuse the old one's) does not revive the old handle.
  CountingJob other;
  pfJobDesc_t od = other.desc();
  pfJob_t second = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &od, &second));
  expect_error(pfJobGetStatus(handle, &info), pfErrorInvalidArgument, "not a live job");
  PF_ASSERT_OK(pfJobGetStatus(second, &info));
  PF_ASSERT_OK(pfJobDestroy(second));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST_F(Lifetime, RuntimeHandleAfterDestroyIsInvalidArgument) {
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
  pfStats_t stats{};
  expect_error(pfRuntimeGetStats(rt, &stats), pfErrorInvalidArgument, "not a live runtime");
  expect_error(pfBubbleBegin(rt, stage.main, nullptr), pfErrorInvalidArgument,
               "not a live runtime");
  expect_error(pfBubbleEnd(rt, stage.main), pfErrorInvalidArgument, "not a live runtime");
  expect_error(pfIterationEnd(rt), pfErrorInvalidArgument, "not a live runtime");
  expect_error(pfRuntimeSynchronize(rt), pfErrorInvalidArgument, "not a live runtime");
  expect_error(pfRuntimeDestroy(rt), pfErrorInvalidArgument, "not a live runtime");
  CountingJob job;
  pfJobDesc_t d = job.desc();
  pfJob_t handle = nullptr;
  expect_error(pfJobCreate(rt, &d, &handle), pfErrorInvalidArgument, "not a live runtime");
  EXPECT_EQ(handle, nullptr);
}

TEST_F(Lifetime, WrongKindAndWildHandlesAreRefused) {
  CountingJob job;
  pfJob_t handle = create_job(rt, job);
  ASSERT_NE(handle, nullptr);
  pfJobInfo_t info{};
  pfStats_t stats{};
  // A runtime used as a job and the other way round.
  expect_error(pfJobGetStatus(reinterpret_cast<pfJob_t>(rt), &info), pfErrorInvalidArgument,
               "not a live job");
  expect_error(pfRuntimeGetStats(reinterpret_cast<pfRuntime_t>(handle), &stats),
               pfErrorInvalidArgument, "not a live runtime");
  // Pointers to memory that never was a handle.
  uint64_t junk[16] = {0};
  expect_error(pfRuntimeGetStats(reinterpret_cast<pfRuntime_t>(junk), &stats),
               pfErrorInvalidArgument, "not a live runtime");
  expect_error(pfJobCancel(reinterpret_cast<pfJob_t>(junk)), pfErrorInvalidArgument,
               "not a live job");
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST_F(Lifetime, JobWaitRacingJobDestroyIsSafe) {
  // Repeated so the destroy lands while the waiter is inside pfJobWait in most rounds.
  for (int round = 0; round < 20; ++round) {
    CountingJob job;
    pfJob_t handle = create_job(rt, job);
    ASSERT_NE(handle, nullptr);
    std::atomic<bool> started{false};
    pfResult_t waited = pfSuccess;
    std::thread waiter([&] {
      started = true;
      waited = pfJobWait(handle, -1.0);  // forever: only the destroy ends it
    });
    while (!started.load()) std::this_thread::yield();
    if (round % 2 == 1) {
      // Odd rounds: the destroy comes once the waiter is inside pfJobWait (a call in flight on
      // the runtime besides this probe's own); even rounds race it freely.
      while (true) {
        core::RuntimeRef probe;
        PF_ASSERT_OK(core::acquire_runtime(rt, "probe", &probe));
        if (probe->calls_in_flight().load() > 1) break;
        probe.reset();
        std::this_thread::yield();
      }
    }
    PF_ASSERT_OK(pfJobDestroy(handle));
    waiter.join();
    // Either it waited and saw the cancel, or it arrived after the destroy.
    EXPECT_TRUE(waited == pfErrorCancelled || waited == pfErrorInvalidArgument)
        << pfGetErrorString(waited);
    EXPECT_EQ(job.teardowns, 1);
    pfJobInfo_t info{};
    EXPECT_EQ(pfJobGetStatus(handle, &info), pfErrorInvalidArgument);
  }
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST_F(Lifetime, InfiniteAndHugeTimeoutsWaitForCompletion) {
  CountingJob job;
  job.items = 600;  // three 100 µs bubbles of 28 x 10 items (the first two build history)
  pfJob_t handle = create_job(rt, job);
  ASSERT_NE(handle, nullptr);
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  std::vector<pfResult_t> results(3, pfErrorInternal);
  const double timeouts[3] = {INFINITY, 1e300, 9.3e15};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&, i] { results[static_cast<size_t>(i)] = pfJobWait(handle, timeouts[i]); });
  }
  step_until_completed(stage, rt, handle, 100.0, &hint);
  for (std::thread& t : waiters) t.join();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(results[static_cast<size_t>(i)], pfSuccess) << "timeout " << timeouts[i];
  }
  EXPECT_TRUE(job.every_item_once());
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

}  // namespace
}  // namespace pipefill::testing
