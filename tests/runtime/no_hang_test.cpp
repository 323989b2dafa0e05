// Calls that could wait for something that cannot happen refuse at once instead (issue 19):
// pfJobWait without a limit on the thread that drives a simulated world, and every blocking
// call on the thread that has a bubble open. A launch or teardown callback may cancel its own
// job; destroying it from there is refused with a message that says what to do.
//
// Each refusal is checked under a watchdog: should a call block after all, the watchdog
// cancels the job from another thread after a generous delay, which ends the wait with a result
// the test rejects - the test then fails instead of hanging. The delay is never what is
// measured; a correct call returns without waiting for it.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "test_device.hpp"

namespace pipefill::testing {
namespace {

// Cancels `job` from its own thread unless disarmed within 10 s.
class Watchdog {
 public:
  explicit Watchdog(pfJob_t job)
      : thread_([this, job] {
          std::unique_lock lock(mutex_);
          if (!disarmed_.wait_for(lock, std::chrono::seconds(10), [this] { return done_; })) {
            fired_ = true;
            pfJobCancel(job);
          }
        }) {}
  ~Watchdog() { disarm(); }
  // True when the watchdog had to end the wait (the call under test blocked).
  bool disarm() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    disarmed_.notify_all();
    if (thread_.joinable()) thread_.join();
    return fired_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable disarmed_;
  bool done_ = false;
  bool fired_ = false;
  std::thread thread_;
};

bool ended(pfJob_t job) {
  const int status = info_of(job).status;
  return status == pfJobCompleted || status == pfJobFailed || status == pfJobCancelled;
}

using NoHang = StageRuntimeTest;

// The thread that created (and later ran) the world waits without a limit for a job that only
// the world's runs can advance: refused at once, for every spelling of "no limit".
TEST_F(NoHang, UnlimitedJobWaitOnTheWorldsDrivingThreadIsRefused) {
  CountingJob job;
  pfJob_t handle = create_job(rt, job);
  ASSERT_NE(handle, nullptr);
  for (const bool after_a_run : {false, true}) {
    if (after_a_run) stage.step(rt, 100.0);  // this thread now ran the world too
    for (const double timeout : {-1.0, double{INFINITY}, 1e300}) {
      Watchdog watchdog(handle);
      const pfResult_t waited = pfJobWait(handle, timeout);
      const std::string message = pfGetLastErrorMessage();
      ASSERT_FALSE(watchdog.disarm()) << "pfJobWait(" << timeout << ") blocked";
      EXPECT_EQ(waited, pfErrorInvalidState) << timeout << ": " << message;
      EXPECT_NE(message.find("runs simulated world"), std::string::npos) << message;
      EXPECT_NE(message.find("'infer'"), std::string::npos) << message;
    }
  }
  // The refusals changed nothing: the job has not ended, and a limited wait still times out.
  EXPECT_FALSE(ended(handle));
  EXPECT_EQ(pfJobWait(handle, 1000.0), pfErrorTimeout);
  // An ended job's wait returns its end at once, whatever the limit.
  PF_ASSERT_OK(pfJobCancel(handle));
  EXPECT_EQ(pfJobWait(handle, -1.0), pfErrorCancelled);
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// Another thread may still wait without a limit while this one drives: its wait returns when
// the job completes.
TEST_F(NoHang, UnlimitedJobWaitOnAnotherThreadWaitsForTheDriver) {
  CountingJob job;
  job.items = 600;
  pfJob_t handle = create_job(rt, job);
  ASSERT_NE(handle, nullptr);
  pfResult_t waited = pfErrorInternal;
  std::thread waiter([&] { waited = pfJobWait(handle, -1.0); });
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  step_until_completed(stage, rt, handle, 100.0, &hint);
  waiter.join();
  EXPECT_EQ(waited, pfSuccess) << pfGetErrorString(waited);
  EXPECT_TRUE(job.every_item_once());
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// On the thread with a bubble open every blocking call refuses, naming the bubble; a poll
// (timeout 0) is not blocking and answers. After pfBubbleEnd the same calls work.
TEST_F(NoHang, BlockingCallsInsideABubbleAreRefused) {
  CountingJob job;
  pfJob_t handle = create_job(rt, job);
  ASSERT_NE(handle, nullptr);
  stage.step(rt, 100.0);
  PF_ASSERT_OK(pfSimStreamDelay(stage.peer, 100.0));
  PF_ASSERT_OK(pfSimEventRecord(stage.ready, stage.peer));
  PF_ASSERT_OK(pfBubbleBegin(rt, stage.main, nullptr));
  {
    Watchdog watchdog(handle);
    for (const double timeout : {-1.0, double{INFINITY}, 1e300, 1000.0}) {
      EXPECT_FAILS_WITH(pfJobWait(handle, timeout), pfErrorInvalidState, "bubble 2 open");
    }
    EXPECT_FAILS_WITH(pfRuntimeSynchronize(rt), pfErrorInvalidState, "bubble 2 open");
    EXPECT_FAILS_WITH(pfJobDestroy(handle), pfErrorInvalidState, "bubble 2 open");
    ASSERT_FALSE(watchdog.disarm()) << "a call inside the bubble blocked";
  }
  EXPECT_EQ(pfJobWait(handle, 0.0), pfErrorTimeout) << "a poll answers inside a bubble";
  EXPECT_FALSE(ended(handle)) << "the refused destroy changed nothing";
  PF_ASSERT_OK(pfSimStreamWaitEvent(stage.main, stage.ready, 0.0, stage.comm_sms));
  PF_ASSERT_OK(pfBubbleEnd(rt, stage.main));
  PF_ASSERT_OK(pfSimRunUntilIdle(stage.world.get()));
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  EXPECT_EQ(job.teardowns, 0);
  PF_ASSERT_OK(pfJobDestroy(handle));
  EXPECT_EQ(job.teardowns, 1);
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// Another thread is not inside the bubble: its limited wait is an ordinary wait.
TEST_F(NoHang, AnotherThreadMayWaitWhileABubbleIsOpen) {
  CountingJob job;
  pfJob_t handle = create_job(rt, job);
  ASSERT_NE(handle, nullptr);
  PF_ASSERT_OK(pfBubbleBegin(rt, stage.main, nullptr));
  pfResult_t waited = pfErrorInternal;
  std::thread other([&] { waited = pfJobWait(handle, 1000.0); });
  other.join();
  EXPECT_EQ(waited, pfErrorTimeout) << pfGetErrorString(waited);
  PF_ASSERT_OK(pfBubbleEnd(rt, stage.main));
  PF_ASSERT_OK(pfSimRunUntilIdle(stage.world.get()));
  PF_ASSERT_OK(pfJobDestroy(handle));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

// A bubble whose stream dies behind the runtime's back while its fill work is in flight: the
// end reports it naming the stream and abandons the bubble; the fill slice ends at its budget,
// the job and the runtime are destroyed cleanly, and the destroy leaves no error behind (the
// dead stream is not destroyed a second time).
TEST_F(NoHang, BubbleWhoseStreamDiesWithFillInFlightIsAbandoned) {
  CountingJob job;
  job.items = 1u << 20;
  pfJob_t handle = create_job(rt, job);
  ASSERT_NE(handle, nullptr);
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  stage.step(rt, 100.0, &hint);
  void* doomed = nullptr;
  PF_ASSERT_OK(pfStreamCreateHighPriority(rt, &doomed));
  PF_ASSERT_OK(pfBubbleBegin(rt, doomed, &hint));
  PF_ASSERT_OK(pfSimStreamDelay(doomed, 100.0));
  PF_ASSERT_OK(pfSimRunUntil(stage.world.get(), 0.0));  // the bubble's slice is launched now
  PF_ASSERT_OK(pfSimStreamDestroy(doomed));
  EXPECT_EQ(pfBubbleEnd(rt, doomed), pfErrorInvalidArgument);
  const std::string message = pfGetLastErrorMessage();
  EXPECT_NE(message.find(fmt::format("stream {}", doomed)), std::string::npos) << message;
  EXPECT_NE(message.find("abandoned"), std::string::npos) << message;
  PF_ASSERT_OK(pfSimRunUntilIdle(stage.world.get()));
  PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  const pfJobInfo_t info = info_of(handle);
  EXPECT_EQ(info.slices_launched, 2u) << "a slice in each bubble";
  for (uint64_t i = 0; i < info.items_completed; ++i) ASSERT_EQ(job.runs[i], 1u) << i;
  EXPECT_EQ(job.items_run(), info.items_completed);
  stage.step(rt, 100.0, &hint);  // not wedged: the next bubble on a live stream works
  PF_ASSERT_OK(pfJobDestroy(handle));
  EXPECT_EQ(job.teardowns, 1);
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
  EXPECT_STREQ(pfGetLastErrorMessage(), "") << "the destroy left an error behind";
}

struct SelfCancel {
  CountingJob counting;
  pfJob_t self = nullptr;
  int cancel_at_launch = 0;  // the bubble launch (0 = first) that cancels
  pfResult_t cancel_result = pfErrorInternal;
  pfResult_t destroy_result = pfErrorInternal;
  std::string destroy_message;
  pfResult_t other_cancel_result = pfErrorInternal;
  pfJob_t other = nullptr;
  int launches = 0;
  int teardowns = 0;
  pfResult_t teardown_cancel_result = pfErrorInternal;
  pfResult_t teardown_destroy_result = pfErrorInternal;
  std::string teardown_destroy_message;
};

pfResult_t self_cancelling_launch(void* user, const pfSliceDesc_t* slice, void* stream) {
  auto* s = static_cast<SelfCancel*>(user);
  if (slice->max_items > 0 && s->launches++ == s->cancel_at_launch) {
    // A fill job that hit its own error stops itself; it may not destroy itself here.
    s->cancel_result = pfJobCancel(s->self);
    s->destroy_result = pfJobDestroy(s->self);
    s->destroy_message = pfGetLastErrorMessage();
    if (s->other != nullptr) s->other_cancel_result = pfJobCancel(s->other);
  }
  return pfSimLaunchTicketKernel(stream, slice, slice->max_blocks, s->counting.item_cost_us,
                                 &CountingJob::on_item, &s->counting);
}

void self_cancelling_teardown(void* user) {
  auto* s = static_cast<SelfCancel*>(user);
  ++s->teardowns;
  s->teardown_cancel_result = pfJobCancel(s->self);
  s->teardown_destroy_result = pfJobDestroy(s->self);
  s->teardown_destroy_message = pfGetLastErrorMessage();
}

using SelfCancelPaths = MessagePathStageTest;

TEST_P(SelfCancelPaths, LaunchCallbackCancelsItsOwnJob) {
  SelfCancel s;
  s.counting.name = "quitter";
  s.counting.items = 1u << 20;
  s.cancel_at_launch = 1;  // the second bubble's slice
  pfJobDesc_t d = s.counting.desc();
  d.user = &s;
  d.launch = &self_cancelling_launch;
  d.teardown = &self_cancelling_teardown;
  PF_ASSERT_OK(pfJobCreate(rt, &d, &s.self));
  CountingJob bystander;  // after it: bubbles go to the first job while it runs (FIFO)
  bystander.name = "bystander";
  bystander.items = 1u << 20;
  pfJobDesc_t bd = bystander.desc();
  pfJob_t bystander_job = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt, &bd, &bystander_job));
  s.other = bystander_job;
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 100.0;
  for (int i = 0; i < 4; ++i) {
    stage.step(rt, 100.0, &hint);
    PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  }
  EXPECT_EQ(s.cancel_result, pfSuccess) << "a launch callback may cancel its own job";
  EXPECT_EQ(s.destroy_result, pfErrorInvalidState);
  EXPECT_NE(s.destroy_message.find("'quitter' cannot be destroyed from its own launch callback"),
            std::string::npos)
      << s.destroy_message;
  EXPECT_EQ(s.other_cancel_result, pfErrorInvalidState) << "only its own job";
  const pfJobInfo_t info = info_of(s.self);
  EXPECT_EQ(info.status, pfJobCancelled);
  EXPECT_EQ(s.launches, 2) << "no slice after the cancelling one";
  EXPECT_EQ(info.slices_launched, 2u);
  // The slice in flight at the cancel ran out: both slices' items were done, each once.
  EXPECT_GT(info.items_completed, 0u);
  for (uint64_t i = 0; i < info.items_completed; ++i) {
    EXPECT_EQ(s.counting.runs[i], 1u) << "item " << i;
  }
  EXPECT_EQ(pfJobWait(s.self, 0.0), pfErrorCancelled);
  EXPECT_EQ(info_of(bystander_job).status, pfJobRunning) << "the other job was not touched";
  // The teardown ran once, could cancel (a no-op on an ended job) and not destroy.
  EXPECT_EQ(s.teardowns, 1);
  EXPECT_EQ(s.teardown_cancel_result, pfSuccess);
  EXPECT_EQ(s.teardown_destroy_result, pfErrorInvalidState);
  EXPECT_NE(s.teardown_destroy_message.find("own teardown callback"), std::string::npos)
      << s.teardown_destroy_message;
  // And the job is destroyable afterwards.
  PF_ASSERT_OK(pfJobDestroy(s.self));
  EXPECT_EQ(s.teardowns, 1);
  PF_ASSERT_OK(pfJobDestroy(bystander_job));
  PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

INSTANTIATE_TEST_SUITE_P(MessagePath, SelfCancelPaths, ::testing::Values(false, true),
                         message_path_name);

}  // namespace
}  // namespace pipefill::testing