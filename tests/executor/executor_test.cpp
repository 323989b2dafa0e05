// Concurrency of the runtime: bubble instructions from the user thread while the executor
// harvests, jobs created/cancelled/destroyed from other threads, and launch-callback failures
// that must end only their own job. Each test runs with the bubble messages handled in the
// simulator's pre-run hook (the default) and by the executor thread (the CUDA path). Runs under
// TSan (label "executor").
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/handles.hpp"
#include "core/config.hpp"
#include "core/runtime.hpp"
#include "runtime/fixtures.hpp"

namespace pipefill::testing {
namespace {

// A ticket job's cursor hands out items in order, so the items that ran are a prefix: every
// item before the first one that did not run ran exactly once, none after it ran at all.
::testing::AssertionResult ran_a_prefix_once(const CountingJob& job) {
  size_t i = 0;
  while (i < job.runs.size() && job.runs[i] == 1) ++i;
  const size_t prefix = i;
  for (; i < job.runs.size(); ++i) {
    if (job.runs[i] != 0) {
      return ::testing::AssertionFailure()
             << job.name << ": item " << i << " ran " << job.runs[i] << " time(s) after item "
             << prefix << " never ran (or ran more than once)";
    }
  }
  return ::testing::AssertionSuccess();
}

class Executor : public ::testing::TestWithParam<bool> {
 protected:
  // GetParam(): true = messages handled by the executor thread.
  pfRuntime_t make_runtime(ManualStage& stage, pfSchedulePolicy_t policy = pfPolicyFifo) {
    pfConfig_t c = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
    c.policy = policy;
    RuntimeOptions options;
    EXPECT_EQ(resolve_config(&c, &options), pfSuccess);
    options.sim_messages_in_hook = !GetParam();
    std::unique_ptr<core::Runtime> rt;
    EXPECT_EQ(core::Runtime::create(options, &rt), pfSuccess) << pfGetLastErrorMessage();
    return core::publish_runtime(std::move(rt));
  }
};

TEST_P(Executor, BubblesWhileTheExecutorHarvestsAndOthersRead) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = make_runtime(stage);
  CountingJob job;
  job.items = 1u << 20;
  pfJobDesc_t d = job.desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &d, &handle));

  std::atomic<bool> done{false};
  std::atomic<uint64_t> reads{0};
  std::thread reader([&] {
    while (!done.load()) {
      pfStats_t s;
      pfJobInfo_t info;
      pfResult_t async = pfSuccess;
      EXPECT_EQ(pfRuntimeGetStats(rt, &s), pfSuccess);
      EXPECT_EQ(pfJobGetStatus(handle, &info), pfSuccess);
      EXPECT_EQ(pfRuntimeGetAsyncError(rt, &async), pfSuccess);
      EXPECT_LE(s.bubbles_filled, s.bubbles);
      reads.fetch_add(1);
      std::this_thread::yield();
    }
  });
  constexpr int kBubbles = 60;
  for (int i = 0; i < kBubbles; ++i) EXPECT_DOUBLE_EQ(stage.step(rt, 100.0), 150.0);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  // On a loaded machine the reader may not have run yet: make sure it overlapped at least once.
  while (reads.load() == 0) std::this_thread::yield();
  done = true;
  reader.join();
  EXPECT_GT(reads.load(), 0u);

  pfStats_t s;
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &s));
  EXPECT_EQ(s.bubbles, static_cast<uint64_t>(kBubbles));
  EXPECT_EQ(s.bubbles_filled, static_cast<uint64_t>(kBubbles - 2));  // min_samples = 2
  EXPECT_EQ(s.iterations, static_cast<uint64_t>(kBubbles));
  EXPECT_DOUBLE_EQ(s.filled_time_us, 100.0 * (kBubbles - 2));
  EXPECT_EQ(s.items_completed, 280u * (kBubbles - 2));
  EXPECT_EQ(s.items_completed, job.items_run());
  EXPECT_GT(s.host_begin_end_ns, 0.0);
  EXPECT_TRUE(ran_a_prefix_once(job));
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST_P(Executor, JobsComeAndGoFromAnotherThread) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = make_runtime(stage, pfPolicyFairShare);
  CountingJob main_job;
  main_job.items = 1u << 20;
  pfJobDesc_t d = main_job.desc();
  pfJob_t main_handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &d, &main_handle));

  constexpr int kChurn = 12;
  std::vector<std::unique_ptr<CountingJob>> churn(kChurn);
  std::atomic<bool> stop{false};
  std::atomic<int> steps_done{0};
  std::thread other([&] {
    for (int i = 0; i < kChurn; ++i) {
      churn[i] = std::make_unique<CountingJob>();
      churn[i]->name = "churn" + std::to_string(i);
      churn[i]->items = 200;
      churn[i]->resident_bytes = 4096;
      pfJobDesc_t cd = churn[i]->desc();
      pfJob_t h = nullptr;
      EXPECT_EQ(pfJobCreate(rt, &cd, &h), pfSuccess) << pfGetLastErrorMessage();
      // Let the job live through two of the main thread's steps (bubbles) before it goes.
      const int created_at = steps_done.load();
      while (steps_done.load() < created_at + 2) std::this_thread::yield();
      if (i % 2 == 0) EXPECT_EQ(pfJobCancel(h), pfSuccess);
      EXPECT_EQ(pfJobDestroy(h), pfSuccess) << pfGetLastErrorMessage();
    }
    stop = true;
  });
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  int steps = 0;
  while (!stop.load() || steps < 10) {
    stage.step(rt, 100.0, &hint);
    ++steps;
    steps_done.store(steps);
  }
  other.join();
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  for (const auto& j : churn) {
    ASSERT_NE(j, nullptr);
    EXPECT_EQ(j->setups, 1) << j->name;
    EXPECT_EQ(j->teardowns, 1) << j->name;
    EXPECT_TRUE(ran_a_prefix_once(*j));
  }
  EXPECT_TRUE(ran_a_prefix_once(main_job));
  const pfJobInfo_t info = info_of(main_handle);
  EXPECT_EQ(info.items_completed, main_job.items_run());
  EXPECT_GT(info.items_completed, 0u);
  PF_ASSERT_OK(pfJobDestroy(main_handle));
  EXPECT_EQ(main_job.teardowns, 1);
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

pfResult_t throwing_launch(void*, const pfSliceDesc_t* slice, void*) {
  if (slice->max_items == 0) return pfSuccess;  // pfJobCreate's warm-up loads nothing here
  throw std::runtime_error("boom in launch");
}

TEST_P(Executor, LaunchFailureEndsOnlyThatJob) {
  ManualStage stage;
  ASSERT_NO_FATAL_FAILURE(stage.init());
  pfRuntime_t rt = make_runtime(stage);
  CountingJob failing, throwing, healthy;
  failing.name = "failing";
  failing.fail_launch_at = 0;
  throwing.name = "throwing";
  healthy.name = "healthy";
  healthy.items = 1000;
  pfJob_t f = nullptr, t = nullptr, h = nullptr;
  pfJobDesc_t fd = failing.desc();
  pfJobDesc_t td = throwing.desc();
  td.launch = &throwing_launch;
  pfJobDesc_t hd = healthy.desc();
  PF_ASSERT_OK(pfJobCreate(rt, &fd, &f));
  PF_ASSERT_OK(pfJobCreate(rt, &td, &t));
  PF_ASSERT_OK(pfJobCreate(rt, &hd, &h));

  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  // FIFO: the failing and the throwing job are tried first in the same bubble; the healthy
  // job still gets it.
  EXPECT_DOUBLE_EQ(stage.step(rt, 100.0, &hint), 150.0);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  pfJobInfo_t fi{}, ti{};
  EXPECT_EQ(pfJobGetStatus(f, &fi), pfSuccess);
  EXPECT_EQ(fi.status, pfJobFailed);
  EXPECT_EQ(fi.error, pfErrorJobFailed);
  EXPECT_EQ(pfJobWait(f, 0.0), pfErrorJobFailed);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("launch callback returned"),
            std::string::npos)
      << pfGetLastErrorMessage();
  EXPECT_EQ(pfJobGetStatus(t, &ti), pfSuccess);
  EXPECT_EQ(ti.status, pfJobFailed);
  EXPECT_EQ(pfJobWait(t, 0.0), pfErrorJobFailed);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("boom in launch"), std::string::npos)
      << pfGetLastErrorMessage();
  EXPECT_EQ(failing.teardowns, 1);
  EXPECT_EQ(throwing.teardowns, 1);
  EXPECT_EQ(info_of(h).items_completed, 280u);

  pfResult_t async = pfSuccess;
  PF_ASSERT_OK(pfRuntimeGetAsyncError(rt, &async));
  EXPECT_EQ(async, pfErrorJobFailed);
  for (int i = 0; i < 10 && info_of(h).status != pfJobCompleted; ++i) stage.step(rt, 100.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  EXPECT_EQ(info_of(h).status, pfJobCompleted);
  EXPECT_TRUE(healthy.every_item_once());
  pfStats_t s;
  PF_ASSERT_OK(pfRuntimeGetStats(rt, &s));
  EXPECT_EQ(s.jobs_failed, 2u);
  EXPECT_EQ(s.jobs_completed, 1u);
  for (pfJob_t j : {f, t, h}) PF_ASSERT_OK(pfJobDestroy(j));
  EXPECT_EQ(failing.teardowns, 1);
  EXPECT_EQ(healthy.teardowns, 1);
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

INSTANTIATE_TEST_SUITE_P(MessagePath, Executor, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "ExecutorThread" : "PreRunHook");
                         });

}  // namespace
}  // namespace pipefill::testing
