// The executor thread's pump (src/core/message_pump.cpp): an idle pump with nothing to harvest
// sleeps until a message comes instead of polling; while a harvest is awaited its polls back off
// from 200 us to 1 ms; a message is still handled at once. The bounds below are loose (a loaded
// machine only makes a sleeping thread poll less); the polling pump they replace made 5,000
// polls a second whatever the state. (The wake on a push is the ring's: MessageRing::try_push.)
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <span>
#include <thread>

#include "core/message_pump.hpp"
#include "core/message_ring.hpp"

namespace pipefill::core {
namespace {

using namespace std::chrono_literals;

class CountingHandler final : public MessageHandler {
 public:
  void handle_messages(std::span<const BubbleMessage> batch) override {
    handled += static_cast<int>(batch.size());
  }
  void poll_completions() override { ++polls; }
  bool awaits_completions() override { return awaiting.load(); }

  std::atomic<int> handled{0};
  std::atomic<int> polls{0};
  std::atomic<bool> awaiting{false};
};

TEST(ExecutorPump, AnIdlePumpWithNothingToHarvestDoesNotPoll) {
  MessageRing ring(64);
  CountingHandler handler;
  auto pump = make_executor_thread_pump(ring, handler);
  pump->start();
  std::this_thread::sleep_for(200ms);
  pump->stop();
  // Polling every 200 us would be ~1,000 here.
  EXPECT_LE(handler.polls.load(), 2);
}

TEST(ExecutorPump, AwaitedCompletionsArePolledWithABackoffCappedAtAMillisecond) {
  MessageRing ring(64);
  CountingHandler handler;
  handler.awaiting = true;
  auto pump = make_executor_thread_pump(ring, handler);
  pump->start();
  std::this_thread::sleep_for(200ms);
  pump->stop();
  const int polls = handler.polls.load();
  // 200, 400, 800 us, then 1 ms apart: about 197 in 200 ms (fewer on a loaded machine); a fixed
  // 200 us poll gives about 1,000, and a pump that never polls would leave the harvest waiting.
  EXPECT_GE(polls, 20);
  EXPECT_LE(polls, 260);
}

TEST(ExecutorPump, AMessageIsHandledWhileThePumpSleepsAndStartsNoPolls) {
  MessageRing ring(64);
  CountingHandler handler;
  auto pump = make_executor_thread_pump(ring, handler);
  pump->start();
  std::this_thread::sleep_for(100ms);  // into its sleep (nothing awaited)
  BubbleMessage message;
  ASSERT_TRUE(ring.try_push(message));
  pump->drain();  // returns once the message was handled
  EXPECT_EQ(handler.handled.load(), 1);
  std::this_thread::sleep_for(100ms);
  pump->stop();
  EXPECT_LE(handler.polls.load(), 2) << "a handled message with nothing to harvest starts no polling";
}

}  // namespace
}  // namespace pipefill::core
