// The job callbacks: re-entering the library from setup/launch/teardown is refused with
// pfErrorInvalidState naming the callback (never a deadlock) - except a launch or teardown
// callback cancelling its own job (tests/runtime/no_hang_test.cpp); teardown runs on a documented
// thread outside bubbles and locks; a launch result that is not a pfResult_t, or a launch that
// enqueues nothing, ends only that job.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "test_device.hpp"

namespace pipefill::testing {
namespace {

struct Reentry {
  pfRuntime_t rt = nullptr;
  pfSimWorld_t world = nullptr;
  pfJob_t self = nullptr;
  pfJob_t other = nullptr;  // another job: cancelling it from a callback is refused
  std::vector<std::pair<std::string, pfResult_t>> results;
  std::vector<std::string> messages;
  CountingJob counting;
  bool done = false;

  void record(const char* what, pfResult_t r) {
    results.emplace_back(what, r);
    messages.emplace_back(pfGetLastErrorMessage());
  }
  void call_everything() {
    pfJobInfo_t info{};
    pfStats_t stats{};
    record("pfJobGetStatus", pfJobGetStatus(self, &info));
    record("pfJobCancel (another job)", pfJobCancel(other));
    record("pfJobWait", pfJobWait(self, 0.0));
    record("pfJobDestroy", pfJobDestroy(self));
    CountingJob other;
    pfJobDesc_t d = other.desc();
    pfJob_t created = nullptr;
    record("pfJobCreate", pfJobCreate(rt, &d, &created));
    record("pfRuntimeGetStats", pfRuntimeGetStats(rt, &stats));
    record("pfRuntimeSynchronize", pfRuntimeSynchronize(rt));
    record("pfIterationEnd", pfIterationEnd(rt));
    record("pfTraceWrite", pfTraceWrite(rt, "/dev/null"));
    record("pfSimRunUntilIdle", pfSimRunUntilIdle(world));
    record("pfSimRunUntil", pfSimRunUntil(world, 1e9));
  }
  void expect_all_refused(const char* callback) {
    ASSERT_FALSE(results.empty()) << "the " << callback << " callback never ran";
    for (size_t i = 0; i < results.size(); ++i) {
      EXPECT_EQ(results[i].second, pfErrorInvalidState)
          << results[i].first << " from " << callback << ": " << messages[i];
      EXPECT_NE(messages[i].find(callback), std::string::npos)
          << results[i].first << ": '" << messages[i] << "' does not name the callback";
    }
  }
};

using Callbacks = MessagePathStageTest;

TEST_P(Callbacks, LaunchCallingBackIsRefused) {
  Reentry r;
  r.rt = rt;
  r.world = stage.world.get();
  pfJobDesc_t d = r.counting.desc();
  d.user = &r;
  d.launch = [](void* user, const pfSliceDesc_t* slice, void* stream) {
    auto* self = static_cast<Reentry*>(user);
    if (!self->done && slice->max_items > 0) {  // the first bubble slice, not the warm-up
      self->done = true;
      self->call_everything();
    }
    return pfSimLaunchTicketKernel(stream, slice, slice->max_blocks, 10.0, &CountingJob::on_item,
                                   &self->counting);
  };
  PF_ASSERT_OK(pfJobCreate(rt, &d, &r.self));
  // Another job (on a runtime of its own, so that it takes no bubble time here).
  pfConfig_t other_config = sim_config(nullptr, 0, 1, 4);
  pfRuntime_t other_rt = nullptr;
  PF_ASSERT_OK(pfRuntimeCreate(&other_config, &other_rt));
  CountingJob other;
  other.name = "other";
  pfJobDesc_t od = other.desc();
  PF_ASSERT_OK(pfJobCreate(other_rt, &od, &r.other));
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  EXPECT_DOUBLE_EQ(stage.step(rt, 100.0, &hint), 150.0);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  r.expect_all_refused("launch");
  // The refused calls changed nothing: the job ran its slice and is still running.
  const pfJobInfo_t info = info_of(r.self);
  EXPECT_EQ(info.status, pfJobRunning);
  EXPECT_EQ(info.items_completed, 280u);
  EXPECT_EQ(info_of(r.other).status, pfJobPending) << "the refused cancel changed nothing";
  PF_ASSERT_OK(pfJobDestroy(r.self));
  PF_ASSERT_OK(pfJobDestroy(r.other));
  PF_ASSERT_OK(pfRuntimeDestroy(other_rt));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST_P(Callbacks, TeardownAndSetupCallingBackAreRefused) {
  Reentry setup_calls, teardown_calls;
  for (Reentry* r : {&setup_calls, &teardown_calls}) {
    r->rt = rt;
    r->world = stage.world.get();
  }
  struct Both {
    Reentry* setup;
    Reentry* teardown;
  } both{&setup_calls, &teardown_calls};
  CountingJob counting;
  counting.items = 100;
  pfJobDesc_t d = counting.desc();
  d.user = &both;
  d.setup = [](void* user, const pfArenaAllocator_t*, int) {
    static_cast<Both*>(user)->setup->call_everything();
    return pfSuccess;
  };
  d.launch = [](void*, const pfSliceDesc_t*, void*) { return pfSuccess; };
  d.teardown = [](void* user) { static_cast<Both*>(user)->teardown->call_everything(); };
  pfJob_t job = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &d, &job));
  setup_calls.expect_all_refused("setup");
  teardown_calls.self = job;
  PF_ASSERT_OK(pfJobCancel(job));
  PF_ASSERT_OK(pfJobDestroy(job));  // runs teardown at the latest
  teardown_calls.expect_all_refused("teardown");
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// Where teardown runs: on the thread of a call documented to be outside bubbles, with no lock
// held - never on the executor thread, never inside the simulator's run (where the world is
// executing bubbles), never between the user thread's pfBubbleBegin and pfBubbleEnd.
TEST_P(Callbacks, TeardownRunsOnTheCallerOutsideBubbles) {
  struct Where {
    CountingJob counting;
    std::atomic<bool> in_run{false};
    std::atomic<bool> in_bubble{false};
    std::atomic<int> teardowns{0};
    std::thread::id thread;
    bool teardown_in_run = false, teardown_in_bubble = false;
    pfRuntime_t rt = nullptr;
    pfResult_t stats_from_teardown = pfErrorInternal;
  } where;
  where.rt = rt;
  where.counting.items = 280;  // exactly one 100 µs bubble of 28 x 10 items
  pfJobDesc_t d = where.counting.desc();
  d.user = &where;
  d.setup = nullptr;
  d.launch = [](void* user, const pfSliceDesc_t* slice, void* stream) {
    auto* w = static_cast<Where*>(user);
    return pfSimLaunchTicketKernel(stream, slice, slice->max_blocks, 10.0, &CountingJob::on_item,
                                   &w->counting);
  };
  d.teardown = [](void* user) {
    auto* w = static_cast<Where*>(user);
    w->thread = std::this_thread::get_id();
    w->teardown_in_run = w->in_run.load();
    w->teardown_in_bubble = w->in_bubble.load();
    w->teardowns.fetch_add(1);
  };
  pfJob_t job = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &d, &job));
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  for (int i = 0; i < 4; ++i) {
    PF_ASSERT_OK(pfSimStreamDelay(stage.peer, 100.0));
    PF_ASSERT_OK(pfSimEventRecord(stage.ready, stage.peer));
    where.in_bubble = true;
    PF_ASSERT_OK(pfBubbleBegin(rt, stage.main, &hint));
    PF_ASSERT_OK(pfSimStreamWaitEvent(stage.main, stage.ready, 0.0, stage.comm_sms));
    // The begin handled (by the executor thread, or here in the hook mode) while the bubble is
    // open: a teardown run from the handler would see in_bubble.
    core_runtime->wait_for_executor();
    PF_ASSERT_OK(pfBubbleEnd(rt, stage.main));
    where.in_bubble = false;
    PF_ASSERT_OK(pfSimLaunchKernel(stage.main, 50.0, stage.sms));
    where.in_run = true;
    PF_ASSERT_OK(pfSimRunUntilIdle(stage.world.get()));
    // The job's completion harvested by the background thread (executor or poller) while
    // in_run is still set: a teardown run from the harvest would see it. The deadline only
    // turns a harvest that never comes into a failure.
    if (where.counting.items_run() == where.counting.items) {  // every item ran in the world
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (info_of(job).status != pfJobCompleted &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
      EXPECT_EQ(info_of(job).status, pfJobCompleted) << "iteration " << i << ": not harvested";
    }
    where.in_run = false;
    PF_ASSERT_OK(pfIterationEnd(rt));
  }
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  EXPECT_EQ(info_of(job).status, pfJobCompleted);
  EXPECT_EQ(where.teardowns.load(), 1);
  EXPECT_EQ(where.thread, std::this_thread::get_id());
  EXPECT_FALSE(where.teardown_in_run);
  EXPECT_FALSE(where.teardown_in_bubble);
  PF_ASSERT_OK(pfJobDestroy(job));
  EXPECT_EQ(where.teardowns.load(), 1);
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST_P(Callbacks, LaunchResultOutsideTheEnumIsJobFailed) {
  CountingJob counting;
  pfJobDesc_t d = counting.desc();
  d.launch = [](void*, const pfSliceDesc_t* slice, void*) {
    // Succeeds at pfJobCreate's warm-up (an empty slice), fails in the bubble.
    return slice->max_items == 0 ? pfSuccess : static_cast<pfResult_t>(999);
  };
  pfJob_t job = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &d, &job));
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  stage.step(rt, 100.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  const pfJobInfo_t info = info_of(job);
  EXPECT_EQ(info.status, pfJobFailed);
  EXPECT_EQ(info.error, pfErrorJobFailed);
  EXPECT_EQ(pfJobWait(job, 0.0), pfErrorJobFailed);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("999"), std::string::npos)
      << pfGetLastErrorMessage();
  EXPECT_EQ(counting.teardowns, 1);
  PF_ASSERT_OK(pfJobDestroy(job));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// A launch callback that returns success but enqueues nothing: its ticket slices never move the
// cursor. The job must end (failed) instead of staying Pending forever on bubble time.
TEST_P(Callbacks, LaunchThatEnqueuesNothingEndsItsJob) {
  CountingJob idle, healthy;
  idle.name = "idle";
  healthy.name = "healthy";
  healthy.items = 1u << 20;
  pfJobDesc_t d = idle.desc();
  d.launch = [](void* user, const pfSliceDesc_t* slice, void*) {
    if (slice->max_items > 0) ++static_cast<CountingJob*>(user)->launches;
    return pfSuccess;
  };
  pfJob_t idle_job = nullptr, healthy_job = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &d, &idle_job));
  pfJobDesc_t hd = healthy.desc();
  PF_ASSERT_OK(pfJobCreate(rt, &hd, &healthy_job));
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  for (int i = 0; i < 16; ++i) {
    stage.step(rt, 100.0, &hint);
    PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  }
  const pfJobInfo_t info = info_of(idle_job);
  EXPECT_EQ(info.status, pfJobFailed);
  EXPECT_EQ(info.error, pfErrorJobFailed);
  EXPECT_EQ(pfJobWait(idle_job, 0.0), pfErrorJobFailed);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("no item"), std::string::npos)
      << pfGetLastErrorMessage();
  EXPECT_LT(idle.launches, 16) << "it stopped getting bubble time";
  EXPECT_EQ(idle.teardowns, 1);
  // The other job took over the bubbles.
  EXPECT_GT(info_of(healthy_job).items_completed, 0u);
  EXPECT_EQ(info_of(healthy_job).status, pfJobRunning);
  PF_ASSERT_OK(pfJobDestroy(idle_job));
  PF_ASSERT_OK(pfJobDestroy(healthy_job));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST_P(Callbacks, GetStatusOfAFailedJobSucceedsWithoutAMessage) {
  CountingJob failing;
  failing.fail_launch_at = 0;
  pfJobDesc_t d = failing.desc();
  pfJob_t job = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &d, &job));
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  stage.step(rt, 100.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  pfJobInfo_t info{};
  EXPECT_EQ(pfJobGetStatus(job, &info), pfSuccess);
  EXPECT_EQ(info.status, pfJobFailed);
  EXPECT_STREQ(pfGetLastErrorMessage(), "") << "a successful call clears the message";
  // The failure's message comes with the failing wait.
  EXPECT_EQ(pfJobWait(job, 0.0), pfErrorJobFailed);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("launch callback returned"),
            std::string::npos);
  PF_ASSERT_OK(pfJobDestroy(job));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// Launch and setup callbacks launch kernels and allocate on the device: each runs inside the
// device's launch context (CUDA: its primary context pushed on the calling thread for the call
// only), the warm-up launches of pfJobCreate included, and every entered context is left.
TEST_P(Callbacks, EveryLaunchCallbackRunsInTheDevicesLaunchContext) {
  struct Probe {
    CountingJob counting;
    int outside = 0;
    int inside = 0;
    int setup_inside = 0;
  } probe;
  probe.counting.items = 400;
  pfJobDesc_t d = probe.counting.desc();
  d.user = &probe;
  d.setup = [](void* user, const pfArenaAllocator_t* allocator, int config) {
    auto* self = static_cast<Probe*>(user);
    self->setup_inside += TestDevice::launch_context_depth() == 1 ? 1 : 0;
    return CountingJob::setup(&self->counting, allocator, config);
  };
  d.teardown = nullptr;  // CountingJob's would take the probe for a CountingJob
  d.launch = [](void* user, const pfSliceDesc_t* slice, void* stream) {
    auto* self = static_cast<Probe*>(user);
    (TestDevice::launch_context_depth() == 1 ? self->inside : self->outside) += 1;
    return CountingJob::launch(&self->counting, slice, stream);
  };
  pfJob_t job = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &d, &job));
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  for (int i = 0; i < 4; ++i) stage.step(rt, 100.0, &hint);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  EXPECT_GT(probe.counting.launches, 0);
  EXPECT_GT(probe.counting.warm_ups, 0);
  EXPECT_EQ(probe.inside, probe.counting.launches + probe.counting.warm_ups);
  EXPECT_EQ(probe.outside, 0);
  EXPECT_EQ(probe.counting.setups, 1);
  EXPECT_EQ(probe.setup_inside, 1) << "setup runs in the launch context too";
  EXPECT_EQ(device->launch_contexts_entered.load(), probe.inside + probe.setup_inside);
  EXPECT_EQ(device->launch_contexts_left.load(), probe.inside + probe.setup_inside);
  EXPECT_EQ(TestDevice::launch_context_depth(), 0) << "left on this thread too";
  PF_ASSERT_OK(pfJobDestroy(job));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

INSTANTIATE_TEST_SUITE_P(MessagePath, Callbacks, ::testing::Values(false, true),
                         message_path_name);

}  // namespace
}  // namespace pipefill::testing
