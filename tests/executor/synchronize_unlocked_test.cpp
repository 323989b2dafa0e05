// No lock held across a GPU wait (issue 33 item 3): pfRuntimeSynchronize on a side thread waits
// for the end events of ended bubbles, and while it waits the trainer's next bubble instruction
// must not wait with it. On the real-time host device the main stream is held by a latch the
// test opens, so the end event of the first bubble cannot complete until then: with the wait
// under the runtime's state lock, the second pfBubbleBegin (inline launch mode: it takes that
// lock) would hang until the latch opened. The watchdog deadline only turns that hang into a
// failure (it then opens the latch so the test ends); nothing asserts how long anything took.
// Runs under TSan (label executor).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "host/host_test_support.hpp"

namespace pipefill::host::testing {
namespace {

constexpr auto kWatchdog = std::chrono::seconds(30);

class SynchronizeUnlocked : public HostRuntimeTest {
 protected:
  void SetUp() override {
    config_.launch_mode = pfLaunchInline;  // pfBubbleBegin takes the executor's state lock itself
    HostRuntimeTest::SetUp();
  }
};

TEST_F(SynchronizeUnlocked, BubbleBeginReturnsWhileAnotherThreadWaitsForTheGpu) {
  Latch gpu;  // the main stream's work "on the GPU": done when the test opens the latch
  PF_ASSERT_OK(pfHostLaunchHostFunc(main_, &Latch::wait_fn, &gpu));
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.expected_duration_us = 1000.0;
  PF_ASSERT_OK(pfBubbleBegin(rt_, main_, &hint));
  PF_ASSERT_OK(pfBubbleEnd(rt_, main_));  // its end event completes only after the latch opens

  std::atomic<bool> synchronize_returned{false};
  std::thread side([&] {
    EXPECT_EQ(pfRuntimeSynchronize(rt_), pfSuccess) << pfGetLastErrorMessage();
    synchronize_returned.store(true);
  });
  // Give the side thread time to reach the event wait (if it has not, this test passes without
  // having tested anything; it cannot fail falsely).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(synchronize_returned.load()) << "pfRuntimeSynchronize returned before the GPU work";

  // The trainer's next bubble instruction, on its own thread (it must not hang the test).
  std::promise<std::string> begun;  // "" on success, else the call's error message
  std::future<std::string> begin_result = begun.get_future();
  std::thread trainer([&] {
    const pfResult_t result = pfBubbleBegin(rt_, main_, &hint);
    begun.set_value(result == pfSuccess ? "" : pfGetLastErrorMessage());
  });
  const bool returned = begin_result.wait_for(kWatchdog) == std::future_status::ready;
  gpu.open();  // lets everything finish, whatever happened
  trainer.join();
  side.join();
  EXPECT_TRUE(returned) << "pfBubbleBegin waited for another thread's pfRuntimeSynchronize (a lock "
                           "held across the GPU wait)";
  if (returned) EXPECT_EQ(begin_result.get(), "") << "pfBubbleBegin failed";
  EXPECT_TRUE(synchronize_returned.load());
  EXPECT_EQ(pfBubbleEnd(rt_, main_), pfSuccess) << pfGetLastErrorMessage();
  EXPECT_EQ(pfRuntimeSynchronize(rt_), pfSuccess) << pfGetLastErrorMessage();
}

}  // namespace
}  // namespace pipefill::host::testing
