#include "core/message_pump.hpp"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>


namespace pipefill::core {
namespace {

using Clock = std::chrono::steady_clock;

// How long the idle executor sleeps between completion polls while device work it must harvest
// is in flight, how long it sleeps when there is none (a message wakes it at once: this is only
// a safety net), and how long it keeps spinning after activity before it sleeps.
//
// Why not always poll: a runtime whose bubbles are all harvested woke every 200 us for nothing,
// 5,000 wake-ups a second, which cost the plain host runtime of streaming_bench 889 us of CPU per
// 9 ms trainer step (/proc/<tid>/schedstat) on a core the trainer shares.
// The poll interval doubles, up to kIdlePollMax, while a poll finds nothing new and no message
// comes: a bubble's End message arrives when the user enqueues it, often a whole bubble before
// the device reaches it, and 200 us polls across a 4 ms bubble were 20 wake-ups for one harvest.
// The cap bounds how late a harvest can come after the device work ended.
constexpr auto kIdlePoll = std::chrono::microseconds(200);
constexpr auto kIdlePollMax = std::chrono::microseconds(1000);
constexpr auto kIdleSleep = std::chrono::milliseconds(50);
constexpr auto kSpinAfterWork = std::chrono::microseconds(50);

class ExecutorThreadPump final : public MessagePump {
 public:
  ExecutorThreadPump(MessageRing& ring, MessageHandler& handler)
      : ring_(ring), handler_(handler) {}
  ~ExecutorThreadPump() override { stop(); }

  void start() override { thread_ = std::thread([this] { run(); }); }
  void drain() override { ring_.wait_handled(); }
  void make_room() override { std::this_thread::yield(); }  // the executor is catching up
  void stop() override {
    ring_.stop();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    std::vector<BubbleMessage> batch;
    batch.reserve(ring_.capacity());
    auto last_work = Clock::now();
    std::chrono::microseconds poll_every = kIdlePoll;
    for (;;) {
      batch.clear();
      if (ring_.pop_all(&batch) == 0) {
        if (ring_.stopped()) break;  // stopped and everything handled
        const auto spin_until = last_work + kSpinAfterWork;
        while (!ring_.maybe_has_messages() && Clock::now() < spin_until) {
          std::this_thread::yield();
        }
        const bool awaiting = handler_.awaits_completions();
        if (!awaiting) poll_every = kIdlePoll;
        if (!ring_.maybe_has_messages()) {
          ring_.wait_for_work(awaiting ? poll_every
                                       : std::chrono::microseconds(kIdleSleep));
        }
        if (ring_.pop_all(&batch) == 0) {
          if (awaiting) {
            handler_.poll_completions();
            poll_every = std::min(poll_every * 2, kIdlePollMax);
          }
          continue;
        }
        poll_every = kIdlePoll;
      }
      handler_.handle_messages(batch);
      ring_.mark_handled(batch.size());
      last_work = Clock::now();
    }
    ring_.mark_all_handled();
  }

  MessageRing& ring_;
  MessageHandler& handler_;
  std::thread thread_;
};

class PreRunHookPump final : public MessagePump {
 public:
  PreRunHookPump(MessageRing& ring, MessageHandler& handler) : ring_(ring), handler_(handler) {}
  ~PreRunHookPump() override { stop(); }

  void start() override { poller_ = std::thread([this] { poll(); }); }
  void drain() override EXCLUDES(drain_mu_) {
    // One drainer at a time keeps the batches in ring order (the hook, pfRuntimeSynchronize and
    // a user thread facing a full ring may all drain).
    MutexLock lock(drain_mu_);
    std::vector<BubbleMessage> batch;
    if (ring_.pop_all(&batch) == 0) return;
    handler_.handle_messages(batch);
    ring_.mark_handled(batch.size());
  }
  // On the simulator the messages wait for the world to run: handle the backlog here rather
  // than block forever (a program pushed more messages than the ring holds without running it).
  void make_room() override { drain(); }
  void stop() override {
    ring_.stop();
    if (poller_.joinable()) poller_.join();
    ring_.mark_all_handled();  // messages still queued are dropped: no job is attached any more
  }

 private:
  void poll() {
    while (!ring_.stopped()) {
      ring_.wait_for_stop(kIdlePoll);
      handler_.poll_completions();
    }
  }

  MessageRing& ring_;
  MessageHandler& handler_;
  Mutex drain_mu_;
  std::thread poller_;
};

}  // namespace

std::unique_ptr<MessagePump> make_executor_thread_pump(MessageRing& ring,
                                                       MessageHandler& handler) {
  return std::make_unique<ExecutorThreadPump>(ring, handler);
}

std::unique_ptr<MessagePump> make_pre_run_hook_pump(MessageRing& ring, MessageHandler& handler) {
  return std::make_unique<PreRunHookPump>(ring, handler);
}

}  // namespace pipefill::core
