#include "core/message_ring.hpp"

namespace pipefill::core {

MessageRing::MessageRing(size_t capacity) : capacity_(capacity) {
  MutexLock lock(mu_);
  slots_.resize(capacity);
}

bool MessageRing::try_push(const BubbleMessage& message) {
  {
    MutexLock lock(mu_);
    if (tail_ - head_ >= capacity_) return false;
    slots_[tail_ % capacity_] = message;
    ++tail_;
    tail_published_.store(tail_, std::memory_order_release);
  }
  // Only a sleeping consumer is woken, so the user thread's cost stays at a lock and two stores.
  if (consumer_sleeping_.load(std::memory_order_acquire)) work_cv_.notify_one();
  return true;
}

size_t MessageRing::pop_all(std::vector<BubbleMessage>* batch) {
  MutexLock lock(mu_);
  const size_t count = static_cast<size_t>(tail_ - head_);
  while (head_ != tail_) {
    batch->push_back(slots_[head_ % capacity_]);
    ++head_;
  }
  head_published_.store(head_, std::memory_order_release);
  return count;
}

void MessageRing::mark_handled(size_t count) {
  if (count == 0) return;
  {
    MutexLock lock(mu_);
    handled_ += count;
  }
  handled_cv_.notify_all();
}

void MessageRing::mark_all_handled() {
  {
    MutexLock lock(mu_);
    handled_ = tail_;
  }
  handled_cv_.notify_all();
}

void MessageRing::wait_handled() {
  MutexLock lock(mu_);
  const uint64_t target = tail_;
  handled_cv_.wait(mu_, [&] {
    mu_.assert_held();
    return handled_ >= target || stop_;
  });
}

void MessageRing::wait_for_work(std::chrono::microseconds sleep) {
  MutexLock lock(mu_);
  if (head_ != tail_ || stop_) return;
  consumer_sleeping_.store(true, std::memory_order_release);
  work_cv_.wait_for(mu_, sleep, [&] {
    mu_.assert_held();
    return head_ != tail_ || stop_;
  });
  consumer_sleeping_.store(false, std::memory_order_release);
}

void MessageRing::wait_for_stop(std::chrono::microseconds sleep) {
  MutexLock lock(mu_);
  work_cv_.wait_for(mu_, sleep, [&] {
    mu_.assert_held();
    return stop_;
  });
}

void MessageRing::stop() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  handled_cv_.notify_all();
}

bool MessageRing::stopped() const {
  MutexLock lock(mu_);
  return stop_;
}

}  // namespace pipefill::core
