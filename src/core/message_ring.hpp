// The bounded ring that carries bubble messages from the user thread (pfBubbleBegin/End) to
// whoever handles them (message_pump.hpp). Fixed-size messages, no allocation on push, one short
// lock. Besides the ring itself it counts handled messages, so a caller can wait until every
// message pushed so far has been handled (pfRuntimeSynchronize, the simulator's pre-run hook).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "common/mutex.hpp"
#include "common/thread_annotations.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::core {

struct BubbleMessage {
  enum class Type : uint8_t { Begin, End };
  Type type = Type::Begin;
  bool tracked = false;  // events recorded for it (an event pair was free)
  bool abandoned = false;  // End: the stream died; no end event was recorded
  // Begin, inline launch mode: pfBubbleBegin found the state lock taken (the executor harvesting)
  // and left the bubble to the executor rather than wait for it (Executor::begin_bubble).
  bool deferred = false;
  // End: pfBubbleCloseFill closed the bubble's fill before its end (the planner sizes the
  // class's gated work to noticed_prediction_quantile: the early close bounds it).
  bool fill_closed_early = false;
  int kind = pfBubbleOther;
  uint64_t bubble_id = 0;
  uint64_t iteration = 0;
  uint64_t index_in_iteration = 0;
  double expected_us = 0.0;
  char label[64] = {0};
};

class MessageRing {
 public:
  explicit MessageRing(size_t capacity);

  // false when the ring is full (nothing pushed). Wakes a sleeping consumer.
  bool try_push(const BubbleMessage& message) EXCLUDES(mu_);
  // Moves every queued message to the end of *batch; returns how many.
  size_t pop_all(std::vector<BubbleMessage>* batch) EXCLUDES(mu_);
  // The consumer handled `count` popped messages: wakes wait_handled().
  void mark_handled(size_t count) EXCLUDES(mu_);
  // Returns once every message pushed before the call is handled, or the ring is stopped.
  void wait_handled() EXCLUDES(mu_);

  // Consumer side: sleeps up to `sleep` unless a message is queued or the ring is stopped.
  void wait_for_work(std::chrono::microseconds sleep) EXCLUDES(mu_);
  // Sleeps up to `sleep` unless the ring is stopped (a poller that does not take messages).
  void wait_for_stop(std::chrono::microseconds sleep) EXCLUDES(mu_);
  // Whether a message may be queued, without the lock (for spinning; may be stale).
  bool maybe_has_messages() const {
    return tail_published_.load(std::memory_order_acquire) !=
           head_published_.load(std::memory_order_acquire);
  }

  // Stops the ring: wait_for_work returns at once; every waiter of wait_handled returns.
  void stop() EXCLUDES(mu_);
  bool stopped() const EXCLUDES(mu_);
  // Everything pushed is handled (used at shutdown).
  void mark_all_handled() EXCLUDES(mu_);
  size_t capacity() const { return capacity_; }

 private:
  const size_t capacity_;
  mutable Mutex mu_;
  CondVar work_cv_;      // the consumer waits for messages / stop
  CondVar handled_cv_;   // wait_handled waits for progress
  std::vector<BubbleMessage> slots_ GUARDED_BY(mu_);
  uint64_t head_ GUARDED_BY(mu_) = 0;     // next to pop
  uint64_t tail_ GUARDED_BY(mu_) = 0;     // next to push
  uint64_t handled_ GUARDED_BY(mu_) = 0;  // messages fully handled
  bool stop_ GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> tail_published_{0};   // tail_ and head_, readable without the lock
  std::atomic<uint64_t> head_published_{0};
  std::atomic<bool> consumer_sleeping_{false};
};

}  // namespace pipefill::core
