// The contract of issue 34 on the real-time host backend: a fill item that throws fails its job
// (never Completed, the failed item never counted), and the thread rule of the bubble
// instructions (one open bubble per runtime; a begin from another thread while one is open is
// refused naming the stream that holds it, and never takes the bubble over). Label `host`: the
// thread test also runs under TSan.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/handles.hpp"
#include "core/runtime.hpp"
#include "host_test_support.hpp"

namespace pipefill::host::testing {
namespace {

// A ticket (or opaque) job whose item function throws for every third item (item % 3 == 2).
struct ThrowingJob {
  pfJobKind_t kind = pfJobTicket;
  uint64_t items = 200;
  std::atomic<uint64_t> returned{0};  // item functions that returned normally
  std::atomic<uint64_t> threw{0};

  static pfResult_t launch(void* user, const pfSliceDesc_t* slice, void* stream) {
    auto* self = static_cast<ThrowingJob*>(user);
    if (slice->max_items == 0) return pfSuccess;  // pfJobCreate's warm-up
    return self->kind == pfJobTicket
               ? pfHostLaunchTicketKernel(stream, slice, slice->max_blocks, &item_fn, self)
               : pfHostLaunchOpaque(stream, slice->first_item_hint, slice->max_items,
                                    slice->max_blocks, &item_fn, self);
  }
  static void item_fn(void* user, uint64_t item) {
    auto* self = static_cast<ThrowingJob*>(user);
    if (item % 3 == 2) {
      self->threw.fetch_add(1);
      throw std::runtime_error("bad input row " + std::to_string(item));
    }
    self->returned.fetch_add(1);
  }
  pfJobDesc_t desc() {
    pfJobDesc_t d = PF_JOB_DESC_INITIALIZER;
    d.name = "throwing";
    d.kind = kind;
    d.item_count = items;
    d.item_cost_hint_us = 5.0;
    d.user = this;
    d.launch = &launch;
    return d;
  }
};

class ItemFailure : public HostRuntimeTest, public ::testing::WithParamInterface<pfJobKind_t> {};

// Old behaviour: Completed, 200/200 items, pfJobWait pfSuccess, one warn line per item.
TEST_P(ItemFailure, AThrowingItemFailsTheJobWithItsMessageAndIsNotCounted) {
  if (GetParam() == pfJobOpaque) {
    // Opaque work waits for a measured history: one sample is enough here.
    pfConfig_t c = host_test_config();
    c.min_samples = 1;
    ASSERT_NO_FATAL_FAILURE(create_runtime(c));
  }
  ThrowingJob job;
  job.kind = GetParam();
  pfJobDesc_t d = job.desc();
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt_, &d, &handle));
  // Bubbles of 2 ms until the job ended (it fails at the first harvest of a throwing slice).
  int bubbles = 0;
  for (; bubbles < 200 && info(handle).status != pfJobFailed &&
         info(handle).status != pfJobCompleted;
       ++bubbles) {
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    hint.expected_duration_us = 2000.0;
    PF_ASSERT_OK(pfBubbleBegin(rt_, main_, &hint));
    PF_ASSERT_OK(pfHostStreamDelay(main_, 2000.0));
    ASSERT_NO_FATAL_FAILURE(end_bubble_and_iteration());
    PF_ASSERT_OK(pfRuntimeSynchronize(rt_));
  }
  const pfJobInfo_t i = info(handle);
  ASSERT_EQ(i.status, pfJobFailed) << "after " << bubbles << " bubbles, " << i.items_completed
                                   << " items completed";
  EXPECT_EQ(i.error, pfErrorJobFailed);
  ASSERT_GT(job.threw.load(), 0u);
  // Exactly the items whose function returned count as completed.
  EXPECT_EQ(i.items_completed, job.returned.load());
  EXPECT_LT(i.items_completed, job.items);
  EXPECT_EQ(pfJobWait(handle, -1.0), pfErrorJobFailed);
  const std::string message = pfGetLastErrorMessage();
  EXPECT_NE(message.find("job 'throwing'"), std::string::npos) << message;
  EXPECT_NE(message.find("threw: bad input row "), std::string::npos) << message;
  pfResult_t async = pfSuccess;
  PF_ASSERT_OK(pfRuntimeGetAsyncError(rt_, &async));
  EXPECT_EQ(async, pfErrorJobFailed);
  pfStats_t s{};
  PF_ASSERT_OK(pfRuntimeGetStatsV2(rt_, &s, sizeof s));
  EXPECT_EQ(s.jobs_failed, 1u);
  EXPECT_EQ(s.jobs_completed, 0u);
  EXPECT_EQ(s.items_completed, job.returned.load());
  // A failed job gets no further slice.
  const uint64_t slices = i.slices_launched;
  begin_open_ended_bubble();
  PF_ASSERT_OK(pfHostStreamDelay(main_, 500.0));
  ASSERT_NO_FATAL_FAILURE(end_bubble_and_iteration());
  PF_ASSERT_OK(pfRuntimeSynchronize(rt_));
  EXPECT_EQ(info(handle).slices_launched, slices);
  PF_ASSERT_OK(pfJobDestroy(handle));
}

INSTANTIATE_TEST_SUITE_P(Kinds, ItemFailure, ::testing::Values(pfJobTicket, pfJobOpaque),
                         [](const auto& info) {
                           return std::string(info.param == pfJobTicket ? "Ticket" : "Opaque");
                         });

// Threads: several threads, each with its own stream, bracket bubbles on one runtime. A begin
// while another thread's bubble is open is refused (pfErrorInvalidState naming the stream that
// holds it) and enqueues nothing; every begin that succeeded is ended by its own thread with
// pfSuccess. Old behaviour: both begins succeeded, the later took the open bubble over, and the
// first owner's pfBubbleEnd failed ("stream X is not the stream Y bubble N began on").
TEST_F(HostRuntimeTest, ConcurrentBeginsFromSeveralThreadsFollowOneOpenBubblePerRuntime) {
  constexpr int kThreads = 4;
  constexpr int kAttempts = 400;
  std::vector<void*> streams(kThreads);
  for (void*& stream : streams) PF_ASSERT_OK(pfStreamCreateHighPriority(rt_, &stream));
  std::atomic<int> open_now{0};
  std::atomic<int> max_open{0};
  std::atomic<uint64_t> pairs{0}, refused{0}, bad_refusals{0}, failed_ends{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      for (int a = 0; a < kAttempts; ++a) {
        const pfResult_t r = pfBubbleBegin(rt_, streams[t], nullptr);
        if (r != pfSuccess) {
          const std::string message = pfGetLastErrorMessage();
          if (r == pfErrorInvalidState && message.find("is still open on stream") != std::string::npos &&
              message.find("begun on another thread") != std::string::npos) {
            refused.fetch_add(1);
          } else {
            bad_refusals.fetch_add(1);
            ADD_FAILURE() << pfGetErrorString(r) << ": " << message;
          }
          continue;
        }
        const int now = open_now.fetch_add(1) + 1;
        int seen = max_open.load();
        while (now > seen && !max_open.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::yield();  // let the others try while this bubble is open
        open_now.fetch_sub(1);
        if (pfBubbleEnd(rt_, streams[t]) != pfSuccess) {
          failed_ends.fetch_add(1);
          ADD_FAILURE() << "end of a successful begin failed: " << pfGetLastErrorMessage();
        } else {
          pairs.fetch_add(1);
        }
      }
    });
  }
  go.store(true);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed_ends.load(), 0u);
  EXPECT_EQ(bad_refusals.load(), 0u);
  EXPECT_EQ(max_open.load(), 1) << "two bubbles were open at once";
  EXPECT_EQ(pairs.load() + refused.load(), uint64_t{kThreads} * kAttempts);
  PF_ASSERT_OK(pfRuntimeSynchronize(rt_));
  pfStats_t s{};
  PF_ASSERT_OK(pfRuntimeGetStatsV2(rt_, &s, sizeof s));
  EXPECT_EQ(s.bubbles, pairs.load()) << "every successful pair is one harvested bubble";
  // The refusal names the stream and says nested on the same thread.
  PF_ASSERT_OK(pfBubbleBegin(rt_, streams[0], nullptr));
  EXPECT_EQ(pfBubbleBegin(rt_, streams[1], nullptr), pfErrorInvalidState);
  const std::string message = pfGetLastErrorMessage();
  EXPECT_NE(message.find(fmt::format("still open on stream {}", streams[0])), std::string::npos)
      << message;
  EXPECT_NE(message.find("nested"), std::string::npos) << message;
  PF_ASSERT_OK(pfBubbleEnd(rt_, streams[0]));
  for (void* stream : streams) PF_ASSERT_OK(pfStreamDestroy(rt_, stream));
}

// pfStreamDestroy of the stream the open bubble began on is refused naming the stream; the
// bubble ends normally afterwards.
TEST_F(HostRuntimeTest, DestroyingTheOpenBubblesStreamIsRefused) {
  void* stream = nullptr;
  PF_ASSERT_OK(pfStreamCreateHighPriority(rt_, &stream));
  PF_ASSERT_OK(pfBubbleBegin(rt_, stream, nullptr));
  EXPECT_EQ(pfStreamDestroy(rt_, stream), pfErrorInvalidState);
  const std::string message = pfGetLastErrorMessage();
  EXPECT_NE(message.find(fmt::format("is open on stream {}", stream)), std::string::npos) << message;
  PF_ASSERT_OK(pfBubbleEnd(rt_, stream));
  PF_ASSERT_OK(pfStreamDestroy(rt_, stream));
}

// Inline launch mode: pfBubbleBegin does not wait for the state lock while the executor holds it
// (harvesting, re-planning): the bubble is left to the executor, which fills it as in executor
// mode once it has the lock. Old behaviour: pfBubbleBegin blocked until the lock was free (30-95
// us per pair on a loaded host). The test holds the lock as a long harvest would; the begin must
// return while it is still held - an order, not a time (the deadline only turns a hang into a
// failure).
TEST_F(HostRuntimeTest, InlineBeginDoesNotWaitForTheExecutorsLock) {
  pfConfig_t c = host_test_config();
  c.launch_mode = pfLaunchInline;
  ASSERT_NO_FATAL_FAILURE(create_runtime(c));
  ThrowingJob job;  // items 0 and 1 do not throw; a budget of 2 items per bubble keeps to them
  job.items = 2;
  pfJobDesc_t d = job.desc();
  d.item_cost_hint_us = 1000.0;
  pfJob_t handle = nullptr;
  PF_ASSERT_OK(pfJobCreate(rt_, &d, &handle));
  core::RuntimeRef ref;
  PF_ASSERT_OK(core::acquire_runtime(rt_, "test", &ref));
  core::RuntimeState& state = ref->state_for_tests();
  std::atomic<bool> began{false};
  std::atomic<pfResult_t> begin_result{pfErrorInternal};
  state.mu.lock();  // the executor, harvesting
  std::thread trainer([&] {
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    hint.expected_duration_us = 2000.0;
    begin_result.store(pfBubbleBegin(rt_, main_, &hint));
    began.store(true);
  });
  const bool returned_while_held = eventually([&] { return began.load(); });
  state.mu.unlock();
  trainer.join();
  ref.reset();
  ASSERT_TRUE(returned_while_held) << "pfBubbleBegin waited for the state lock";
  PF_ASSERT_OK(begin_result.load());
  EXPECT_EQ(state.inline_deferred.load(), 1u);
  // The executor filled the deferred bubble: its slice ran the job's items. The main stream
  // stays in the bubble until they ran (however late a loaded machine schedules the executor).
  Latch in_bubble;
  PF_ASSERT_OK(pfHostLaunchHostFunc(main_, &Latch::wait_fn, &in_bubble));
  const bool items_ran = eventually([&] { return job.returned.load() == 2; });
  in_bubble.open();
  ASSERT_NO_FATAL_FAILURE(end_bubble_and_iteration());
  EXPECT_TRUE(items_ran) << "the executor never filled the deferred bubble";
  PF_ASSERT_OK(pfRuntimeSynchronize(rt_));
  const pfJobInfo_t i = info(handle);
  EXPECT_EQ(i.slices_launched, 1u);
  EXPECT_EQ(i.items_completed, 2u);
  EXPECT_EQ(i.status, pfJobCompleted);
  pfStats_t s{};
  PF_ASSERT_OK(pfRuntimeGetStatsV2(rt_, &s, sizeof s));
  EXPECT_EQ(s.bubbles, 1u);
  EXPECT_EQ(s.bubbles_filled, 1u);
  PF_ASSERT_OK(pfJobDestroy(handle));
}

}  // namespace
}  // namespace pipefill::host::testing
